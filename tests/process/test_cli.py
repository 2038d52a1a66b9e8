"""``python -m pccl_aio.master``: logs where it listens, serves, shuts down on SIGINT/SIGTERM;
help for users with defaults, one line and exit status 2 for a port in use, ``--log-level``
and the other options checked by argparse (usage error, exit status 2), never a traceback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio._net.stream import read_frame
from pccl_aio._wire import messages as m
from pccl_aio._wire.framing import frame
from tests.helpers import admit, raw_master
from tests.process.procs import HERE

pytestmark = pytest.mark.timeout(60)
ENV = {**os.environ, "PYTHONPATH": str(HERE.parent.parent)}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the master's command line to its end (it must end by itself)."""
    return subprocess.run([sys.executable, "-m", "pccl_aio.master", *args], env=ENV,
                          capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_master_cli_serves_and_stops_cleanly(sig):
    env = {**os.environ, "PYTHONPATH": str(HERE.parent.parent)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pccl_aio.master", "--host", "127.0.0.1", "--port", "0",
        "--log-level", "INFO", stderr=asyncio.subprocess.PIPE, env=env)
    try:
        assert proc.stderr is not None
        line = (await asyncio.wait_for(proc.stderr.readline(), 20)).decode()
        port = int(re.search(r"listening on 127\.0\.0\.1:(\d+)", line).group(1))
        # master_timeout=0: the session ends with the master (else the peers would wait for
        # a restarted one: test_master_failover.py)
        kw = {"heartbeat_interval": 0.2, "master_timeout": 0}
        async with pccl.Communicator(f"127.0.0.1:{port}", **kw) as a, \
                pccl.Communicator(f"127.0.0.1:{port}", **kw) as b:
            await a.connect()
            await admit([a], b)
            xs = [np.ones(100, np.float32), np.ones(100, np.float32)]
            await asyncio.gather(a.all_reduce(xs[0]), b.all_reduce(xs[1]))
            assert (xs[0] == 2).all()
            proc.send_signal(sig)
            assert await asyncio.wait_for(proc.wait(), 10) == 0
            with pytest.raises(pccl.MasterConnectionError):
                await a.are_peers_pending()
        rest = (await proc.stderr.read()).decode()
        assert "shutting down" in rest
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_help_is_written_for_users_and_shows_defaults():
    done = cli("--help")
    assert done.returncode == 0 and done.stderr == ""
    out = done.stdout
    assert out.startswith("usage: python -m pccl_aio.master")
    assert "Peers join a run through it" in out and "Ctrl-C or SIGTERM" in out
    assert "sans-IO" not in out and "``" not in out  # not the module's docstring
    for default in ("(default: 0.0.0.0)", "(default: 48148)", "(default: 5.0)",
                    "(default: $PCCL_AIO_LOG_LEVEL, else INFO)", "(default: 127.0.0.1)"):
        assert default in " ".join(out.split()), default
    assert "--log-level {DEBUG,INFO,WARNING,ERROR}" in out and "--log-format {text,json}" in out
    assert "--status-port PORT" in out and "--metrics-port PORT" in out
    assert "(default: None)" not in out and "(default: False)" not in out


def test_port_in_use_is_one_line_and_exit_status_2():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli("--host", "127.0.0.1", "--port", str(port))
    assert done.returncode == 2
    assert done.stderr == (f"pccl_aio.master: cannot listen on 127.0.0.1:{port}: "
                           "address already in use\n")
    assert done.stdout == ""


def test_host_that_cannot_be_bound_is_one_line_and_exit_status_2():
    done = cli("--host", "192.0.2.1", "--port", "0")  # TEST-NET-1: never a local address
    assert done.returncode == 2
    assert done.stderr.startswith("pccl_aio.master: cannot listen on 192.0.2.1:0: ")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_an_http_port_in_use_is_one_line_and_exit_status_2():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli("--host", "127.0.0.1", "--port", "0", "--metrics-port", str(port))
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (f"pccl_aio.master: cannot listen on "
                                            f"127.0.0.1:{port}: address already in use")
    assert "Traceback" not in done.stderr


def test_log_settings_from_the_environment():
    quiet = subprocess.run([sys.executable, "-m", "pccl_aio.master", "--help"], check=False,
                           env={**ENV, "PCCL_AIO_LOG_LEVEL": "loud"}, capture_output=True)
    assert quiet.returncode == 0  # --help reads no logging settings
    done = subprocess.run([sys.executable, "-m", "pccl_aio.master", "--port", "0"], check=False,
                          env={**ENV, "PCCL_AIO_LOG_LEVEL": "loud"}, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 2 and "log level must be one of DEBUG, INFO" in done.stderr
    assert "Traceback" not in done.stderr


async def test_json_logs_from_the_environment_one_object_per_line():
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pccl_aio.master", "--host", "127.0.0.1", "--port", "0",
        stderr=asyncio.subprocess.PIPE, env={**ENV, "PCCL_AIO_LOG_FORMAT": "json"})
    try:
        assert proc.stderr is not None
        line = json.loads(await asyncio.wait_for(proc.stderr.readline(), 20))
        assert line["level"] == "INFO" and line["logger"] == "pccl_aio.master"
        assert re.search(r"listening on 127\.0\.0\.1:\d+", line["msg"])
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
        for raw in (await proc.stderr.read()).splitlines():
            json.loads(raw)  # every line, to the last
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize(("args", "words"), [
    (["--log-level", "verbose"], "argument --log-level: invalid choice: 'VERBOSE'"),
    (["--log-format", "xml"], "argument --log-format: invalid choice: 'xml'"),
    (["--status-port", "-1"], "argument --status-port: '-1' is not a port"),
    (["--metrics-port", "x"], "argument --metrics-port: 'x' is not a port"),
    (["--log-level", ""], "argument --log-level: invalid choice"),
    (["--port", "99999"], "argument --port: '99999' is not a port (0-65535)"),
    (["--port", "http"], "argument --port: 'http' is not a port"),
    (["--heartbeat-timeout", "0"], "argument --heartbeat-timeout: '0' is not a positive"),
    (["--heartbeat-timeout", "nan"], "argument --heartbeat-timeout: 'nan' is not a positive"),
    (["--heartbeat-interval", "0"], "argument --heartbeat-interval: '0' is not a positive"),
])
def test_bad_options_are_usage_errors(args, words):
    done = cli(*args)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: python -m pccl_aio.master")
    assert words in done.stderr and "Traceback" not in done.stderr


@contextlib.asynccontextmanager
async def _cli_master(*args: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, int]]:
    """``python -m pccl_aio.master`` on 127.0.0.1 with an OS-chosen port and ``args``: the
    process and the port its first log line names; at the end SIGTERM, and it exits 0."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pccl_aio.master", "--host", "127.0.0.1", "--port", "0", *args,
        stderr=asyncio.subprocess.PIPE, env=ENV)
    try:
        assert proc.stderr is not None
        line = (await asyncio.wait_for(proc.stderr.readline(), 20)).decode()
        yield proc, int(re.search(r"listening on 127\.0\.0\.1:(\d+)", line).group(1))
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_the_heartbeat_interval_option_sets_the_masters_beacon():
    """``--heartbeat-interval 0.2`` next to a 30 s timeout (whose default interval is 10 s): a
    client that said ``Hello`` hears a ``MasterHeartbeat`` within a second."""
    async with _cli_master("--heartbeat-timeout", "30", "--heartbeat-interval", "0.2") as (
            _, port):
        reader, writer = await raw_master(port)
        writer.write(frame(m.encode(m.Hello(m.PROTOCOL_VERSION, 0, 40000))))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        while not isinstance(m.decode_master_to_peer(
                await asyncio.wait_for(read_frame(reader), 5)), m.MasterHeartbeat):
            pass
        assert loop.time() - t0 < 1.0
        writer.close()


async def test_log_level_is_case_insensitive():
    async with _cli_master("--log-level", "debug") as (proc, port):
        assert proc.stderr is not None
        _, writer = await raw_master(port)
        line = (await asyncio.wait_for(proc.stderr.readline(), 20)).decode()
        assert " DEBUG pccl_aio.master: connection from 127.0.0.1:" in line
        writer.close()


@pytest.mark.parametrize(("args", "words"), [
    (["--run-id", ""], "run_id must be 1-128 printable characters"),
    (["--other-master", "nowhere"], "another master's address must be 'host:port'"),
])
def test_bad_failover_options_are_one_line_and_exit_status_2(args, words):
    done = cli("--host", "127.0.0.1", "--port", "0", *args)
    assert done.returncode == 2
    assert done.stderr == f"pccl_aio.master: {done.stderr.split(': ', 1)[1]}"
    assert words in done.stderr and done.stderr.count("\n") == 1


async def test_a_restarted_cli_master_rebuilds_the_run_under_its_run_id():
    """``--run-id`` and ``--recovery-grace``: SIGKILL the CLI master, start it again on the
    same port; the peers' next all-reduce runs on the rebuilt run, and a peer of another run
    is refused."""
    async def start(port: int) -> tuple[asyncio.subprocess.Process, int]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pccl_aio.master", "--host", "127.0.0.1", "--port",
            str(port), "--run-id", "run-7", "--recovery-grace", "1", "--log-level", "INFO",
            stderr=asyncio.subprocess.PIPE, env=ENV)
        assert proc.stderr is not None
        line = (await asyncio.wait_for(proc.stderr.readline(), 20)).decode()
        return proc, int(re.search(r"listening on 127\.0\.0\.1:(\d+)", line).group(1))

    first, port = await start(0)
    second = None
    try:
        kw = {"heartbeat_interval": 0.2, "heartbeat_timeout": 2.0}
        async with pccl.Communicator(f"127.0.0.1:{port}", **kw) as a, \
                pccl.Communicator(f"127.0.0.1:{port}", **kw) as b:
            await a.connect()
            await admit([a], b)
            first.kill()
            await first.wait()
            second, _ = await start(port)
            xs = [np.ones(100, np.float32), np.ones(100, np.float32)]
            await asyncio.wait_for(asyncio.gather(a.all_reduce(xs[0]), b.all_reduce(xs[1])), 30)
            assert (xs[0] == 2).all() and (xs[1] == 2).all()
            async with pccl.Communicator(f"127.0.0.1:{port}", run_id="run-8", **kw) as other:
                with pytest.raises(pccl.MasterConnectionError, match="run-7"):
                    await other.connect(attempts=1)
    finally:
        for proc in (first, second):
            if proc is not None and proc.returncode is None:
                proc.kill()
                await proc.wait()
