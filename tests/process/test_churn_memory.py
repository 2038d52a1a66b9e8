"""Issue 31, point 9: the survivors' memory stays flat over 100 kill/replace cycles. Two
survivor processes run a README-like loop; each cycle a new peer process joins, all-reduces
with them, and is SIGKILLed. The survivors' resident memory is read from /proc after 30
cycles and after 100: it must grow by less than ``BOUND`` (the hostile tester saw one
survivor grow ~87 KiB per cycle)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import pccl_aio as pccl
from tests.helpers import rss
from tests.process.procs import HERE

PEER = str(HERE / "churn_peer.py")
CYCLES, WARM = 100, 30
BOUND = 2 << 20  # bytes over the last 70 cycles: 30 KiB a cycle

pytestmark = pytest.mark.timeout(240)


@contextlib.asynccontextmanager
async def started(tmp: Path, name: str, *args: str
                  ) -> AsyncIterator[asyncio.subprocess.Process]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OPENBLAS_NUM_THREADS": "1",
           "PYTHONPATH": str(HERE.parent.parent)}
    with open(tmp / f"{name}.err", "wb") as err:
        p = await asyncio.create_subprocess_exec(
            sys.executable, PEER, *args, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=err, env=env)
    try:
        yield p
    finally:
        if p.returncode is None:
            p.kill()
        await p.wait()


async def _line(p: asyncio.subprocess.Process, prefix: str) -> str:
    assert p.stdout is not None
    while True:
        raw = await asyncio.wait_for(p.stdout.readline(), 30)
        assert raw, f"process exited: {p.returncode}"
        if raw.decode().startswith(prefix):
            return raw.decode().split()[1]


async def test_survivors_memory_is_flat_over_100_kill_and_replace_cycles(tmp_path):
    async with pccl.Master("127.0.0.1", 0, heartbeat_interval=0.2, heartbeat_timeout=2.0,
                           admission_interval=0.0) as master, \
            started(tmp_path, "a", "survivor", master.address) as a, \
            started(tmp_path, "b", "survivor", master.address) as b, \
            started(tmp_path, "zygote", "zygote", master.address) as zygote:
        await _line(a, "step")
        await _line(b, "step")
        assert zygote.stdin is not None
        kept: dict[int, tuple[int, int]] = {}
        for i in range(CYCLES):
            zygote.stdin.write(b"fork\n")
            pid = int(await _line(zygote, "forked"))
            assert int(await _line(zygote, "reduced")) == pid  # it joined and reduced
            os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                await asyncio.get_running_loop().run_in_executor(None, os.waitpid, pid, 0)
            if i + 1 in (WARM, CYCLES):
                kept[i + 1] = (rss(a.pid), rss(b.pid))
        grown = [after - before for before, after in zip(kept[WARM], kept[CYCLES])]
        print(f"survivors grew {grown} bytes over {CYCLES - WARM} cycles")
        assert all(g < BOUND for g in grown), grown
        await _line(a, "step")  # the survivors still reduce
        await _line(b, "step")
