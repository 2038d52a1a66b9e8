"""Issue 32 (begun): ``barrier()``, a collective that moves no data, with the guarantees of
an all-reduce: it returns on every peer once all called it, or raises on every peer; its
kind is part of the descriptor, so a barrier beside another collective of the same tag is
rejected on both, naming each; the master's deadlock detection and kicks cover it."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio import blocking
from pccl_aio._peer import testing
from tests.helpers import blocking_pair

pytestmark = pytest.mark.timeout(60)


async def test_a_barrier_returns_on_every_peer_once_all_called_it(peers):
    a, b, c = await peers(3)
    assert a.rank >= 0
    early = [asyncio.ensure_future(x.barrier(tag=7)) for x in (a, b)]
    # (started(): the master started it only once c voted too)
    handle = a.barrier_async(tag=8)
    done, _ = await asyncio.wait(early, timeout=0.3)
    assert not done  # c has not arrived: nobody passes
    await asyncio.gather(c.barrier(tag=7), *early)
    await asyncio.gather(handle, b.barrier(tag=8), c.barrier(tag=8))
    await asyncio.gather(*(x.barrier() for x in (a, b, c)))  # again, the default tag


async def test_a_barrier_beside_an_all_reduce_of_its_tag_is_rejected_on_both(peers):
    a, b = await peers(2)
    x = np.ones(16, np.float32)
    res = await asyncio.gather(a.barrier(tag=3), b.all_reduce(x, tag=3),
                               return_exceptions=True)
    for r in res:
        assert isinstance(r, pccl.InvalidUsageError), res
        assert "barrier" in str(r) and "16 x float32 SUM" in str(r), r
    assert (x == 1).all()
    await asyncio.gather(a.barrier(tag=3), b.barrier(tag=3))  # usable after


async def test_a_barrier_beside_a_sync_is_a_deadlock_on_both_within_a_second(peers):
    a, b = await peers(2)
    state = pccl.SharedState({"w": np.zeros(4, np.float32)})
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    res = await asyncio.gather(a.barrier(), b.sync_shared_state(state), return_exceptions=True)
    assert all(isinstance(r, pccl.DeadlockError) for r in res), res
    assert loop.time() - t0 < 1.0


async def test_a_peer_killed_before_it_arrives_fails_the_barrier_on_every_survivor(peers):
    """A barrier is the group it was launched in: a member lost before all arrived makes it
    raise ``PeerLostError`` on every survivor (as a lost peer fails an all-reduce), and the
    next barrier of the survivors passes, in the world of two."""
    a, b, c = await peers(3)
    waiting = [asyncio.ensure_future(x.barrier()) for x in (a, b)]
    done, _ = await asyncio.wait(waiting, timeout=0.2)
    assert not done
    testing.crash(c)  # killed before its barrier
    for r in await asyncio.gather(*waiting, return_exceptions=True):
        assert isinstance(r, pccl.PeerLostError) and "ring changed" in str(r), r
    assert a.peer_group_world_size == b.peer_group_world_size == 2
    await asyncio.gather(a.barrier(), b.barrier())
    await c.close()


def test_the_blocking_facade_has_barrier():
    with blocking.Master("127.0.0.1", 0, admission_interval=0.0, heartbeat_interval=0.2,
                         heartbeat_timeout=2.0) as m:
        comms = blocking_pair(m.address)
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda c: c.barrier(tag=1, timeout=10), comms))
            handles = [c.barrier_async(tag=2) for c in comms]  # launched from one thread
            for h in handles:
                h.wait()
            assert comms[0].ranks == comms[1].ranks and {c.rank for c in comms} == {0, 1}
        for c in comms:
            c.close()
