"""The life cycle of a collective (``core/phase.py``): every legal move passes, every other
one raises, the table and the helpers agree. Sans-IO: no loop, no sockets."""

from __future__ import annotations

import itertools

import pytest

from pccl_aio._peer.data.core import phase as ph
from pccl_aio._peer.data.core.phase import IllegalMove, Phase

pytestmark = pytest.mark.timeout(10)

V, E, ED, R, D, X = (Phase.VOTING, Phase.EARLY, Phase.EARLY_DONE, Phase.RUNNING,
                     Phase.DATA_DONE, Phase.ENDED)
LEGAL = {
    (V, E), (V, R), (V, X),  # an early start on a ticket; the master's start; a verdict
    (E, R), (E, ED), (E, X),  # confirmed or replaced; the data done early; ended
    (ED, D), (ED, R), (ED, X),  # confirmed; replaced by a fresh attempt; ended
    (R, D), (R, X),
    (D, X),
}


@pytest.mark.parametrize("now,to", list(itertools.product(Phase, Phase)),
                         ids=lambda p: p.name)
def test_every_move_is_legal_exactly_when_the_table_says(now, to):
    if (now, to) in LEGAL:
        assert ph.move(now, to) is to
    else:
        with pytest.raises(IllegalMove, match=f"{now.name} to {to.name}"):
            ph.move(now, to)


def test_the_table_is_the_one_tested():
    assert {(a, b) for a, tos in ph.MOVES.items() for b in tos} == LEGAL


def test_nothing_leaves_ended_and_every_phase_can_end():
    assert not ph.MOVES[X]
    assert all(X in ph.MOVES[p] for p in Phase if p is not X)


# each helper's legal moves; from every other phase it refuses
HELPERS = {"the master's start confirms an early attempt": (ph.confirmed, {E: R, ED: D}),
           "the data finishing moves a running attempt": (ph.finished, {E: ED, R: D})}


@pytest.mark.parametrize("helper", HELPERS)
@pytest.mark.parametrize("now", list(Phase))
def test_each_helper_moves_only_its_own_phases(helper, now):
    move, table = HELPERS[helper]
    if now in table:
        assert move(now) is table[now]
    else:
        with pytest.raises(IllegalMove):
            move(now)


def test_the_groups_partition_the_started_phases():
    assert ph.EARLY | {R, D} == ph.STARTED and {ED, D} == ph.DONE
    assert V not in ph.STARTED and X not in ph.STARTED
