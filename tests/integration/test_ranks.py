"""Issue 32, point 1: ``comm.rank`` and ``comm.ranks`` follow the group's ring, agree on
every peer, and change with the membership."""

from __future__ import annotations

import asyncio

import pccl_aio as pccl
from pccl_aio._peer import testing
from tests.helpers import FAST, admit


async def test_ranks_follow_the_ring_and_change_with_membership(master, peers):
    lone = pccl.Communicator(master.address, **FAST)
    assert (lone.rank, lone.ranks) == (-1, [])  # before admission
    a, b, c = await peers(3)
    ring = [p.peer_id for p in testing.control_plane(a).membership.ring]
    assert a.ranks == b.ranks == c.ranks == ring
    assert sorted(x.rank for x in (a, b, c)) == [0, 1, 2]
    for x in (a, b, c):
        assert x.ranks[x.rank] == x.peer_id
    await admit([a, b, c], lone)  # a joiner: one more rank, the same on every peer
    try:
        assert len(lone.ranks) == 4 and lone.ranks == a.ranks
        assert lone.ranks[lone.rank] == lone.peer_id
        testing.crash(b)  # killed: the master's next membership drops it
        while b.peer_id in a.ranks or b.peer_id in c.ranks or b.peer_id in lone.ranks:
            await asyncio.sleep(0.01)  # polling the peers' view for the test
        assert a.ranks == c.ranks == lone.ranks and len(a.ranks) == 3
        assert sorted(x.rank for x in (a, c, lone)) == [0, 1, 2]
    finally:
        await lone.close()
