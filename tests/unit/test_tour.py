"""The ring solver (``_master/core/tour.py``): exact against brute force, unreachable pairs
never neighbours while a ring avoids them, a planted fast ring found in larger groups."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pccl_aio._master.core.tour import EXACT_MAX, improve, ring_cost, solve


def brute(cost):
    n = len(cost)
    return min(ring_cost(cost, [0, *p]) for p in itertools.permutations(range(1, n)))


def matrices(n_min=4, n_max=8):
    return st.integers(n_min, n_max).flatmap(lambda n: st.lists(
        st.lists(st.sampled_from([1.0, 2.0, 3.0, 5.0, 8.0, 13.0, math.inf]), min_size=n,
                 max_size=n), min_size=n, max_size=n))


@settings(max_examples=150, deadline=None)
@given(matrices())
def test_exact_matches_brute_force(cost):
    ring = solve(cost)
    assert sorted(ring) == list(range(len(cost))) and ring[0] == 0
    want = brute(cost)
    got = ring_cost(cost, ring)
    if math.isfinite(want[0]):
        assert got == want
    else:  # every ring crosses an unreachable pair: any ring is as bad in its bottleneck
        assert math.isinf(got[0])


def _planted(n, seed):
    """Slow links everywhere (50), a hidden ring of fast ones (500): cost = 1/bandwidth."""
    rng = random.Random(seed)
    order = list(range(n))
    rng.shuffle(order)
    bw = [[50.0 + rng.random() for _ in range(n)] for _ in range(n)]
    for k in range(n):
        bw[order[k]][order[(k + 1) % n]] = 500.0 + rng.random()
    return [[1 / b for b in row] for row in bw], order


@pytest.mark.parametrize("n", [4, 6, EXACT_MAX, EXACT_MAX + 1, 16, 24])
def test_a_planted_fast_ring_is_found(n):
    cost, order = _planted(n, seed=n)
    ring = solve(cost)
    assert ring_cost(cost, ring)[0] < 1 / 400, ring  # only fast links
    start = ring.index(order[0])
    assert ring[start:] + ring[:start] == order


def test_unreachable_pairs_are_never_neighbours_when_avoidable():
    n = 6
    cost = [[1.0] * n for _ in range(n)]
    for i, j in [(0, 1), (1, 0), (2, 3), (3, 2), (0, 4), (4, 0)]:
        cost[i][j] = math.inf
    ring = solve(cost)
    assert math.isfinite(ring_cost(cost, ring)[0])
    big = [[1.0] * 14 for _ in range(14)]
    for i in range(13):
        big[i][i + 1] = big[i + 1][i] = math.inf  # the join order is the worst ring
    assert math.isfinite(ring_cost(big, solve(big))[0])


def test_improve_never_worsens_and_small_groups():
    cost, _ = _planted(20, seed=3)
    start = list(range(20))
    assert ring_cost(cost, improve(cost, start, budget=500)) <= ring_cost(cost, start)
    assert solve([[0.0]]) == [0] and solve([[0, 1], [1, 0]]) == [0, 1]
    three = [[0, 1, 9], [9, 0, 1], [1, 9, 0]]
    assert solve(three) == [0, 1, 2]
    assert solve([[0, 9, 1], [1, 0, 9], [9, 1, 0]]) == [0, 2, 1]
    with pytest.raises(ValueError):
        solve([[0, 1]])
