"""The peer's counters (``_peer/observe/core/stats.py``): size classes and latency buckets."""

from __future__ import annotations

import pytest

from pccl_aio._peer.observe.core.stats import (
    LATENCY_BUCKETS,
    SIZE_CLASSES,
    Latency,
    PeerStats,
    size_class,
)


@pytest.mark.parametrize(("nbytes", "label"), [
    (0, "<64KiB"), (4, "<64KiB"), ((64 << 10) - 1, "<64KiB"),
    (64 << 10, "<1MiB"), ((1 << 20) - 1, "<1MiB"),
    (1 << 20, "<16MiB"), ((16 << 20) - 1, "<16MiB"),
    (16 << 20, ">=16MiB"), (1 << 34, ">=16MiB"),
])
def test_size_classes_have_exclusive_upper_bounds(nbytes: int, label: str) -> None:
    assert size_class(nbytes) == label


def test_size_classes_are_ordered_and_distinct() -> None:
    assert SIZE_CLASSES == ("<64KiB", "<1MiB", "<16MiB", ">=16MiB")


def test_latency_buckets_are_cumulative_with_inclusive_upper_bounds() -> None:
    lat = Latency()
    for s in (0.0005, 0.001, 0.003, 2.0, 1000.0):
        lat.observe(s)
    got = dict(lat.cumulative())
    assert list(got)[-1] == "+Inf" and len(got) == len(LATENCY_BUCKETS) + 1
    assert got["0.001"] == 2  # le: 0.001 itself counts in its bucket
    assert got["0.0025"] == 2 and got["0.005"] == 3
    assert got["2.5"] == 4 and got["300.0"] == 4 and got["+Inf"] == 5
    assert lat.count == 5 and lat.sum == pytest.approx(1002.0045)
    counts = [n for _, n in lat.cumulative()]
    assert counts == sorted(counts)


def test_bytes_are_counted_per_neighbour() -> None:
    st = PeerStats()
    st.moved([(2, 100, 0), (3, 0, 50)])
    st.moved([(2, 10, 0), (3, 0, 0)])
    st.moved([(5, 0, 0), (2, 0, 7)])
    assert st.sent == {2: 110} and st.received == {3: 50, 2: 7}
    assert set(st.latency) == set(SIZE_CLASSES)
