"""Real processes for fault tests: a master and peers that can be SIGKILLed or SIGSTOPped."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pccl_aio._peer.core.config import PeerConfig
from pccl_aio._peer.session.dial import _probe
from pccl_aio._wire import auth

HERE = Path(__file__).parent


class Proc:
    """A child process whose stdout carries one JSON event per line."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        self.proc, self.name = proc, name
        self.events: list[dict[str, Any]] = []

    async def line(self, timeout: float = 30.0) -> str:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not raw:
            err = b""
            if self.proc.stderr is not None:
                err = await self.proc.stderr.read()
            raise AssertionError(f"{self.name} exited: {err.decode()[-3000:]}")
        return raw.decode().strip()

    async def expect(self, event: str, timeout: float = 30.0) -> dict[str, Any]:
        """Read events until ``event``; fails on another process error or a timeout."""
        while True:
            ev = json.loads(await self.line(timeout))
            self.events.append(ev)
            if ev["event"] == event:
                return ev
            if ev["event"] == "error":
                raise AssertionError(f"{self.name}: {ev}")

    def signal(self, sig: int) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)


async def spawn(name: str, *args: str, env: dict[str, str] | None = None,
                stdin: bool = False) -> Proc:
    """``python ARGS`` with its stdout piped (``stdin``: a pipe to write to as well)."""
    root = str(HERE.parent.parent)
    path = os.pathsep.join(x for x in (root, os.environ.get("PYTHONPATH", "")) if x)
    full = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path, **(env or {})}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=full,
        stdin=asyncio.subprocess.PIPE if stdin else None)
    return Proc(proc, name)


@pytest.fixture
async def procs() -> AsyncIterator[list[Proc]]:
    made: list[Proc] = []
    yield made
    for p in made:
        if p.proc.returncode is None:
            p.signal(signal.SIGCONT)
            p.signal(signal.SIGKILL)
        try:  # bounded: after a test timed out, a SIGKILLed child's exit was seen never
            await asyncio.wait_for(p.proc.wait(), 10)
        except TimeoutError:
            pass  # (it was sent SIGKILL: the OS reaps it; the teardown must end)


@pytest.fixture
async def master_proc(procs: list[Proc]) -> tuple[Proc, str]:
    m = await spawn("master", str(HERE / "masterproc.py"))
    procs.append(m)
    port = int(await m.line())
    return m, f"127.0.0.1:{port}"


async def start_peers(procs: list[Proc], addr: str, n: int, mode: str, *extra: str,
                      env: dict[str, str] | None = None) -> list[Proc]:
    """Start ``n`` peers one after the other (so index order is join order) and wait for the
    world."""
    peers: list[Proc] = []
    for i in range(n):
        p = await spawn(f"peer{i}", str(HERE / "worker.py"), addr, str(i), str(n), mode, *extra,
                        env=env)
        procs.append(p)
        await p.expect("joined")
        peers.append(p)
    for p in peers:
        await p.expect("world")
    return peers


MASTER = str(HERE / "masterproc.py")


async def start_master(procs: list[Proc], port: int = 0, name: str = "master",
                       env: dict[str, str] | None = None, heartbeat_timeout: float = 2.0
                       ) -> tuple[Proc, int]:
    """A ``masterproc.py`` master (heartbeat timeout 2 s unless given) on ``port`` (0: the
    OS's choice), and the port it listens on."""
    m = await spawn(name, MASTER, str(heartbeat_timeout), str(port), env=env)
    procs.append(m)
    return m, int(await m.line())


async def probe(port: int, secret: str | None = None) -> Any:
    """A master's ``ProbeAnswer`` (term, run id, members), as a peer would ask it."""
    cfg = PeerConfig(masters=(("127.0.0.1", port),), heartbeat_timeout=10.0,
                     key=auth.secret_key(secret))
    _, writer, _, answer = await _probe(cfg, "127.0.0.1", port)
    writer.close()
    return answer


async def events(p: Proc, until: set[str], timeout: float) -> list[dict[str, Any]]:
    """``p``'s JSON event lines up to one of ``until`` (included); none of them "wrong"."""
    seen: list[dict[str, Any]] = []
    while not seen or seen[-1]["event"] not in until:
        seen.append(json.loads(await p.line(timeout)))
        assert seen[-1]["event"] != "wrong", (p.name, seen[-1])
    return seen
