"""``pccl_aio.secret.keep``: a secret made once in a file (mode 0600, written whole) and read
back from it ever after, also by processes racing to make it; and the master CLI's choice of
that file (``--master-secret-file``, the default for a run secret, ``--no-master-secret``)."""

from __future__ import annotations

import logging
import multiprocessing
import os
import stat

import pytest

import pccl_aio as pccl
from pccl_aio._errors import InvalidUsageError
from pccl_aio._master import cli
from pccl_aio._master.keys import kept_secret_name
from pccl_aio._wire import auth
from pccl_aio.secret import keep
from tests.helpers import OTHER_SECRET, SECRET

pytestmark = pytest.mark.timeout(60)


def test_keep_makes_a_secret_once_then_reads_it(tmp_path):
    path = tmp_path / "deep" / "er" / "master.secret"
    secret, made = keep(path)
    assert made and len(secret) == 43 and auth.secret_bits(secret) >= auth.MIN_SECRET_BITS
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text() == secret + "\n"
    assert keep(path) == (secret, False) and keep(str(path)) == (secret, False)
    assert os.listdir(path.parent) == ["master.secret"]  # no part left behind


def test_keep_reads_a_secret_made_elsewhere_and_refuses_an_empty_file(tmp_path):
    (tmp_path / "given").write_text(f"  {SECRET}\n")
    assert keep(tmp_path / "given") == (SECRET, False)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        keep(tmp_path / "empty")
    (tmp_path / "ro").mkdir(mode=0o500)
    if os.geteuid() != 0:  # root writes anyway
        with pytest.raises(PermissionError):
            keep(tmp_path / "ro" / "master.secret")


def _keep(path: str) -> str:
    return keep(path)[0]


def test_processes_racing_to_make_it_all_get_the_same_secret(tmp_path):
    path = str(tmp_path / "master.secret")
    with multiprocessing.get_context("fork").Pool(4) as pool:
        got = pool.map(_keep, [path] * 16)
    with open(path) as f:
        assert len(set(got)) == 1 and f.read() == got[0] + "\n"
    assert os.listdir(tmp_path) == ["master.secret"]


def test_each_run_secret_has_its_own_file_name():
    one, two = (kept_secret_name(auth.secret_key(s)) for s in (SECRET, OTHER_SECRET))
    assert one != two and one == kept_secret_name(auth.secret_key(SECRET))
    assert one.startswith("master-") and one.endswith(".secret") and len(one) == 30
    assert SECRET not in one


def test_the_cli_keeps_a_master_secret_by_default_with_a_run_secret(tmp_path, monkeypatch,
                                                                    caplog):
    monkeypatch.setenv(cli.STATE_DIR_ENV, str(tmp_path / "state"))
    parse = cli.parser().parse_args
    assert cli.master_secret(parse([]), None) is None  # no run secret: none by default
    kept = cli.master_secret(parse([]), SECRET.encode())
    path = tmp_path / "state" / kept_secret_name(auth.secret_key(SECRET))
    assert kept is not None and path.read_text() == kept + "\n"
    assert cli.master_secret(parse([]), SECRET.encode()) == kept  # found again
    assert cli.master_secret(parse(["--no-master-secret"]), SECRET.encode()) == ""  # none
    given = tmp_path / "given.secret"
    assert cli.master_secret(parse(["--master-secret-file", str(given)]), None) \
        == given.read_text().strip()  # made at the path given, even without a run secret
    with pytest.raises(InvalidUsageError, match="exclude each other"):
        cli.master_secret(parse(["--no-master-secret", "--master-secret-file", str(given)]),
                          None)
    (tmp_path / "weak").write_text("correcthorse77\n")
    with pytest.raises(InvalidUsageError, match="too weak"):
        cli.master_secret(parse(["--master-secret-file", str(tmp_path / "weak")]), None)
    with pytest.raises(InvalidUsageError, match=r"cannot keep the master secret in .*weak/sub"):
        cli.master_secret(parse(["--master-secret-file", str(tmp_path / "weak" / "sub")]),
                          None)  # a file given that cannot be made (its folder is a file)
    monkeypatch.setenv(cli.STATE_DIR_ENV, str(tmp_path / "weak" / "sub"))
    with caplog.at_level(logging.WARNING, "pccl_aio.master"):  # the default: a warning
        assert cli.master_secret(parse([]), OTHER_SECRET.encode()) == ""
    assert "cannot keep a master secret in" in caplog.text
    assert "memberships are not sealed" in caplog.text and "--master-secret-file" in caplog.text


def test_the_state_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(cli.STATE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert cli.state_dir() == str(tmp_path / "pccl_aio")
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cli.state_dir() == str(tmp_path / "home" / ".local" / "state" / "pccl_aio")
    monkeypatch.setenv(cli.STATE_DIR_ENV, "/somewhere")
    assert cli.state_dir() == "/somewhere"


def test_a_master_made_in_code_keeps_one_too_with_a_run_secret(tmp_path, monkeypatch):
    """``pccl_aio.Master(secret=...)`` without ``master_secret``: the same kept file as the
    command line's (a restarted master, in code or not, finds it); "" for none."""
    monkeypatch.setenv(cli.STATE_DIR_ENV, str(tmp_path / "state"))
    monkeypatch.delenv("PCCL_AIO_SECRET", raising=False)
    path = tmp_path / "state" / kept_secret_name(auth.secret_key(SECRET))
    pccl.Master("127.0.0.1", 0)  # no run secret: nothing kept
    pccl.Master("127.0.0.1", 0, secret=SECRET, master_secret="")  # none asked for
    assert not path.exists()
    pccl.Master("127.0.0.1", 0, secret=SECRET)
    made = path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert cli.master_secret(cli.parser().parse_args([]), SECRET.encode()) + "\n" == made
    pccl.Master("127.0.0.1", 0, secret=SECRET)  # a restarted master: the same one
    assert path.read_text() == made
