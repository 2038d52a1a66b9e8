"""The torch examples (examples/ddp.py, diloco.py, diloco_asyncio.py) as real processes on
the tiny model: three peers, one SIGKILLed mid-run and a joiner; the digests of the shared
model agree step by step and the run ends with one model on every peer
(``tests/process/example_runs.py`` checks the line protocol)."""

from __future__ import annotations

import pytest

from tests.process.example_runs import run_example


@pytest.mark.timeout(90)
async def test_ddp_survives_a_sigkill_and_a_joiner(procs, master_proc):
    _, addr = master_proc
    peers = await run_example(procs, addr, "ddp.py", "--tiny", "--inner-steps", "400",
                              "--eval-every", "50", kill_after=5, join=True)
    joiner = peers[-1]
    assert len(joiner.steps) >= 5, joiner.steps
