"""examples/quickstart.py, the README's PyTorch quick start: the README block is the example's
block word for word, its training loop (from ``with Communicator`` to the
loop's end) is at most 15 lines, and the example runs as real
processes through a SIGKILL and a joiner, every finisher with the same model digest."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
from pathlib import Path

import pytest

import pccl_aio as pccl
from tests.process.procs import Proc, spawn
from tests.process.readme_blocks import README, blocks

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "examples" / "quickstart.py"


def _region() -> str:
    text = QUICK.read_text()
    return text.split("# --- quick start ---\n", 1)[1].split("# --- end ---\n", 1)[0]


def test_the_readme_quick_start_is_the_tested_example():
    region = _region()
    assert [b for b in blocks(README.read_text()) if b.code == region], (
        "README.md must hold examples/quickstart.py's quick-start block word for word")
    loop = region[region.index("with Communicator"):region.index("    print(")].splitlines()
    assert len([line for line in loop if line.strip()]) <= 15, loop  # with, connect, the loop


class _Connections(logging.Handler):
    """The master's 'connection N from ...' log records, as an asyncio queue."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.queue: asyncio.Queue[str] = asyncio.Queue()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("connection "):
            self.queue.put_nowait(record.getMessage())


async def _done(p: Proc) -> tuple[int, str]:
    """(step, digest) of the peer's last line; fails if it exits otherwise."""
    while True:
        line = await p.line(timeout=90)
        m = re.fullmatch(r"peer \d+ done: step (\d+), digest ([0-9a-f]{16})", line)
        if m:
            assert await p.proc.wait() == 0
            return int(m.group(1)), m.group(2)


@pytest.mark.timeout(150)
async def test_quickstart_through_a_sigkill_and_a_joiner(procs: list[Proc]):
    """Two peers train; two more start, and once the first of them connected the second of
    the two is SIGKILLed: the three finishers end at the run's last step with one digest (a
    peer that had run on its own would hold other bytes: its samples differ)."""
    log = logging.getLogger("pccl_aio.master")
    conns, level = _Connections(), log.level
    log.addHandler(conns)
    log.setLevel(logging.DEBUG)
    try:
        async with pccl.Master("127.0.0.1", 0) as master:
            env = {"MASTER": master.address, "STEPS": "1000", "OMP_NUM_THREADS": "1"}

            async def start(*names: str) -> list[Proc]:
                ps = [await spawn(n, str(QUICK), env=env) for n in names]
                procs.extend(ps)
                return ps

            async def connected() -> None:
                await asyncio.wait_for(conns.queue.get(), 60)

            a, b = await start("a", "b")
            await connected()
            await connected()  # a and b train together (alone, a peer waits)
            c, d = await start("c", "d")  # started at once: both join while the run goes on
            await connected()
            b.signal(signal.SIGKILL)
            await connected()
            results = await asyncio.gather(*(_done(p) for p in (a, c, d)))
            assert await b.proc.wait() == -signal.SIGKILL
    finally:
        log.removeHandler(conns)
        log.setLevel(level)
    assert {s for s, _ in results} == {1000} and len({dg for _, dg in results}) == 1, results
