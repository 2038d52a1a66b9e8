"""Bugs the restructuring of issue 15 exposed, each pinned by a test that failed before.

- A data link whose connect failed was never retried (the failed attempt was cached).
- A cancelled ``update_topology()``/``are_peers_pending()`` stayed counted at the master and
  the peer's next call got it kicked.
- A communicator used from another event loop or thread corrupted the group.
- ``connect()`` to a master that accepts and never answers hung forever.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio._peer import testing
from tests.helpers import FAST, record_sends, reduce_ok

pytestmark = pytest.mark.timeout(60)


async def test_a_refused_data_connect_is_retried_by_the_next_collective(peers):
    a, b = await peers(2)
    listener = testing.data_plane(b).listener
    host, port = b.config.listen_host, listener.port
    await listener.close()  # b's data port refuses: a cannot reach its ring successor
    xs = [np.ones(1000, np.float32), np.ones(1000, np.float32)]
    results = await asyncio.gather(a.all_reduce(xs[0]), b.all_reduce(xs[1]),
                                   return_exceptions=True)
    assert all(isinstance(r, pccl.PeerLostError) for r in results), results
    assert all((x == 1).all() for x in xs)  # restored
    await listener.start(host, port)  # the listener is back on the same port
    await reduce_ok([a, b])


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


async def test_a_call_from_another_loop_or_thread_raises_and_sends_nothing(peers):
    a, b = await peers(2)
    sent = record_sends(a)
    x = np.ones(16, np.float32)

    def from_a_thread() -> list[type[BaseException]]:
        seen: list[type[BaseException]] = []

        async def other_loop() -> None:
            for call in (lambda: a.all_reduce(x), a.update_topology, a.are_peers_pending,
                         lambda: a.sync_shared_state(pccl.SharedState({"x": x})), a.close):
                try:
                    await asyncio.wait_for(call(), 5)
                except BaseException as exc:
                    seen.append(type(exc))

        asyncio.run(other_loop())
        try:  # no event loop at all in this thread
            a.all_reduce_async(x)
        except BaseException as exc:
            seen.append(type(exc))
        return seen

    seen = await asyncio.to_thread(from_a_thread)
    assert seen == [pccl.InvalidUsageError] * 6
    assert sent == []
    await reduce_ok([a, b])  # the group did not notice


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
