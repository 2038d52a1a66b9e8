"""How many TCP connections a link needs: its bandwidth-delay product over one stream's window.

Sans-IO: ``link.py`` reads the RTT (``TCP_INFO``) and the send-buffer ceiling
(``net.ipv4.tcp_wmem``) and passes them here. One TCP stream keeps at most about its send
buffer in flight, and Linux caps that at ``tcp_wmem``'s third field (4 MiB by default), so
one stream tops out near ``window / RTT`` (~28 MB/s at 100 ms RTT); ``K`` streams striped
together carry about ``K`` times that, until the link is full.
"""

from __future__ import annotations

import math
import struct
from typing import Final

# Connections per neighbour chosen automatically, at most. On the emulated 100 ms / 1 Gbit/s
# link more than 8 measured no faster unquantized and 20-25 % slower with uint8 (BBR keeps
# about 2 x BDP in flight over all of a link's flows, whatever their number; bench/RESULTS.md,
# "Issue 19"). A faster link that needs more: fix ``p2p_connections``.
AUTO_CAP: Final = 8
# The bandwidth assumed when none was measured (bits/s): high enough that a long link gets
# the cap, low enough that loopback (RTT ~50 us: 62 KB in flight) and LANs (0.5 ms:
# 625 KB) stay at one connection.
ASSUMED_BANDWIDTH: Final = 10e9
DEFAULT_WMEM_MAX: Final = 4 << 20  # Linux's default tcp_wmem max, when it cannot be read
# The share of the send-buffer ceiling one stream keeps in flight: the buffer also holds
# what is queued but unsent and the skbs' overhead. Measured: 4 MiB at 100 ms RTT carried
# 28.5 MB/s (0.68 of 4 MiB per RTT; bench/RESULTS.md, "Emulated WAN"); half is the
# conservative round figure (more connections rather than fewer).
WINDOW_SHARE: Final = 0.5

# struct tcp_info (linux/tcp.h): tcpi_rtt (smoothed RTT, microseconds) is the u32 at byte 68,
# tcpi_min_rtt (the minimum RTT sample, microseconds, Linux >= 4.6) the u32 at byte 148.
TCP_INFO_LEN: Final = 152
_RTT_AT, _MIN_RTT_AT = 68, 148


def choose_connections(rtt: float, bandwidth: float | None, window: int,
                       cap: int = AUTO_CAP) -> int:
    """``clamp(ceil(bandwidth * rtt / (8 * window * WINDOW_SHARE)), 1, cap)``.

    ``rtt`` in seconds, ``bandwidth`` in bits/s (None: ``ASSUMED_BANDWIDTH``), ``window`` the
    send-buffer ceiling in bytes (``tcp_wmem`` max). Unusable figures (not finite, <= 0)
    give 1 connection for the RTT and the cap for a window; ``cap`` < 1 counts as 1.
    """
    cap = max(1, cap)
    bw = ASSUMED_BANDWIDTH if bandwidth is None else bandwidth
    if not (math.isfinite(rtt) and rtt > 0 and math.isfinite(bw) and bw > 0):
        return 1
    per_stream = window * WINDOW_SHARE
    if not (math.isfinite(per_stream) and per_stream > 0):
        return cap
    need = bw / 8 * rtt / per_stream
    return cap if need >= cap else max(1, math.ceil(need))


def rtt_from_tcp_info(raw: bytes) -> float | None:
    """The RTT in seconds from a ``getsockopt(IPPROTO_TCP, TCP_INFO, TCP_INFO_LEN)`` answer:
    ``tcpi_min_rtt`` when the kernel fills it, else ``tcpi_rtt``; None if neither is there
    (a short struct, or no sample yet)."""
    if len(raw) >= _MIN_RTT_AT + 4:
        us: int = struct.unpack_from("=I", raw, _MIN_RTT_AT)[0]
        if 0 < us < 0xFFFFFFFF:  # ~0U: no sample yet
            return us / 1e6
    if len(raw) >= _RTT_AT + 4:
        us = struct.unpack_from("=I", raw, _RTT_AT)[0]
        if us > 0:
            return us / 1e6
    return None


def wmem_max(text: str) -> int:
    """The third field of ``/proc/sys/net/ipv4/tcp_wmem`` (``"4096 16384 4194304"``);
    ``DEFAULT_WMEM_MAX`` if it does not parse."""
    fields = text.split()
    if len(fields) == 3 and fields[2].isdigit() and int(fields[2]) > 0:
        return int(fields[2])
    return DEFAULT_WMEM_MAX
