"""examples/async_diloco.py and streaming_diloco.py as real processes on the tiny model:
three peers, one SIGKILLed mid-run (its exchange in flight or not) and a joiner admitted
after the pipeline drained. ``tests/process/example_runs.py`` checks the line protocol: the
digest of the global model agrees step by step and the run ends with one model everywhere."""

from __future__ import annotations

import pytest

from tests.process.example_runs import run_example


@pytest.mark.timeout(120)
async def test_async_diloco_survives_a_sigkill_and_a_joiner(procs, master_proc):
    _, addr = master_proc
    peers = await run_example(procs, addr, "async_diloco.py", "--tiny", "--inner-steps", "1000",
                              "--inner", "5", "--eval-every", "50", kill_after=3, join=True,
                              preload="charlm,diloco")
    joiner = peers[-1]
    assert len(joiner.steps) >= 3, joiner.steps
    last = max(peers[0].steps)
    assert last == 200 and peers[0].done is not None and peers[0].done["inner"] == "1000"


@pytest.mark.timeout(120)
async def test_streaming_diloco_survives_a_sigkill_and_a_joiner(procs, master_proc):
    """Three fragments, one sent every 4 inner steps and completed 5 steps later (two
    exchanges in flight at times), the pseudo-gradients quantized to uint8."""
    _, addr = master_proc
    peers = await run_example(procs, addr, "streaming_diloco.py", "--tiny", "--inner-steps",
                              "1000", "--inner", "12", "--fragments", "3", "--delay", "5",
                              "--quant", "uint8", "--eval-every", "50", kill_after=5,
                              join=True)
    joiner = peers[-1]
    assert len(joiner.steps) >= 3, joiner.steps
    # a send every 4 inner steps before the last, then the 3 fragments at the last
    assert peers[0].done is not None and peers[0].done["outer"] == str(1000 // 4 - 1 + 3)


@pytest.mark.timeout(120)
async def test_streaming_diloco_with_one_fragment_no_delay_no_mixing_is_diloco(procs, master_proc):
    """With F = 1, tau = 0 and alpha = 0 the schedule is DiLoCo's (the whole model every H
    steps, applied at once, the local copy reset to the global model): on two peers (the
    sum of two is the same whatever the ring order) both runs print the same digests."""
    _, addr = master_proc
    common = ("--tiny", "--inner-steps", "60", "--inner", "10", "--lr", "4e-3", "--eval-every", "3")
    ref = await run_example(procs, addr, "diloco.py", *common, peers=2)
    same = await run_example(procs, addr, "streaming_diloco.py", *common, "--fragments", "1",
                             "--delay", "0", "--alpha", "0", peers=2)
    assert ref[0].steps == same[0].steps and len(ref[0].steps) == 6, (ref[0].steps,
                                                                       same[0].steps)
    assert ref[0].done is not None and same[0].done is not None
    assert ref[0].done["val"] == same[0].done["val"]
