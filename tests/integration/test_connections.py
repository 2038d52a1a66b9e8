"""Connections per ring neighbour on loopback: automatic by default (one here), fixed when
given, and chosen from a measured bandwidth when one is set before the link opens."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio._peer import testing
from pccl_aio._peer.data.core import bdp


async def _reduce(comms: list[pccl.Communicator]) -> None:
    xs = [np.full(300_000, i + 1, np.float32) for i in range(len(comms))]
    await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs)))
    want = float(sum(range(1, len(comms) + 1)))
    for x in xs:
        assert x[0] == x[-1] == want


def _received(comm: pccl.Communicator) -> dict[int, int]:
    """Sending peer id -> admitted receive connections into ``comm``."""
    got: dict[int, int] = {}
    for r in testing.data_plane(comm).listener.conns:
        if r._admitted:
            got[r._peer] = got.get(r._peer, 0) + 1
    return got


def _successor(comm: pccl.Communicator, comms: list[pccl.Communicator]) -> int:
    ids = [c.peer_id for c in comms]
    return ids[(ids.index(comm.peer_id) + 1) % len(ids)]


async def test_loopback_default_opens_one_connection_per_neighbour(peers):
    comms = await peers(3)
    assert all(c.config.p2p_connections is None for c in comms)
    await _reduce(comms)
    await _reduce(comms)  # the second reuses the links
    for c in comms:
        assert testing.data_plane(c).link_connections() == {_successor(c, comms): 1}
        link = testing.data_plane(c).links[_successor(c, comms)]
        assert link.rtt is not None and 0 < link.rtt < 0.05  # measured, loopback
        assert list(_received(c).values()) == [1]


async def test_an_explicit_count_is_honoured(peers):
    comms = await peers(2, p2p_connections=5)
    await _reduce(comms)
    for c in comms:
        assert testing.data_plane(c).link_connections() == {_successor(c, comms): 5}
        assert testing.data_plane(c).links[_successor(c, comms)].rtt is None  # nothing measured
        assert list(_received(c).values()) == [5]


async def test_a_measured_bandwidth_set_before_the_link_opens_is_used(peers):
    comms = await peers(2)
    a, b = comms
    # Loopback's RTT (tens of us) at this bandwidth is far beyond one stream's window.
    testing.data_plane(a).set_bandwidth(b.peer_id, 1e15)
    await _reduce(comms)
    assert testing.data_plane(a).link_connections() == {b.peer_id: bdp.AUTO_CAP}
    assert testing.data_plane(b).link_connections() == {a.peer_id: 1}
    assert _received(b) == {a.peer_id: bdp.AUTO_CAP}
    # An open link keeps its connections: a new figure waits for the next link.
    testing.data_plane(a).set_bandwidth(b.peer_id, 1.0)
    await _reduce(comms)
    assert testing.data_plane(a).link_connections() == {b.peer_id: bdp.AUTO_CAP}


@pytest.mark.parametrize("bw", [0, -1.0, math.nan, math.inf, "1e9", True])
async def test_a_bad_bandwidth_is_invalid_usage(peers, bw):
    comms = await peers(1)
    with pytest.raises(pccl.InvalidUsageError, match="bandwidth"):
        testing.data_plane(comms[0]).set_bandwidth(2, bw)


async def test_a_forgotten_bandwidth_falls_back_to_the_assumed_one(peers):
    comms = await peers(2)
    a, b = comms
    testing.data_plane(a).set_bandwidth(b.peer_id, 1e15)
    testing.data_plane(a).set_bandwidth(b.peer_id, None)
    await _reduce(comms)
    assert testing.data_plane(a).link_connections() == {b.peer_id: 1}


async def test_frames_spread_over_every_connection_when_none_is_backed_up(peers):
    """On loopback the kernel absorbs every frame, so no connection ever has bytes waiting:
    ties go round-robin, and each connection carries its share (first-in-list used to take
    them all, leaving the others idle with cold windows on a WAN)."""
    comms = await peers(2, p2p_connections=4)
    xs = [np.ones(4 << 20, np.float32) for _ in comms]  # 16 MiB: 8 segments each way per phase
    await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs)))
    for c in comms:
        (link,) = testing.data_plane(c).links.values()
        sent = [s.queued for s in link.senders]
        assert len(sent) == 4 and min(sent) > 0, sent
        assert max(sent) - min(sent) <= (1 << 20) + 64, sent  # within one segment
