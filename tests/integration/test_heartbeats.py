"""Liveness between peers and the master: each side beacons every ``heartbeat_interval``
(default: a third of ``heartbeat_timeout``), but silence is judged every 0.5 s whatever the
interval, so a death is noticed at the timeout; and a joiner's first heartbeat goes out
0.5 s after its welcome, so admission never waits for a beacon period. Real master, real
sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio._net.stream import read_frame
from pccl_aio._wire import messages as m
from pccl_aio._wire.framing import frame
from tests.helpers import FAST, raw_master

pytestmark = pytest.mark.timeout(30)

SLOW = 30.0  # a beacon period far beyond every wait below


async def test_the_defaults_beat_three_times_per_timeout() -> None:
    async with pccl.Master("127.0.0.1", 0) as mst:
        assert mst.heartbeat_interval == pytest.approx(5.0 / 3)
        comm = pccl.Communicator(mst.address)
        assert comm.config.heartbeat_interval == pytest.approx(5.0 / 3)
        assert comm.config.heartbeat_timeout == 5.0
    async with pccl.Master("127.0.0.1", 0, heartbeat_timeout=9.0) as mst:
        assert mst.heartbeat_interval == pytest.approx(3.0)
    assert pccl.Communicator("127.0.0.1:1", heartbeat_timeout=9.0).config.heartbeat_interval == 3.0


@pytest.mark.parametrize("kw", [{"heartbeat_interval": 0.0}, {"heartbeat_interval": -1.0},
                                {"heartbeat_interval": float("nan")},
                                {"heartbeat_timeout": 0.0}])
def test_a_master_refuses_intervals_that_are_not_positive(kw: dict[str, float]) -> None:
    with pytest.raises(pccl.InvalidUsageError, match="positive"):
        pccl.Master("127.0.0.1", 0, **kw)


async def test_a_silent_peer_is_dropped_at_the_timeout_not_at_the_beacon_period() -> None:
    """The master beacons every 30 s but judges silence every 0.5 s: a registered client
    that says nothing after its ``Hello`` is closed after 1-2 s, with no beacon before."""
    async with pccl.Master("127.0.0.1", 0, heartbeat_interval=SLOW,
                           heartbeat_timeout=1.0) as mst:
        reader, writer = await raw_master(mst.port)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        writer.write(frame(m.encode(m.Hello(m.PROTOCOL_VERSION, 0, 40000))))
        got: list[type] = []
        try:
            while True:
                body = await asyncio.wait_for(read_frame(reader), 5)
                got.append(type(m.decode_master_to_peer(body)))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
        assert 1.0 <= loop.time() - t0 < 2.5
        assert m.Welcome in got and m.MasterHeartbeat not in got, got
        assert mst.state.registered() == []


async def test_a_peer_notices_a_silent_master_at_its_timeout_not_at_its_beacon_period() -> None:
    """A master that beacons every 30 s is silent for a peer whose timeout is 1 s: with
    ``master_timeout=0`` the peer's waiting call fails within 1-2 s."""
    async with pccl.Master("127.0.0.1", 0, heartbeat_interval=SLOW,
                           heartbeat_timeout=SLOW) as mst, \
            pccl.Communicator(mst.address, heartbeat_interval=SLOW, heartbeat_timeout=1.0,
                              master_timeout=0) as comm:
        await comm.connect()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(pccl.MasterConnectionError, match="silent"):
            await asyncio.wait_for(comm.wait_for_peers(2), 5)
        assert loop.time() - t0 < 2.5


async def test_a_joiner_is_pending_at_once_whatever_its_interval() -> None:
    """A joiner whose beacon period is 30 s is heard from 0.5 s after its welcome: the
    member sees it pending and admits it within seconds (before its first periodic beat)."""
    async with pccl.Master("127.0.0.1", 0, heartbeat_timeout=SLOW,
                           admission_interval=0.0) as mst, \
            pccl.Communicator(mst.address, **FAST) as member, \
            pccl.Communicator(mst.address, heartbeat_interval=SLOW,
                              heartbeat_timeout=SLOW) as joiner:
        await member.connect()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        joining = asyncio.ensure_future(joiner.connect())
        assert await asyncio.wait_for(member.wait_for_peers(2), 10) == 2
        await asyncio.wait_for(joining, 5)
        assert loop.time() - t0 < 5
        x, y = np.ones(8, np.float32), np.full(8, 2, np.float32)
        await asyncio.gather(member.all_reduce(x), joiner.all_reduce(y))
        assert (x == 3).all() and (y == 3).all()
