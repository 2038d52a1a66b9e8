"""Log lines that tell a run's story: one line per event, with its run, peer and group ids.

Library code logs through ``logging.getLogger("pccl_aio.*")`` and passes the ids as
``extra=ids(run, peer, group, **fields)``; the formatters here render them as ``key=value``
after the message (``TextFormatter``) or as one JSON object per line (``JsonFormatter``,
``--log-format json``). ``PCCL_AIO_LOG_LEVEL`` (and ``PCCL_AIO_LOG_FORMAT``) set the level
(and the format) of the ``pccl_aio`` loggers in any process (``from_env``); the master's
``--log-level`` and ``--log-format`` set them for the master (``configure``). Nothing here
blocks beyond the handler's write.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
from typing import Any

__all__ = ["FORMATS", "LEVELS", "JsonFormatter", "TextFormatter", "configure", "from_env", "ids"]

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("text", "json")
_KEY = "pccl"  # the LogRecord attribute that holds the fields (one name: no clashes)


def ids(run: str = "", peer: int = 0, group: int | None = None,
        **fields: Any) -> dict[str, dict[str, Any]]:
    """``extra=`` for a log call: the event's run, peer and group ids and its own fields
    (``cause=``, ``bytes=``...). Empty ids are left out."""
    out: dict[str, Any] = {}
    if run:
        out["run"] = run
    if peer:
        out["peer"] = peer
    if group is not None:
        out["group"] = group
    out.update(fields)
    return {_KEY: out}


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a log call passed with ``ids`` ({} for other records)."""
    value = getattr(record, _KEY, None)
    return value if isinstance(value, dict) else {}


class TextFormatter(logging.Formatter):
    """``2026-11-24 12:00:00,000 INFO pccl_aio.master: peer 3 joined [run=ab12 peer=3]``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = fields_of(record)
        if not fields:
            return text
        tail = " ".join(f"{k}={_text(v)}" for k, v in fields.items())
        head, sep, rest = text.partition("\n")  # a traceback stays below the line
        return f"{head} [{tail}]{sep}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (ISO 8601, UTC), ``level``, ``logger``, ``msg``, the
    event's fields, and ``exc`` when an exception is logged."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(),
            "level": record.levelname, "logger": record.name, "msg": record.getMessage()}
        for k, v in fields_of(record).items():
            out.setdefault(k, v)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    text = str(value)
    return json.dumps(text) if (" " in text or not text) else text


def formatter(fmt: str) -> logging.Formatter:
    """The formatter of ``fmt`` ("text" or "json")."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    return JsonFormatter() if fmt == "json" else TextFormatter()


def configure(level: str | None = None, fmt: str | None = None) -> None:
    """Set up logging for a command-line process: one stderr handler on the root logger.
    ``level`` and ``fmt`` default to ``$PCCL_AIO_LOG_LEVEL`` / ``$PCCL_AIO_LOG_FORMAT``,
    else INFO and text. Raises ValueError for an unknown level or format."""
    level = (level or os.environ.get("PCCL_AIO_LOG_LEVEL") or "INFO").upper()
    fmt = (fmt or os.environ.get("PCCL_AIO_LOG_FORMAT") or "text").lower()
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {level!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


def from_env() -> None:
    """Honour ``$PCCL_AIO_LOG_LEVEL`` in a process that uses the library: set the level of
    the ``pccl_aio`` loggers, and if no logging is set up at all, log them to stderr (in
    ``$PCCL_AIO_LOG_FORMAT``). Unset: nothing changes (the application decides). An unknown
    value is ignored with a warning, never an error."""
    level = os.environ.get("PCCL_AIO_LOG_LEVEL", "").upper()
    if not level:
        return
    lib = logging.getLogger("pccl_aio")
    if level not in LEVELS:
        lib.warning("ignoring PCCL_AIO_LOG_LEVEL=%r (one of %s)", level, ", ".join(LEVELS))
        return
    lib.setLevel(level)
    if lib.handlers or logging.getLogger().handlers:
        return
    try:
        fmt = formatter(os.environ.get("PCCL_AIO_LOG_FORMAT", "text").lower())
    except ValueError as exc:
        lib.warning("ignoring PCCL_AIO_LOG_FORMAT: %s", exc)
        fmt = TextFormatter()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(fmt)
    lib.addHandler(handler)
