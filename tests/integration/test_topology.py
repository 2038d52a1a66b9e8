"""``optimize_topology()`` on 127.0.0.1: the whole path (votes, measurement connections,
reports, the switch), its misuse, and the measurement sink's bounds."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio._net.handshake import HandshakeError, connect
from pccl_aio._peer import testing
from pccl_aio._peer.data import measure
from pccl_aio._wire import auth
from pccl_aio._wire import messages as m
from tests.helpers import SECRET, join_peers, reduce_ok

pytestmark = pytest.mark.timeout(60)


async def test_three_peers_measure_every_pair_once_and_agree(peers, master):
    comms = await peers(3)
    infos = await asyncio.gather(*(c.optimize_topology(timeout=30) for c in comms))
    assert len(set(infos)) == 1, infos
    info = infos[0]
    ids = sorted(c.peer_id for c in comms)
    assert sorted(info.ring) == ids and info.measured == 6 and info.bottleneck_bps > 0
    links = master.state.links()
    assert sorted(links) == sorted((a, b) for a in ids for b in ids if a != b)
    assert all(bps > 0 and 0 <= lat < 1 for bps, lat in links.values())
    assert master.state.ring(0) == list(info.ring)
    for c in comms:  # each peer sizes its links (automatic connections) with what it measured
        assert testing.data_plane(c).bandwidths == {b: links[(c.peer_id, b)][0] for b in ids
                                      if b != c.peer_id}
    await reduce_ok(comms)
    again = await asyncio.gather(*(c.optimize_topology(timeout=30) for c in comms))
    assert {i.measured for i in again} == {0} and len(set(again)) == 1
    await reduce_ok(comms)


async def test_with_a_run_secret_the_measurement_connections_authenticate():
    async with pccl.Master("127.0.0.1", 0, secret=SECRET, admission_interval=0.0,
                           heartbeat_interval=0.2, heartbeat_timeout=2.0) as master:
        comms = await join_peers(master, 2, secret=SECRET)
        try:
            infos = await asyncio.gather(*(c.optimize_topology(timeout=30) for c in comms))
            assert infos[0] == infos[1] and infos[0].measured == 2
            assert all(bps > 0 for bps, _ in master.state.links().values())
            # a connection that does not hold the pair key is refused before any byte counts
            listener = testing.data_plane(comms[0]).listener
            with pytest.raises(HandshakeError):
                await connect("127.0.0.1", listener.port, None, auth.ROLE_MEASURE, b"\0" * 32,
                              comms[1].peer_id, comms[0].peer_id, measure._MeasureSource())
        finally:
            for c in comms:
                await c.close()


async def test_misuse_and_cancellation(peers):
    a, b = await peers(2)
    handle = a.all_reduce_async(np.ones(4, np.float32))
    with pytest.raises(pccl.InvalidUsageError, match="in flight"):
        await a.optimize_topology()
    await asyncio.gather(handle.wait(), b.all_reduce(np.ones(4, np.float32)))
    with pytest.raises(pccl.PcclTimeoutError):
        await a.optimize_topology(timeout=0.3)  # b never votes: the vote is taken back
    infos = await asyncio.gather(a.optimize_topology(timeout=30), b.optimize_topology(timeout=30))
    assert infos[0] == infos[1]


async def test_optimize_next_to_an_all_reduce_is_a_typed_error_not_a_hang(peers, master):
    a, b = await peers(2)
    vote = asyncio.ensure_future(a.optimize_topology(timeout=30))
    await asyncio.wait_for(_until(lambda: master.state.access.optimizing(a.peer_id)), 10)
    x = np.ones(8, np.float32)
    reduce = asyncio.ensure_future(b.all_reduce(x, timeout=30))
    with pytest.raises(pccl.DeadlockError, match="optimize_topology"):
        await vote
    y = np.ones(8, np.float32)
    await asyncio.gather(reduce, a.all_reduce(y))  # b's call goes on once a joins it
    assert (x == 2).all() and (y == 2).all()


async def test_the_sink_caps_the_window_and_the_connections(peers, monkeypatch):
    a, b = await peers(2)
    monkeypatch.setattr(m, "MAX_MEASURE_SECONDS", 0.3)
    probe = measure._MeasureSource()
    port = testing.data_plane(a).listener.port
    await connect("127.0.0.1", port, None, auth.ROLE_MEASURE, b"", b.peer_id, a.peer_id, probe)
    t0 = time.monotonic()
    nbytes, ns, rtt = await asyncio.wait_for(probe.run(3600.0, 2), 10)  # asks for an hour
    assert time.monotonic() - t0 < 5 and 0.1e9 <= ns < 2e9 and nbytes > 0 and rtt < 1
    probe.close()
    await asyncio.wait_for(_until(lambda: not testing.measurer(a).receiving), 10)
    held = [measure._MeasureSource() for _ in range(measure.MAX_SINKS + 1)]
    for p in held:
        await connect("127.0.0.1", port, None, auth.ROLE_MEASURE, b"", b.peer_id, a.peer_id, p)
    await asyncio.wait_for(_until(lambda: held[-1].closed), 10)  # one too many: closed
    assert sum(p.closed for p in held) == 1
    for p in held:
        p.close()
    await asyncio.wait_for(_until(lambda: not testing.measurer(a).receiving), 10)
    info = await asyncio.gather(a.optimize_topology(timeout=30), b.optimize_topology(timeout=30))
    assert info[0].measured == 2


async def _until(cond: object) -> None:
    while not cond():  # type: ignore[operator]
        await asyncio.sleep(0.01)  # polls a socket's state; nothing to await on


def test_the_blocking_facade_optimizes_too() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from pccl_aio import blocking

    with blocking.Master("127.0.0.1", 0, admission_interval=0.0) as master:
        a = blocking.Communicator(master.address)
        b = blocking.Communicator(master.address)
        try:
            a.connect()
            with ThreadPoolExecutor(2) as pool:
                joining = pool.submit(b.connect)
                while not a.are_peers_pending():
                    assert not joining.done() or joining.exception() is None
                a.update_topology()
                joining.result()
                infos = list(pool.map(lambda c: c.optimize_topology(timeout=30), (a, b)))
            assert infos[0] == infos[1] and isinstance(infos[0], pccl.TopologyInfo)
            assert infos[0].measured == 2 and sorted(infos[0].ring) == sorted(
                (a.peer_id, b.peer_id))
        finally:
            a.close()
            b.close()
