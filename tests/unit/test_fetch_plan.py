"""The shared-state fetcher's pure choices (``_peer/state/transfer.py``): connections per
source from the RTT, the piece size from the total and the connections, and cutting pieces
off the work queue."""

from __future__ import annotations

import pytest

from pccl_aio._peer.data.core import bdp
from pccl_aio._peer.state import transfer

pytestmark = pytest.mark.timeout(30)
MIB = 1 << 20


@pytest.mark.parametrize(("rtt", "window", "k"), [
    (None, 4 * MIB, 2),          # no RTT measured: today's 2
    (50e-6, 4 * MIB, 2),         # loopback
    (0.5e-3, 4 * MIB, 2),        # a LAN
    (5e-3, 4 * MIB, 3),          # 6.25 MB in flight at the assumed 10 Gbit/s / 2 MiB
    (100e-3, 4 * MIB, bdp.AUTO_CAP),  # a WAN: the cap
    (100e-3, 1 << 30, 2),        # a window that holds the whole product
])
def test_streams_follow_the_bandwidth_delay_product(rtt, window, k):
    assert transfer.streams_for(rtt, window) == k
    assert transfer.STREAMS <= k <= transfer.MAX_PER_PEER


@pytest.mark.parametrize(("total", "streams", "piece"), [
    (1024, 2, MIB),              # a small fetch: the floor (one piece)
    (64 * MIB, 4, 4 * MIB),      # 64 MiB over 4 connections
    (64 * MIB, 6, 2796203),     # 64 MiB / 24, rounded up
    (256 * MIB, 8, 8 * MIB),     # a WAN source: 32 pieces of the largest size
    (256 * MIB, 2, 8 * MIB),     # the ceiling
    (40 * MIB, 16, MIB),         # the floor
    (10 * MIB, 0, 10 * MIB // 4),  # 0 streams count as 1
])
def test_piece_size_leaves_a_short_tail(total, streams, piece):
    assert transfer.piece_size(total, streams) == piece
    assert transfer.MIN_PIECE <= piece <= transfer.PIECE


def test_take_cuts_the_next_piece_and_keeps_the_rest_in_order():
    buf = memoryview(bytearray(range(250)) * 100)  # 25000 bytes
    queue = list(reversed([("a", 0, buf[:10000]), ("b", 0, buf[10000:])]))
    got = []
    while queue:
        key, off, view = transfer.take(queue, 4096)
        assert view.nbytes <= 4096
        got.append((key, off, view.nbytes, bytes(view)))
    assert [(k, o, n) for k, o, n, _ in got] == [
        ("a", 0, 4096), ("a", 4096, 4096), ("a", 8192, 1808),
        ("b", 0, 4096), ("b", 4096, 4096), ("b", 8192, 4096), ("b", 12288, 2712)]
    assert b"".join(d for _, _, _, d in got) == bytes(buf)


def test_an_empty_entry_is_one_empty_piece():
    queue = [("e", 0, memoryview(b""))]
    assert transfer.take(queue, MIB)[2].nbytes == 0 and not queue
