"""The sans-IO ring all-reduce plan (``_ring``), run in memory for W ranks.

Every rank sends its successor only what its ``RingPlan`` says and receives in a random
(causal) order; at the end each rank must hold the exact sum and must have received exactly
the (phase, offset, length) segments of ``expected()``, each once.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pccl_aio._peer.data.core import ring as _ring

Msg = tuple[int, int, int, bytes]  # (destination rank, phase, byte offset, payload)


def simulate(world: int, inputs: list[np.ndarray], seg_elems: int,
             rng: random.Random, grain: int = 1) -> list[np.ndarray]:
    """Run the plan for ``world`` ranks on ``inputs`` (one 1-D array per rank), SUM."""
    count, dtype = len(inputs[0]), inputs[0].dtype
    item = dtype.itemsize
    plans = [_ring.RingPlan(r, world, count, item, seg_elems, grain) for r in range(world)]
    bufs = [bytearray(x.tobytes()) for x in inputs]
    expected = [p.expected() for p in plans]
    flight: list[Msg] = []

    def send(src: int, phase: int, off: int, n: int) -> None:
        flight.append(((src + 1) % world, phase, off, bytes(bufs[src][off : off + n])))

    for r, p in enumerate(plans):
        assert p.first_sends() == p.chunk_segments(r)
        for off, n in p.first_sends():
            send(r, _ring.RS, off, n)
    while flight:
        dst, phase, off, payload = flight.pop(rng.randrange(len(flight)))
        n = len(payload)
        want = expected[dst].pop((phase, off))  # KeyError: unexpected or duplicate segment
        assert want == n, (dst, phase, off, want, n)
        view = np.frombuffer(bufs[dst], dtype=dtype)
        lo = off // item
        if phase == _ring.RS:
            view[lo : lo + n // item] += np.frombuffer(payload, dtype=dtype)
        else:
            bufs[dst][off : off + n] = payload
        final, fwd = plans[dst].after_receive(phase, off)
        if phase == _ring.AG:
            assert final is False
        if final:
            assert plans[dst].chunk_of(off) == plans[dst].owned
            assert fwd == _ring.AG
        if fwd is not None:
            send(dst, fwd, off, n)
    for r in range(world):
        assert expected[r] == {}, f"rank {r} never received {sorted(expected[r])}"
    return [np.frombuffer(b, dtype=dtype) for b in bufs]


def _counts(world: int) -> list[int]:
    return sorted({0, 1, world - 1, world, world + 1, 2 * world + 1, 97, 1001})


CASES = [(w, c, s) for w in range(2, 8) for c in _counts(w) for s in (1, 3, 64)]


@pytest.mark.parametrize(("world", "count", "seg"), CASES)
def test_ring_sum_is_exact_on_every_rank(world: int, count: int, seg: int) -> None:
    rng = random.Random(world * 100_003 + count * 7 + seg)
    nprng = np.random.default_rng(rng.randrange(2**32))
    inputs = [nprng.integers(-(10**9), 10**9, size=count, dtype=np.int64) for _ in range(world)]
    total = np.sum(inputs, axis=0, dtype=np.int64)
    for out in simulate(world, inputs, seg, rng):
        assert np.array_equal(out, total)
    for out in simulate(world, inputs, seg, rng, grain=2):  # the plan of 4-bit codes
        assert np.array_equal(out, total)


@pytest.mark.parametrize("world", [2, 3, 5, 7])
def test_ring_large_uneven_count_with_several_delivery_orders(world: int) -> None:
    count = 20_011
    nprng = np.random.default_rng(world)
    inputs = [nprng.integers(-1000, 1000, size=count, dtype=np.int32) for _ in range(world)]
    total = np.sum(inputs, axis=0, dtype=np.int32)
    for seed in range(2):
        for out in simulate(world, inputs, 1500, random.Random(seed)):
            assert np.array_equal(out, total)


@pytest.mark.parametrize("world", [3, 4, 6])
def test_ring_float_results_are_byte_identical_on_every_rank(world: int) -> None:
    """Each chunk is reduced once, by its owner, and forwarded verbatim."""
    nprng = np.random.default_rng(world)
    inputs = [nprng.random(333, dtype=np.float32) for _ in range(world)]
    outs = simulate(world, inputs, 17, random.Random(world))
    for out in outs[1:]:
        assert out.tobytes() == outs[0].tobytes()
    np.testing.assert_allclose(outs[0], np.sum(inputs, axis=0), rtol=1e-5)


def test_simulation_detects_a_wrong_plan() -> None:
    """The harness is not vacuous: a plan that forwards one hop too far is caught."""
    orig = _ring.RingPlan.after_receive

    def too_far(self: _ring.RingPlan, phase: int, off: int) -> tuple[bool, int | None]:
        final, fwd = orig(self, phase, off)
        return final, (_ring.AG if phase == _ring.AG else fwd)

    inputs = [np.arange(10, dtype=np.int64) for _ in range(3)]
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(_ring.RingPlan, "after_receive", too_far)
        with pytest.raises((KeyError, AssertionError)):
            simulate(3, inputs, 2, random.Random(0))
    finally:
        mp.undo()


# ---- chunk_bounds, segments, chunk_of, expected -------------------------------------------------


@given(count=st.integers(0, 10**6), world=st.integers(1, 64))
def test_chunk_bounds_properties(count: int, world: int) -> None:
    b = _ring.chunk_bounds(count, world)
    assert len(b) == world + 1
    assert b[0] == 0 and b[-1] == count
    sizes = [hi - lo for lo, hi in itertools.pairwise(b)]
    assert all(s in (count // world, count // world + 1) for s in sizes)
    assert sizes == sorted(sizes, reverse=True)  # the remainder goes to the first chunks
    assert sum(s == count // world + 1 for s in sizes) == count % world


@given(count=st.integers(0, 10**6), world=st.integers(1, 64), grain=st.sampled_from([2, 3]))
def test_chunk_bounds_with_a_grain_start_on_whole_units(count: int, world: int,
                                                       grain: int) -> None:
    """Chunks of whole ``grain`` units (4-bit codes: grain 2, whole bytes), only the last
    nonempty one cut short at ``count``; grain 1 is the plain split."""
    b = _ring.chunk_bounds(count, world, grain)
    assert len(b) == world + 1 and b[0] == 0 and b[-1] == count
    assert all(x % grain == 0 for x in b[:-1] if x < count)
    units = [-(-(hi - lo) // grain) for lo, hi in itertools.pairwise(b)]
    assert units == [hi - lo for lo, hi in itertools.pairwise(
        _ring.chunk_bounds(-(-count // grain), world))]
    assert _ring.chunk_bounds(count, world, 1) == _ring.chunk_bounds(count, world)


def test_chunk_bounds_examples() -> None:
    assert _ring.chunk_bounds(7, 3, 2) == [0, 4, 6, 7]
    assert _ring.chunk_bounds(3, 4, 2) == [0, 2, 3, 3, 3]
    assert _ring.chunk_bounds(10, 3) == [0, 4, 7, 10]
    assert _ring.chunk_bounds(2, 4) == [0, 1, 2, 2, 2]
    assert _ring.chunk_bounds(0, 2) == [0, 0, 0]
    assert _ring.chunk_bounds(6, 1) == [0, 6]


@given(lo=st.integers(0, 1000), n=st.integers(0, 1000), seg=st.integers(1, 300))
def test_segments_tile_the_range(lo: int, n: int, seg: int) -> None:
    parts = _ring.segments(lo, lo + n, seg)
    pos = lo
    for start, length in parts:
        assert start == pos and 1 <= length <= seg
        pos += length
    assert pos == lo + n
    assert len(parts) == -(-n // seg)


@given(count=st.integers(0, 200), world=st.integers(1, 9), item=st.sampled_from([1, 2, 4, 8]),
       rank_seed=st.integers(0, 1000), seg=st.integers(0, 50))
def test_plan_geometry(count: int, world: int, item: int, rank_seed: int, seg: int) -> None:
    rank = rank_seed % world
    p = _ring.RingPlan(rank, world, count, item, seg)
    assert p.owned == (rank + 1) % world and p.seg == max(1, seg)
    b = p.bounds
    for e in range(count):
        c = p.chunk_of(e * item + (item - 1))  # any byte of element e
        assert b[c] <= e < b[c + 1]
    exp = p.expected()
    assert all(n > 0 and n % item == 0 for n in exp.values())
    rs = sum(n for (ph, _), n in exp.items() if ph == _ring.RS)
    ag = sum(n for (ph, _), n in exp.items() if ph == _ring.AG)
    assert rs == (count - (b[rank + 1] - b[rank])) * item
    assert ag == (count - (b[p.owned + 1] - b[p.owned])) * item


@given(count=st.integers(0, 200), world=st.integers(1, 9), item=st.sampled_from([2, 4, 8]),
       rank_seed=st.integers(0, 1000), seg=st.integers(0, 50))
def test_plan_with_grain_2_cuts_every_segment_at_an_even_element(
        count: int, world: int, item: int, rank_seed: int, seg: int) -> None:
    p = _ring.RingPlan(rank_seed % world, world, count, item, seg, grain=2)
    assert p.seg == max(2, seg // 2 * 2)
    for (_, off), n in p.expected().items():
        assert off // item % 2 == 0  # starts on an even element: a whole byte of codes
        assert n // item % 2 == 0 or off + n == count * item  # only the very last is odd


@pytest.mark.parametrize(("rank", "world"), [(-1, 3), (3, 3), (0, 0)])
def test_plan_rejects_a_rank_outside_the_ring(rank: int, world: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        _ring.RingPlan(rank, world, 10, 4, 8)
