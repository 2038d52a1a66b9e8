"""``wait_for_peers``: waiting for company without polling the master, on real sockets."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio import blocking
from tests.helpers import FAST, record_sends, reduce_ok


async def test_returns_at_once_when_the_group_is_big_enough(peers):
    a, b = await peers(2)
    sent_a, sent_b = record_sends(a), record_sends(b)
    assert await asyncio.gather(a.wait_for_peers(2), b.wait_for_peers(1)) == [2, 2]
    assert sent_a == sent_b == []  # a local check: nothing to the master


async def test_a_lone_peer_waits_without_a_vote_and_admits_the_second(master):
    a = pccl.Communicator(master.address, **FAST)
    b = pccl.Communicator(master.address, **FAST)
    async with a, b:
        await a.connect()
        sent = record_sends(a)
        waiting = asyncio.ensure_future(a.wait_for_peers(2))
        done, _ = await asyncio.wait([waiting], timeout=1.0)
        assert not done and sent == []  # a second of waiting: no vote, no message at all
        await b.connect()  # returns once a's wait admitted it
        assert await waiting == 2 and b.peer_group_world_size == 2
        assert [type(x).__name__ for x in sent] == ["VotePeersPending", "VoteUpdateTopology"]
        await reduce_ok([a, b])


async def test_three_peers_started_one_after_another(master):
    comms = [pccl.Communicator(master.address, **FAST) for _ in range(3)]
    try:
        async def peer(c: pccl.Communicator) -> int:
            await c.connect()
            return await c.wait_for_peers(3, timeout=30)

        first = asyncio.ensure_future(peer(comms[0]))
        second = asyncio.ensure_future(peer(comms[1]))
        done, _ = await asyncio.wait([first, second], timeout=0.5)
        assert not done  # two of the three wanted: both wait
        assert await asyncio.gather(first, second, peer(comms[2])) == [3, 3, 3]
        await reduce_ok(comms)
    finally:
        for c in comms:
            await c.close()


async def test_a_waiter_and_a_training_loop_admit_together(master):
    """``b`` votes ``are_peers_pending`` in a loop (the README's training idiom) while ``a``
    waits for a third peer: ``a``'s vote joins ``b``'s round, then both admit ``c``."""
    a, b, c = (pccl.Communicator(master.address, **FAST) for _ in range(3))
    async with a, b, c:
        await a.connect()
        joining = asyncio.ensure_future(b.connect())
        assert await a.wait_for_peers(2, timeout=30) == 2
        await joining

        async def loop() -> None:
            while b.peer_group_world_size < 3:
                if await b.are_peers_pending():
                    await b.update_topology()

        looping = asyncio.ensure_future(loop())
        waiting = asyncio.ensure_future(a.wait_for_peers(3, timeout=30))
        await c.connect()
        await asyncio.wait_for(asyncio.gather(looping, waiting), 30)
        await reduce_ok([a, b, c])


async def test_timeout_says_what_was_waited_for_and_the_peer_stays_usable(master):
    a = pccl.Communicator(master.address, **FAST)
    b = pccl.Communicator(master.address, **FAST)
    async with a, b:
        await a.connect()
        with pytest.raises(pccl.PcclTimeoutError,
                           match=r"wait_for_peers\(2\) did not finish within 0.3 s: peer group "
                                 r"0 has 1 of the 2 peers wanted"):
            await a.wait_for_peers(2, timeout=0.3)
        joining = asyncio.ensure_future(b.connect())
        assert await a.wait_for_peers(2, timeout=30) == 2
        await joining


async def test_cancelled_while_waiting_leaves_nothing_behind(master):
    a = pccl.Communicator(master.address, **FAST)
    b = pccl.Communicator(master.address, **FAST)
    async with a, b:
        await a.connect()
        waiting = asyncio.ensure_future(a.wait_for_peers(2))
        await asyncio.wait([waiting], timeout=0.2)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        joining = asyncio.ensure_future(b.connect())
        assert await a.wait_for_peers(2, timeout=30) == 2  # a new wait admits b
        await joining
        x = np.ones(8, np.float32)
        await asyncio.gather(a.all_reduce(x), b.all_reduce(np.ones(8, np.float32)))
        assert (x == 2).all()


@pytest.mark.parametrize("n", [0, -1, 2.0, True, "2", None])
async def test_bad_n_is_refused_before_anything_is_sent(peers, n):
    (a,) = await peers(1)
    sent = record_sends(a)
    with pytest.raises(pccl.InvalidUsageError, match="n must be an int >= 1"):
        await a.wait_for_peers(n)
    assert sent == []


async def test_before_connect_and_when_the_session_ends(master):
    a = pccl.Communicator(master.address, master_timeout=0.5, **FAST)
    with pytest.raises(pccl.InvalidUsageError, match="connect"):
        await a.wait_for_peers(2)
    async with a:
        await a.connect()
        waiting = asyncio.ensure_future(a.wait_for_peers(2))
        await asyncio.wait([waiting], timeout=0.2)
        await master.close()  # the session ends for good once master_timeout elapsed
        with pytest.raises(pccl.MasterConnectionError):
            await asyncio.wait_for(waiting, 30)


def test_the_blocking_twin(master_thread_address: str):
    with blocking.Communicator(master_thread_address, **FAST) as a, \
            blocking.Communicator(master_thread_address, **FAST) as b:
        a.connect()
        with pytest.raises(pccl.PcclTimeoutError, match="has 1 of the 2 peers wanted"):
            a.wait_for_peers(2, timeout=0.2)
        t = threading.Thread(target=b.connect)
        t.start()
        assert a.wait_for_peers(2, timeout=30) == 2
        t.join(30)
        assert b.wait_for_peers(2) == 2


@pytest.fixture
def master_thread_address():
    with blocking.Master("127.0.0.1", 0, heartbeat_interval=0.2, heartbeat_timeout=2.0) as m:
        yield m.address
