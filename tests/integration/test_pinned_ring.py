"""``ring=``: a collective pinned to a membership (what ``pccl_aio.torch``'s groups and
``SparseCompressor`` size their buffers by). Started in that ring it runs as ever; started in
another (a peer lost or admitted since, another order) it fails with ``PeerLostError`` on
every peer, not only on the one whose pin is stale, and the group goes on."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import pccl_aio as pccl
from tests.helpers import admit

pytestmark = pytest.mark.timeout(60)


async def _outcomes(handles: list[pccl.AllReduceHandle]) -> list[BaseException | None]:
    done = await asyncio.wait_for(asyncio.gather(*(h.wait() for h in handles),
                                                 return_exceptions=True), 15)
    return [r if isinstance(r, BaseException) else None for r in done]


async def test_a_collective_runs_only_in_the_ring_it_is_pinned_to(peers):
    comms = await peers(3)
    ring = comms[0].ranks
    xs = [np.full(1000, i + 1, np.float32) for i in range(3)]
    hs = [c.all_reduce_async(x, tag=1, ring=ring) for c, x in zip(comms, xs)]
    assert await _outcomes(hs) == [None] * 3 and all((x == 6).all() for x in xs)
    # one peer's pin is another order of the same peers: every peer fails, none computes
    stale = [ring, ring, list(reversed(ring))]
    hs = [c.all_reduce_async(np.ones(1000, np.float32), tag=2, ring=r)
          for c, r in zip(comms, stale)]
    assert all(isinstance(e, pccl.PeerLostError) for e in await _outcomes(hs))
    outs = [np.empty(3 * 10, np.float32) for _ in comms]
    hs = [c.all_gather_async(np.full(10, i, np.float32), o, tag=3, ring=r)
          for i, (c, o, r) in enumerate(zip(comms, outs, stale))]
    assert all(isinstance(e, pccl.PeerLostError) for e in await _outcomes(hs))
    # the group goes on: pinned to the ring as it is
    hs = [c.broadcast_async(np.full(10, i, np.float32), root=0, tag=4, ring=c.ranks)
          for i, c in enumerate(comms)]
    assert await _outcomes(hs) == [None] * 3


async def test_a_collective_pinned_before_a_join_fails_on_every_peer(master, peers):
    comms = await peers(2)
    before = comms[0].ranks
    joiner = pccl.Communicator(master.address, heartbeat_interval=0.2, heartbeat_timeout=2.0)
    try:
        await admit(comms, joiner)
        everyone = [*comms, joiner]
        pins = [before, before, joiner.ranks]  # the joiner knows only the new ring
        hs = [c.all_reduce_async(np.ones(100, np.float32), tag=1, ring=r)
              for c, r in zip(everyone, pins)]
        assert all(isinstance(e, pccl.PeerLostError) for e in await _outcomes(hs))
        hs = [c.all_reduce_async(np.ones(100, np.float32), tag=2, ring=c.ranks)
              for c in everyone]
        assert await _outcomes(hs) == [None] * 3
    finally:
        await joiner.close()


@pytest.mark.parametrize("ring", ["1,2", [], [1, 1], [0, 2], [True, 2], 7])
async def test_a_malformed_ring_is_refused_before_anything_is_sent(peers, ring):
    comms = await peers(2)
    with pytest.raises(pccl.InvalidUsageError, match="ring must"):
        comms[0].all_reduce_async(np.ones(10, np.float32), tag=1, ring=ring)
    with pytest.raises(pccl.InvalidUsageError, match="ring must"):
        comms[0].barrier_async(tag=1, ring=ring)
    await asyncio.gather(*(c.all_reduce(np.ones(10, np.float32), tag=2) for c in comms))
