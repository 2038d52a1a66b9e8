"""A peer's counters: what its ``/metrics`` shows and its log lines count (sans-IO).

Plain ints and floats, changed once per collective, vote or outage (never per frame), so
counting costs nothing measurable whether or not metrics are served; ``_peer/observe/metrics.py``
reads them at scrape time. Bytes are payload bytes on the wire (quantized: the codes),
frame headers not included.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection
from typing import Final

__all__ = ["FORMER", "LATENCY_BUCKETS", "SIZE_CLASSES", "Latency", "PeerStats", "add_traffic",
           "size_class"]

FORMER: Final = -1  # the key of the bytes of every neighbour that left the ring, together

# (upper bound in bytes, label): an all-reduce's buffer size (dst's bytes, unquantized)
_CLASSES: Final = ((64 << 10, "<64KiB"), (1 << 20, "<1MiB"), (16 << 20, "<16MiB"))
SIZE_CLASSES: Final = (*(label for _, label in _CLASSES), ">=16MiB")
_BOUNDS: Final = [bound for bound, _ in _CLASSES]

# seconds, from a 4 KiB all-reduce on loopback to a large one over a slow WAN link
LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                          2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def size_class(nbytes: int) -> str:
    """The size class of an all-reduce of ``nbytes`` (one of ``SIZE_CLASSES``)."""
    return SIZE_CLASSES[bisect.bisect_right(_BOUNDS, nbytes)]


class Latency:
    """A histogram of all-reduce latencies for one size class (``LATENCY_BUCKETS``)."""

    __slots__ = ("buckets", "count", "sum")

    def __init__(self) -> None:
        self.buckets = [0] * len(LATENCY_BUCKETS)  # per bucket, not cumulative
        self.count = 0
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        i = bisect.bisect_left(LATENCY_BUCKETS, seconds)
        if i < len(self.buckets):
            self.buckets[i] += 1
        self.count += 1
        self.sum += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus buckets: (upper bound, count at or below it), ``+Inf`` last."""
        out, n = [], 0
        for bound, k in zip(LATENCY_BUCKETS, self.buckets):
            n += k
            out.append((repr(bound), n))
        out.append(("+Inf", self.count))
        return out


class PeerStats:
    """One communicator's counters since it was created."""

    __slots__ = ("aborted", "completed", "failed", "latency", "received", "retries", "sent")

    def __init__(self) -> None:
        self.sent: dict[int, int] = {}  # neighbour peer id -> payload bytes sent to it
        self.received: dict[int, int] = {}  # ... received from it
        self.latency: dict[str, Latency] = {c: Latency() for c in SIZE_CLASSES}
        self.completed = 0  # all-reduce attempts completed
        self.aborted = 0  # ... aborted for the group (``PeerLostError``: a peer or the master lost)
        self.failed = 0  # ... ended otherwise (rejected, timed out, communicator closed)
        self.retries = 0  # relaunches by ``all_reduce_multiple_with_retry``

    def forget(self, ring: Collection[int]) -> None:
        """Fold the counts of neighbours no longer in ``ring`` into ``FORMER`` (totals never
        go down, and the entries do not grow with every peer that ever joined)."""
        for counts in (self.sent, self.received):
            for peer in [p for p in counts if p not in ring and p != FORMER]:
                counts[FORMER] = counts.get(FORMER, 0) + counts.pop(peer)

    def moved(self, traffic: list[tuple[int, int, int]]) -> None:
        """One attempt's bytes: (peer id, sent to it, received from it) each."""
        add_traffic(self.sent, self.received, traffic)


def add_traffic(sent: dict[int, int], received: dict[int, int],
                traffic: list[tuple[int, int, int]]) -> None:
    """Add (peer id, bytes sent to it, bytes received from it) to the per-peer counts (a
    zero adds no entry)."""
    for peer, tx, rx in traffic:
        if tx:
            sent[peer] = sent.get(peer, 0) + tx
        if rx:
            received[peer] = received.get(peer, 0) + rx
