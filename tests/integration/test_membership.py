"""Join, admission votes, leave, peer groups and API misuse, on real sockets in one loop."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

import pccl_aio as pccl
from tests.helpers import FAST, admit


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_no_master_raises_then_a_later_connect_succeeds():
    port = _free_port()
    comm = pccl.Communicator(f"127.0.0.1:{port}", **FAST)
    with pytest.raises(pccl.MasterConnectionError, match="3 attempt"):
        await comm.connect(attempts=3, backoff=0.01)
    async with pccl.Master("127.0.0.1", port) as _m, comm:
        await comm.connect(attempts=1)
        assert comm.world_size == 1


async def test_joiner_waits_for_update_topology(master):
    a = pccl.Communicator(master.address, **FAST)
    b = pccl.Communicator(master.address, **FAST)
    async with a, b:
        await a.connect()
        assert await a.are_peers_pending() is False
        task = asyncio.ensure_future(b.connect())
        while not await a.are_peers_pending():
            pass
        assert not task.done()  # registered, but not admitted before the vote
        assert a.world_size == 1
        await a.update_topology()
        await task
        assert a.world_size == b.world_size == 2
        assert await asyncio.gather(a.are_peers_pending(), b.are_peers_pending()) == [False, False]


async def test_calls_before_connect_and_connect_twice(master):
    c = pccl.Communicator(master.address, **FAST)
    with pytest.raises(pccl.InvalidUsageError):
        await c.update_topology()
    with pytest.raises(pccl.InvalidUsageError):
        await c.are_peers_pending()
    with pytest.raises(pccl.InvalidUsageError):
        await c.all_reduce(np.zeros(2, np.float32))
    async with c:
        await c.connect()
        with pytest.raises(pccl.InvalidUsageError):
            await c.connect()


async def test_bad_constructor_arguments():
    for kw in ({"peer_group": -1}, {"p2p_connections": 0}, {"heartbeat_timeout": 0}):
        with pytest.raises(pccl.InvalidUsageError):
            pccl.Communicator("127.0.0.1:1", **kw)
    with pytest.raises(pccl.InvalidUsageError):
        pccl.Communicator("no-port")


async def test_four_peers_join_one_by_one_and_reduce(peers):
    comms = await peers(4)
    assert [c.world_size for c in comms] == [4] * 4
    xs = [np.full(10, i, np.int32) for i in range(4)]
    await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs)))
    assert all((x == 6).all() for x in xs)


async def test_graceful_leave_between_steps(peers):
    comms = await peers(3)
    await comms[2].close()
    rest = comms[:2]
    await asyncio.gather(*(c.update_topology() for c in rest))
    assert [c.world_size for c in rest] == [2, 2]
    xs = [np.ones(5, np.float32) for _ in rest]
    infos = await asyncio.gather(*(c.all_reduce(x) for c, x in zip(rest, xs)))
    assert infos[0].world_size == 2 and (xs[0] == 2).all()


async def test_peer_groups_partition_collectives(peers):
    a, b = await peers(2, groups=[0, 1])
    for c in (a, b):
        assert (c.world_size, c.peer_group_world_size, c.num_peer_groups,
                c.largest_peer_group_world_size) == (2, 1, 2, 1)
        with pytest.raises(pccl.TooFewPeersError):
            await c.all_reduce(np.zeros(3, np.float32))


async def test_two_groups_reduce_independently(master, peers):
    comms = await peers(4, groups=[0, 1, 0, 1])
    xs = [np.full(7, i + 1, np.int64) for i in range(4)]
    await asyncio.gather(*(c.all_reduce(x, tag=5) for c, x in zip(comms, xs)))
    assert (xs[0] == 4).all() and (xs[2] == 4).all()  # group 0: peers 1 + 3
    assert (xs[1] == 6).all() and (xs[3] == 6).all()  # group 1: peers 2 + 4
    assert comms[0].largest_peer_group_world_size == 2 and comms[0].num_peer_groups == 2


async def test_update_topology_refused_while_reducing_but_pending_allowed(peers):
    comms = await peers(2)
    xs = [np.ones(1 << 16, np.float32) for _ in comms]
    hs = [c.all_reduce_async(x, tag=1) for c, x in zip(comms, xs)]
    with pytest.raises(pccl.InvalidUsageError, match="in flight"):
        await comms[0].update_topology()
    assert await asyncio.gather(*(c.are_peers_pending() for c in comms)) == [False, False]
    await asyncio.gather(*hs)
    assert (xs[0] == 2).all()
    await asyncio.gather(*(c.update_topology() for c in comms))


async def test_admission_of_a_late_joiner_keeps_reducing(master, peers):
    comms = await peers(2)
    late = pccl.Communicator(master.address, **FAST)
    async with late:
        await admit(comms, late)
        all3 = [*comms, late]
        xs = [np.full(9, 2.0, np.float64) for _ in all3]
        infos = await asyncio.gather(*(c.all_reduce(x, op=pccl.ReduceOp.AVG)
                                       for c, x in zip(all3, xs)))
        assert [i.world_size for i in infos] == [3, 3, 3] and (xs[2] == 2.0).all()


async def test_phase_disagreement_gives_a_clear_error_not_a_hang(master, peers):
    # A newcomer that calls update_topology() while the veterans go on to all_reduce
    # (PCCL deadlocks here, scenario 12): the topology vote is withdrawn with an error.
    a, b = await peers(2)
    xa, xb = np.ones(4, np.float32), np.ones(4, np.float32)
    ha = a.all_reduce_async(xa)
    with pytest.raises(pccl.InvalidUsageError, match="same calls"):
        await b.update_topology()
    await asyncio.gather(ha, b.all_reduce(xb))  # b recovers by following the others
    assert (xa == 2).all() and (xb == 2).all()
    pa = asyncio.ensure_future(a.are_peers_pending())
    with pytest.raises(pccl.InvalidUsageError, match="same calls"):
        await b.update_topology()
    assert await asyncio.gather(pa, b.are_peers_pending()) == [False, False]

