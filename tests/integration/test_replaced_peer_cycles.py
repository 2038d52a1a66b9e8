"""Issue 45, item 6: what a replaced peer leaves on the survivors is freed by reference
counting. An all-reduce aborted by a crashed peer, its verdict raised to the caller, and the
links to the crashed peer (the last one refused: nobody listens there any more) each held a
reference cycle (a link and its connections; a pipeline and its ended task; the verdict's
frames and the collective, with the input's backup and buffers; a failed connect's task, its
error and its task group), which kept them until a pass of the garbage collector: in a large
process, many replacements apart (``tests/stress/churn_memory.py`` measures it)."""

from __future__ import annotations

import asyncio
import collections
import gc

import numpy as np
import pytest

import pccl_aio as pccl
from tests.helpers import admit, crash, join_peers, reduce_ok

pytestmark = pytest.mark.timeout(60)


def _ours_in_cycles() -> collections.Counter[str]:
    """The library's objects that only reference cycles kept (then freed)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = collections.Counter(
            f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage
            if type(o).__module__.startswith("pccl_aio"))
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
    return found


async def test_a_crashed_and_replaced_peer_leaves_no_reference_cycle(master):
    comms = await join_peers(master, 3, p2p_connections=2)
    survivors = comms[:2]
    made = list(comms)
    try:
        await reduce_ok(comms)  # links open, pools filled
        gc.collect()
        gc.disable()
        for cycle in range(3):
            victim = comms[2]
            xs = [np.arange(1 << 18, dtype=np.float32) for _ in comms]
            hs = [c.all_reduce_async(x, tag=cycle + 1) for c, x in zip(comms, xs)]
            assert await hs[0].started()
            crash(victim)
            for h in hs[:2]:
                with pytest.raises(pccl.PeerLostError):
                    await h
            await reduce_ok(survivors)
            await victim.close()
            del hs, h
            comms = [*survivors, pccl.Communicator(master.address, heartbeat_interval=0.2,
                                                   heartbeat_timeout=2.0, p2p_connections=2)]
            made.append(comms[2])
            await admit(survivors, comms[2])
            await reduce_ok(comms)
        left = _ours_in_cycles()
    finally:
        gc.enable()
        await asyncio.gather(*(c.close() for c in made), return_exceptions=True)
    assert not left, left
