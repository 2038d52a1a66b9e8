"""The ring order that fits the network: an asymmetric bottleneck travelling-salesman tour.

A ring all-reduce moves the same bytes over every link of the ring at once, so its time is
set by the slowest link: the cost of a ring is ``(max edge cost, sum of edge costs)``, compared
in that order (the sum breaks ties and shortens the pipeline's latency). ``cost[i][j]`` is the
cost of sending from ``i`` to ``j`` (``math.inf``: ``i`` cannot reach ``j``; such an edge is
never chosen while any ring avoids it).

``solve`` is exact up to ``EXACT_MAX`` peers (the smallest feasible bottleneck by a
Hamiltonian-cycle check over subsets, then Held-Karp for the least sum under it) and beyond
that a greedy start improved by Or-opt moves (a segment of 1-3 peers moved elsewhere) and
segment reversals until no move helps or a budget of evaluations is spent; ``improve`` goes on
from a given ring, for background refinement. Pure functions, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["EXACT_MAX", "ring_cost", "solve", "improve"]

EXACT_MAX = 11
Matrix = Sequence[Sequence[float]]
Cost = tuple[float, float]


def ring_cost(cost: Matrix, ring: Sequence[int]) -> Cost:
    """(bottleneck, sum) of the ring's edges ``ring[k] -> ring[k + 1]`` (wrapping)."""
    n = len(ring)
    if n < 2:
        return (0.0, 0.0)
    edges = [cost[ring[k]][ring[(k + 1) % n]] for k in range(n)]
    return (max(edges), math.fsum(edges))


def _hamiltonian(n: int, ok: list[list[bool]]) -> bool:
    """Is there a cycle through all ``n`` nodes using only edges with ``ok[i][j]``?"""
    full = (1 << n) - 1
    reach = [0] * (1 << n)  # reach[mask]: bit j set if a path 0 -> ... -> j covers mask
    reach[1] = 1
    for mask in range(1, full + 1, 2):  # every mask holds node 0
        ends = reach[mask]
        if not ends:
            continue
        for j in range(n):
            if ends >> j & 1:
                for k in range(1, n):
                    if not mask >> k & 1 and ok[j][k]:
                        reach[mask | 1 << k] |= 1 << k
    ends = reach[full]
    return any(ends >> j & 1 and ok[j][0] for j in range(n))


def _held_karp(n: int, cost: Matrix, limit: float) -> list[int]:
    """The least-sum cycle from node 0 over edges of cost <= ``limit`` (one exists)."""
    full = (1 << n) - 1
    best: dict[tuple[int, int], tuple[float, int]] = {(1, 0): (0.0, -1)}
    for mask in range(1, full + 1, 2):
        for j in range(n):
            entry = best.get((mask, j))
            if entry is None:
                continue
            for k in range(1, n):
                c = cost[j][k]
                if mask >> k & 1 or c > limit:
                    continue
                key, total = (mask | 1 << k, k), entry[0] + c
                if key not in best or total < best[key][0]:
                    best[key] = (total, j)
    last = min((j for j in range(n) if (full, j) in best and cost[j][0] <= limit),
               key=lambda j: best[(full, j)][0] + cost[j][0])
    ring, mask, j = [], full, last
    while j != -1:
        ring.append(j)
        _, prev = best[(mask, j)]
        mask, j = mask & ~(1 << j), prev
    return ring[::-1]


def _exact(cost: Matrix) -> list[int]:
    n = len(cost)
    finite = sorted({cost[i][j] for i in range(n) for j in range(n) if i != j
                     and math.isfinite(cost[i][j])})
    lo, hi = 0, len(finite) - 1
    if not finite or not _hamiltonian(n, [[i != j and cost[i][j] <= finite[hi]
                                           for j in range(n)] for i in range(n)]):
        return _heuristic(cost, 200_000)  # no ring avoids an unreachable pair: the least bad
    while lo < hi:  # the smallest bottleneck that still admits a ring
        mid = (lo + hi) // 2
        if _hamiltonian(n, [[i != j and cost[i][j] <= finite[mid] for j in range(n)]
                            for i in range(n)]):
            hi = mid
        else:
            lo = mid + 1
    return _held_karp(n, cost, finite[lo])


def _greedy(cost: Matrix) -> list[int]:
    n = len(cost)
    ring, left = [0], set(range(1, n))
    while left:
        here = ring[-1]
        nxt = min(left, key=lambda k: (cost[here][k], k))
        ring.append(nxt)
        left.remove(nxt)
    return ring


def improve(cost: Matrix, ring: Sequence[int], budget: int = 200_000) -> list[int]:
    """``ring`` improved by Or-opt moves and reversals until none helps or about ``budget``
    ring evaluations were spent (overshooting by at most one segment's or one reversal row's
    moves); never worse than ``ring``."""
    best, best_cost = list(ring), ring_cost(cost, ring)
    n, spent, better = len(best), 0, True
    while better and spent < budget:
        better = False
        for length in (1, 2, 3):
            for start in range(n):
                seg = [best[(start + d) % n] for d in range(length)]
                if length >= n - 1:
                    break
                rest = [p for p in best if p not in seg]
                if spent >= budget:  # checked per segment: a pass at n = 256 is ~10^8 steps
                    return best
                for at in range(1, len(rest) + 1):
                    for piece in (seg, seg[::-1]):
                        cand = rest[:at] + piece + rest[at:]
                        spent += 1
                        c = ring_cost(cost, cand)
                        if c < best_cost:
                            best, best_cost, better = cand, c, True
        for i in range(n - 1):  # reversals of best[i..j]
            if spent >= budget:
                return best
            for j in range(i + 1, n):
                cand = best[:i] + best[i:j + 1][::-1] + best[j + 1:]
                spent += 1
                c = ring_cost(cost, cand)
                if c < best_cost:
                    best, best_cost, better = cand, c, True
    return best


def _heuristic(cost: Matrix, budget: int) -> list[int]:
    return improve(cost, _greedy(cost), budget)


def solve(cost: Matrix, budget: int = 200_000) -> list[int]:
    """The best ring of nodes ``0 .. n-1`` under ``cost`` (an n x n matrix; the diagonal is
    ignored), starting at node 0: exact up to ``EXACT_MAX`` nodes, else a heuristic with
    ``budget`` evaluations."""
    n = len(cost)
    if any(len(row) != n for row in cost):
        raise ValueError("the cost matrix must be square")
    if n <= 3:  # one ring (up to direction); pick the cheaper direction
        rings = [list(range(n)), [0, *range(n - 1, 0, -1)]] if n == 3 else [list(range(n))]
        return min(rings, key=lambda r: ring_cost(cost, r))
    if n <= EXACT_MAX:
        return _exact(cost)
    return _heuristic(cost, budget)
