"""The automatic choice of connections per link (``core/bdp.py``) and its option's checks."""

from __future__ import annotations

import math
import struct

import pytest

import pccl_aio as pccl
from pccl_aio._peer.core.config import PeerConfig
from pccl_aio._peer.data.core import bdp

MIB = 1 << 20


@pytest.mark.parametrize(("rtt", "bandwidth", "window", "k"), [
    (50e-6, None, 4 * MIB, 1),      # loopback, bandwidth assumed: 62 KB in flight
    (0.5e-3, None, 4 * MIB, 1),     # a LAN
    (100e-3, None, 4 * MIB, 8),     # a WAN at the assumed 10 Gbit/s: the cap
    (100e-3, 1e9, 4 * MIB, 6),      # 12.5 MB in flight over 2 MiB per stream: 5.96
    (100e-3, 1e9, 32 * MIB, 1),     # a large window: one stream suffices
    (10e-3, 1e9, 4 * MIB, 1),       # 1.25 MB
    (20e-3, 1e9, 4 * MIB, 2),       # 2.5 MB / 2 MiB = 1.19
    (20e-3, 3e9, 4 * MIB, 4),       # 7.5 MB / 2 MiB = 3.6
    (1.0, 100e9, 4 * MIB, 8),       # far beyond the cap
])
def test_connections_follow_the_bandwidth_delay_product(rtt, bandwidth, window, k):
    assert bdp.choose_connections(rtt, bandwidth, window) == k


def test_the_formula_and_the_cap():
    for rtt in (1e-4, 1e-3, 5e-3, 0.03, 0.1):
        for bw in (1e8, 1e9, 1e10):
            want = math.ceil(bw / 8 * rtt / (4 * MIB * bdp.WINDOW_SHARE))
            assert bdp.choose_connections(rtt, bw, 4 * MIB, cap=64) == max(1, min(64, want))
            assert bdp.choose_connections(rtt, bw, 4 * MIB, cap=3) == max(1, min(3, want))
    assert bdp.choose_connections(0.1, None, 4 * MIB, cap=0) == 1


@pytest.mark.parametrize("rtt", [0.0, -1.0, math.nan, math.inf])
def test_an_unusable_rtt_gives_one_connection(rtt):
    assert bdp.choose_connections(rtt, 1e9, 4 * MIB) == 1


@pytest.mark.parametrize("bw", [0.0, -5.0, math.nan, math.inf])
def test_an_unusable_bandwidth_gives_one_connection(bw):
    assert bdp.choose_connections(0.1, bw, 4 * MIB) == 1


def test_a_zero_window_gives_the_cap():
    assert bdp.choose_connections(0.1, 1e9, 0) == bdp.AUTO_CAP


def _tcp_info(rtt_us: int, min_rtt_us: int | None, length: int = bdp.TCP_INFO_LEN) -> bytes:
    raw = bytearray(length)
    struct.pack_into("=I", raw, 68, rtt_us)
    if min_rtt_us is not None:
        struct.pack_into("=I", raw, 148, min_rtt_us)
    return bytes(raw)


def test_rtt_from_tcp_info_prefers_the_minimum():
    assert bdp.rtt_from_tcp_info(_tcp_info(120_000, 100_500)) == pytest.approx(0.1005)
    assert bdp.rtt_from_tcp_info(_tcp_info(120_000, 0)) == pytest.approx(0.12)  # no min yet
    assert bdp.rtt_from_tcp_info(_tcp_info(120_000, 0xFFFFFFFF)) == pytest.approx(0.12)
    assert bdp.rtt_from_tcp_info(_tcp_info(37, None, 104)) == pytest.approx(37e-6)  # old kernel
    assert bdp.rtt_from_tcp_info(_tcp_info(0, None, 104)) is None
    assert bdp.rtt_from_tcp_info(b"\x01" * 40) is None


def test_the_real_tcp_info_of_a_loopback_connection():
    import socket

    srv = socket.create_server(("127.0.0.1", 0))
    with srv, socket.create_connection(srv.getsockname()) as c, srv.accept()[0] as s:
        c.sendall(b"x")
        assert s.recv(1) == b"x"
        s.sendall(b"y")
        assert c.recv(1) == b"y"
        rtt = bdp.rtt_from_tcp_info(
            c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, bdp.TCP_INFO_LEN))
    assert rtt is not None and 0 < rtt < 0.05


@pytest.mark.parametrize(("text", "want"), [
    ("4096\t16384\t4194304\n", 4194304), ("4096 16384 33554432", 33554432),
    ("", bdp.DEFAULT_WMEM_MAX), ("4096 16384", bdp.DEFAULT_WMEM_MAX),
    ("a b c", bdp.DEFAULT_WMEM_MAX), ("1 2 0", bdp.DEFAULT_WMEM_MAX),
])
def test_wmem_max(text, want):
    assert bdp.wmem_max(text) == want


@pytest.mark.parametrize("value", [None, "auto", 1, 16, 256])
def test_p2p_connections_accepts_auto_and_ints(value):
    config = PeerConfig.parse("127.0.0.1:48148", p2p_connections=value)
    assert config.p2p_connections == (None if value == "auto" else value)


@pytest.mark.parametrize("value", [0, 257, -1, True, 2.0, "8", "AUTO", b"auto", [4]])
def test_p2p_connections_refuses_anything_else(value):
    with pytest.raises(pccl.InvalidUsageError, match="p2p_connections"):
        pccl.Communicator("127.0.0.1:48148", p2p_connections=value)


def test_the_default_is_automatic():
    assert pccl.Communicator("127.0.0.1:48148").config.p2p_connections is None
