"""The stash of early frames and this peer's tickets (sans-IO)."""

from __future__ import annotations

import pytest

from pccl_aio._peer.data.core.stash import FRAME_MAX, Stash
from pccl_aio._peer.data.core.tickets import Tickets
from pccl_aio._wire import messages as m

pytestmark = pytest.mark.timeout(30)


def frame(n: int, peer: int = 1) -> tuple[int, int, int, memoryview, float, float]:
    return (peer, 0, 0, memoryview(bytearray(n)), 0.0, 0.0)


def test_frames_of_a_reserved_seq_are_kept_within_the_budget_and_taken_once() -> None:
    s = Stash(budget=100)
    assert not s.wants(5)
    s.reserve(5)
    assert s.wants(5)
    buf = s.room(5, 60)
    assert buf is not None and len(buf) == 60 and s.used == 60
    s.keep(5, frame(60))
    assert s.room(5, 41) is None  # over budget: the ticket is spoiled, what it held dropped
    assert s.spoiled == {5} and not s.wants(5) and s.used == 0
    s.reserve(6)
    assert s.room(6, FRAME_MAX + 1) is None and 6 in s.spoiled  # longer than a segment
    s.reserve(7)
    assert s.room(7, 40) is not None
    s.keep(7, frame(40))
    assert [len(f[3]) for f in s.take(7)] == [40] and s.used == 0 and not s.wants(7)
    assert s.take(7) == []


def test_a_frame_arriving_after_its_seq_was_voided_is_dropped_and_released() -> None:
    s = Stash(budget=100)
    s.reserve(3)
    assert s.room(3, 30) is not None  # being received when the membership changes
    s.void()
    s.keep(3, frame(30))
    assert s.used == 0 and not s.wants(3)


def test_tickets_follow_the_verdicts_evictions_and_memberships() -> None:
    s = Stash()
    reserved: list[int] = []

    def reserve(seq: int) -> None:
        reserved.append(seq)
        s.reserve(seq)

    t = Tickets(s, reserve)
    ring = [m.PeerAddr(1, "127.0.0.1", 1), m.PeerAddr(2, "127.0.0.1", 2)]
    ms = m.Membership(4, 2, 1, 2, ring)
    t.issued(m.CollectiveComplete(7, 10, 11, 4))
    t.issued(m.CollectiveComplete(8, 12, 13, 4))
    assert reserved == [11, 13] and len(t) == 2
    t.issued(m.CollectiveComplete(9, 14, 0, 0, [8]))  # no ticket; tag 8's evicted
    assert len(t) == 1 and not s.wants(13)
    assert t.use(7, ms) == (11, False)
    assert t.use(7, ms) == (0, False)  # used once
    t.issued(m.CollectiveComplete(7, 11, 15, 4))
    assert t.use(7, m.Membership(5, 2, 1, 2, ring)) == (0, False)  # another ring: void
    assert not s.wants(15)
    t.issued(m.CollectiveComplete(7, 16, 17, 4))
    s.spoil(17)
    assert t.use(7, ms) == (17, True)  # spoiled: the vote says so, no early start
    assert s.spoiled == set()
    t.issued(m.CollectiveComplete(7, 18, 19, 4))
    t.void()
    assert len(t) == 0 and not s.wants(19)
