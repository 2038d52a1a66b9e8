"""``withheld.VoteTimer`` (issue 31, point 6): only a lone holdout that waits on nothing is
kicked, only after the timeout, and never without one."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from pccl_aio._master.core.deadlock import Item
from pccl_aio._master.core.withheld import VoteTimer


class Board:
    def __init__(self, members: dict[int, int],
                 waits: list[tuple[Item, Collection[int], Collection[int]]]) -> None:
        self._members, self._waits = members, waits

    def members(self) -> dict[int, int]:
        return self._members

    def waits(self) -> Iterable[tuple[Item, Collection[int], Collection[int]]]:
        return self._waits


SYNC: Item = ("sync", 0, 0)
THREE = {1: 0, 2: 0, 3: 0}


def test_a_lone_holdout_is_kicked_once_its_time_is_up():
    t = VoteTimer(5.0)
    board = Board(THREE, [(SYNC, {1, 2}, {1, 2})])
    assert t.check(board, 100.0) == [] and t.check(board, 104.9) == []
    [(who, why)] = t.check(board, 105.0)
    assert who == 3 and "sync_shared_state" in why and "5 s" in why


def test_the_clock_restarts_for_another_holdout_and_after_the_vote_ends():
    t = VoteTimer(5.0)
    t.check(Board(THREE, [(SYNC, {1, 2}, {1, 2})]), 100.0)
    assert t.check(Board(THREE, [(SYNC, {1, 3}, {1, 3})]), 104.0) == []  # 2 holds out now
    assert t.check(Board(THREE, [(SYNC, {1, 3}, {1, 3})]), 108.0) == []
    t.check(Board(THREE, []), 108.5)  # the vote ended
    assert t.check(Board(THREE, [(SYNC, {1, 3}, {1, 3})]), 109.0) == []
    assert [w for w, _ in t.check(Board(THREE, [(SYNC, {1, 3}, {1, 3})]), 114.0)] == [2]


def test_no_kick_for_two_holdouts_a_waiting_holdout_a_lone_member_or_no_timeout():
    cases = [
        Board({1: 0, 2: 0, 3: 0, 4: 0}, [(SYNC, {1, 2}, {1, 2})]),  # two missing
        Board(THREE, [(SYNC, {1, 2}, {1, 2}), (("collective", 0, 7), {3}, {3})]),  # 3 waits
        Board({1: 0}, [(SYNC, set(), set())]),  # one member: nothing to hold out from
        Board(THREE, [(SYNC, {1, 2}, set())]),  # cast, but nobody waits in it
    ]
    for board in cases:
        t = VoteTimer(1.0)
        assert t.check(board, 0.0) == [] and t.check(board, 50.0) == []
    off = VoteTimer(None)
    board = Board(THREE, [(SYNC, {1, 2}, {1, 2})])
    assert off.check(board, 0.0) == [] and off.check(board, 1e9) == []


def test_global_votes_count_every_member_and_group_votes_their_group():
    members = {1: 0, 2: 0, 3: 1, 4: 1}
    t = VoteTimer(1.0)
    pending: Item = ("pending", 0, 0)
    group1: Item = ("collective", 1, 9)
    board = Board(members, [(pending, {1, 2, 3}, {1, 2, 3}), (group1, {3}, {3})])
    t.check(board, 0.0)
    assert [w for w, _ in t.check(board, 1.0)] == [4]  # once, for either wait
