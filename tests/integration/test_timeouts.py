"""``timeout=`` on every blocking call: PcclTimeoutError, and the communicator still usable.
A call cancelled from outside (``asyncio.wait_for``) takes its vote back the same way, and
``connect`` to a master that accepts and never answers times out."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

import pccl_aio as pccl
from tests.helpers import FAST, reduce_ok

pytestmark = pytest.mark.timeout(60)


async def test_all_reduce_times_out_when_a_peer_never_calls_and_the_input_is_restored(peers):
    a, b = await peers(2)
    x = np.arange(1 << 16, dtype=np.float32)
    t0 = time.monotonic()
    with pytest.raises(pccl.PcclTimeoutError, match="all-reduce tag 0 did not finish"):
        await a.all_reduce(x, timeout=0.3)  # b is busy elsewhere and never launches
    assert 0.3 <= time.monotonic() - t0 < 3
    np.testing.assert_array_equal(x, np.arange(1 << 16, dtype=np.float32))
    await reduce_ok([a, b])


async def test_handle_wait_timeout(peers):
    a, b = await peers(2)
    h = a.all_reduce_async(np.ones(8, np.float32))
    with pytest.raises(pccl.PcclTimeoutError):
        await h.wait(timeout=0.2)
    assert h.done()
    await reduce_ok([a, b])


async def test_votes_time_out_and_are_taken_back(peers):
    a, b = await peers(2)
    with pytest.raises(pccl.PcclTimeoutError, match="update_topology"):
        await a.update_topology(timeout=0.2)
    with pytest.raises(pccl.PcclTimeoutError, match="are_peers_pending"):
        await a.are_peers_pending(timeout=0.2)
    assert await asyncio.gather(a.are_peers_pending(), b.are_peers_pending()) == [False] * 2
    await asyncio.gather(a.update_topology(timeout=5), b.update_topology(timeout=5))
    await reduce_ok([a, b])


async def test_multiple_with_retry_times_out_and_restores(peers):
    a, b = await peers(2)
    xs = [np.full(1000, 3, np.float32) for _ in range(4)]
    with pytest.raises(pccl.PcclTimeoutError):
        await a.all_reduce_multiple_with_retry(xs, timeout=0.2)
    assert all((x == 3).all() for x in xs)
    await reduce_ok([a, b])


async def test_connect_times_out_waiting_for_admission(master, peers):
    (a,) = await peers(1)  # accepted, but it never votes anyone in
    joiner = pccl.Communicator(master.address, **FAST)
    with pytest.raises(pccl.PcclTimeoutError, match="connect"):
        await joiner.connect(timeout=0.3)
    await joiner.close()
    assert not await a.are_peers_pending()  # the joiner's registration went with it


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "1", True])
async def test_bad_timeouts_are_invalid_usage(peers, bad):
    a, b = await peers(2)
    x = np.ones(4, np.float32)
    for call in (lambda: a.all_reduce(x, timeout=bad), lambda: a.update_topology(timeout=bad),
                 lambda: a.are_peers_pending(timeout=bad),
                 lambda: a.all_reduce_multiple_with_retry([x], timeout=bad),
                 lambda: a.sync_shared_state(pccl.SharedState({"x": x}), timeout=bad)):
        with pytest.raises(pccl.InvalidUsageError, match="timeout"):
            await call()
    await reduce_ok([a, b])  # nothing was sent


async def test_sync_times_out_and_its_vote_is_taken_back(peers):
    a, b = await peers(2)
    xa, xb = np.ones(64, np.float32), np.ones(64, np.float32)
    sa, sb = pccl.SharedState({"x": xa}), pccl.SharedState({"x": xb})
    with pytest.raises(pccl.PcclTimeoutError, match="sync_shared_state"):
        await a.sync_shared_state(sa, timeout=0.3)  # b never syncs
    await reduce_ok([a, b])  # a's sync vote no longer counts: not a mismatch, not a kick
    infos = await asyncio.gather(a.sync_shared_state(sa), b.sync_shared_state(sb))
    assert [i.revision for i in infos] == [0, 0]


# A cancelled vote used to stay counted at the master, and the peer's next call got it kicked.
async def test_a_cancelled_topology_vote_is_withdrawn(peers):
    a, b = await peers(2)
    with pytest.raises(TimeoutError):  # b never votes: the vote cannot complete
        await asyncio.wait_for(a.update_topology(), 0.3)
    await reduce_ok([a, b])  # before: "collective tag 0 already running" and a was kicked
    await asyncio.gather(a.update_topology(), b.update_topology())  # a fresh joint vote
    await reduce_ok([a, b])


async def test_a_cancelled_pending_vote_is_withdrawn(peers):
    a, b = await peers(2)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(a.are_peers_pending(), 0.3)
    await reduce_ok([a, b])
    # before: a's withdrawn vote still counted, so this one was a duplicate and a was kicked
    assert await asyncio.gather(a.are_peers_pending(), b.are_peers_pending()) == [False, False]
    await reduce_ok([a, b])


# It used to hang for ever.
async def test_connect_to_a_master_that_never_answers_times_out():
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # accepts, reads the Hello, never answers
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    comm = pccl.Communicator(f"127.0.0.1:{port}", **{**FAST, "heartbeat_timeout": 0.5})
    t0 = time.monotonic()
    with pytest.raises(pccl.PcclTimeoutError, match="did not answer"):
        await asyncio.wait_for(comm.connect(attempts=1), 10)
    assert time.monotonic() - t0 < 5
    await comm.close()
    server.close()
    await server.wait_closed()
