"""``pccl_aio._log``: one line per event with its ids, as text or JSON; the level and format
from ``PCCL_AIO_LOG_LEVEL`` / ``PCCL_AIO_LOG_FORMAT``; bad values are told, never a crash."""

from __future__ import annotations

import json
import logging

import pytest

from pccl_aio import _log

pytestmark = pytest.mark.timeout(30)


def record(msg: str = "peer %d left the run", *args: object, **fields: object) -> logging.LogRecord:
    rec = logging.LogRecord("pccl_aio.master", logging.INFO, __file__, 1, msg, args or (3,), None)
    for k, v in _log.ids(**fields).items():  # type: ignore[arg-type]
        setattr(rec, k, v)
    return rec


def test_text_puts_the_ids_and_fields_after_the_message():
    rec = record(run="ab12", peer=3, group=0, cause="heartbeat", ring=[1, 2], reason="a b")
    line = _log.TextFormatter().format(rec)
    assert line.endswith('INFO pccl_aio.master: peer 3 left the run '
                         '[run=ab12 peer=3 group=0 cause=heartbeat ring=1,2 reason="a b"]')


def test_text_without_fields_is_the_plain_line():
    line = _log.TextFormatter().format(record())
    assert line.endswith("INFO pccl_aio.master: peer 3 left the run")


def test_json_is_one_object_per_line_with_the_fields():
    rec = record(run="ab12", peer=3, group=1, bytes=10)
    obj = json.loads(_log.JsonFormatter().format(rec))
    assert obj["msg"] == "peer 3 left the run" and obj["level"] == "INFO"
    assert (obj["run"], obj["peer"], obj["group"], obj["bytes"]) == ("ab12", 3, 1, 10)
    assert obj["logger"] == "pccl_aio.master" and obj["ts"].endswith("+00:00")
    try:
        raise ValueError("boom\nline two")
    except ValueError:
        import sys

        rec.exc_info = sys.exc_info()
    line = _log.JsonFormatter().format(rec)
    assert "\n" not in line and "boom" in json.loads(line)["exc"]


def test_empty_ids_are_left_out():
    assert _log.ids() == {"pccl": {}}
    assert _log.ids("", 0, None, cause="x") == {"pccl": {"cause": "x"}}
    assert _log.ids("r", 1, 0) == {"pccl": {"run": "r", "peer": 1, "group": 0}}


@pytest.fixture
def clean_logging():
    root, lib = logging.getLogger(), logging.getLogger("pccl_aio")
    saved = (root.handlers[:], root.level, lib.handlers[:], lib.level)
    yield
    root.handlers[:], lib.handlers[:] = saved[0], saved[2]
    root.setLevel(saved[1])
    lib.setLevel(saved[3])


def test_configure_takes_the_environment_and_refuses_unknown_values(monkeypatch, clean_logging):
    monkeypatch.setenv("PCCL_AIO_LOG_LEVEL", "debug")
    monkeypatch.setenv("PCCL_AIO_LOG_FORMAT", "json")
    _log.configure()
    root = logging.getLogger()
    assert root.level == logging.DEBUG
    assert isinstance(root.handlers[0].formatter, _log.JsonFormatter)
    _log.configure("warning", "text")  # the options win over the environment
    assert root.level == logging.WARNING
    assert isinstance(root.handlers[0].formatter, _log.TextFormatter)
    assert len(root.handlers) == 1
    with pytest.raises(ValueError, match="log level"):
        _log.configure("loud")
    with pytest.raises(ValueError, match="log format"):
        _log.configure("INFO", "xml")


def test_from_env_sets_the_library_level_and_a_handler_only_if_none(monkeypatch, clean_logging):
    lib, root = logging.getLogger("pccl_aio"), logging.getLogger()
    root.handlers[:] = []
    lib.handlers[:] = []
    monkeypatch.delenv("PCCL_AIO_LOG_LEVEL", raising=False)
    _log.from_env()
    assert lib.handlers == [] and lib.level == logging.NOTSET  # unset: the application decides
    monkeypatch.setenv("PCCL_AIO_LOG_LEVEL", "INFO")
    _log.from_env()
    assert lib.level == logging.INFO and len(lib.handlers) == 1
    _log.from_env()
    assert len(lib.handlers) == 1  # once
    monkeypatch.setenv("PCCL_AIO_LOG_LEVEL", "chatty")
    _log.from_env()  # a warning, not an error
    assert lib.level == logging.INFO
