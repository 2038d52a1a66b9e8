"""Bruck's all-gather as laid out by ``core/bruck.py``, simulated without sockets: every rank
ends with every block exactly once, in ceil(log2 P) rounds, each round's frame built only from
blocks its sender already holds."""

from __future__ import annotations

import pytest

from pccl_aio._peer.data.core.bruck import BRUCK, BruckPlan, chosen
from pccl_aio._peer.data.core.gather import GATHER_MAX

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize("world", [*range(2, 41), 64, 100, 1024])
def test_every_block_arrives_once_in_ceil_log2_rounds(world):
    n = 3
    plans = [BruckPlan(r, world, n) for r in range(world)]
    held = [{0: r} for r in range(world)]  # rank -> {rotated slot: origin rank}
    rounds = plans[0].rounds
    assert rounds == (world - 1).bit_length() and (1 << rounds) >= world > (1 << (rounds - 1))
    for k in range(rounds):
        sent = []
        for r, p in enumerate(plans):
            phase, off, length = p.frame(k)
            blocks = length // n
            assert phase == BRUCK + k and off == (1 << k) * n
            assert all(j in held[r] for j in range(blocks))  # only what it holds
            sent.append((p.to(k), off // n, [held[r][j] for j in range(blocks)]))
        for to, first, origins in sent:
            assert plans[to].sender(k) == (to + (1 << k)) % world
            for j, origin in enumerate(origins):
                assert first + j not in held[to]  # nothing lands twice
                held[to][first + j] = origin
    for r, p in enumerate(plans):
        assert held[r] == {p.slot(o) // n: o for o in range(world)}  # all, rotated


def test_chosen_only_for_small_unquantized_buffers_from_four_peers():
    assert chosen(GATHER_MAX, 4, False) and chosen(1, 1000, False)
    assert not chosen(GATHER_MAX + 1, 8, False)
    assert not chosen(100, 3, False) and not chosen(100, 8, True) and not chosen(0, 8, False)
    assert BruckPlan(0, 8, 4).round_of(BRUCK + 3) == -1 and BruckPlan(0, 8, 4).round_of(2) == -1
