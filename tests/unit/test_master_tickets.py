"""Tickets: a verdict hands out the seq of the tag's next collective, which the group may run
before the master's start; any membership change voids them (sans-IO master)."""

from __future__ import annotations

import pytest

from pccl_aio._master.core import collectives as mc
from pccl_aio._master.core import state as ms
from pccl_aio._wire import messages as m

from .master_harness import Harness

pytestmark = pytest.mark.timeout(30)


def complete(h: Harness, conns: list[int], tag: int) -> m.CollectiveComplete:
    """Run ``tag`` once on ``conns`` (plain votes) and return the verdict they all got."""
    seq = h.start(conns, tag)
    acts: list[ms.Action] = []
    for c in conns:
        acts += h.send(c, m.CollectiveDone(tag, seq, True))
    verdicts = [a.msg for a in acts if isinstance(a, ms.Send)]
    assert len(verdicts) == len(conns) and all(v == verdicts[0] for v in verdicts), acts
    done = verdicts[0]
    assert isinstance(done, m.CollectiveComplete)
    return done


def early(tag: int, seq: int, spoiled: bool = False) -> m.CollectiveInit:
    return m.CollectiveInit(tag, 8, 10, 0, seq=seq, spoiled=spoiled)


def starts(acts: list[ms.Action]) -> dict[int, int]:
    return {a.conn: a.msg.seq for a in acts
            if isinstance(a, ms.Send) and isinstance(a.msg, m.CollectiveStart)}


def test_a_verdict_hands_out_the_next_seq_and_early_voters_run_as_it() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    done = complete(h, [a, b, c], 7)
    assert done.next_seq == done.seq + 1 and done.epoch == h.st.epoch
    ticket = done.next_seq
    # a and c start early (their data moves); b votes without the ticket (it lost it, say)
    assert h.send(a, early(7, ticket)) == []
    assert h.send(c, early(7, ticket)) == []
    # an early voter may finish before the last vote arrives: counted, nothing sent yet
    assert h.send(a, m.CollectiveDone(7, ticket, True)) == []
    acts = h.send(b, m.CollectiveInit(7, 8, 10, 0))
    assert starts(acts) == {a: ticket, b: ticket, c: ticket}  # a confirmation for the early
    assert h.send(b, m.CollectiveDone(7, ticket, True)) == []
    acts = h.send(c, m.CollectiveDone(7, ticket, True))
    verdicts = {x.conn: x.msg for x in acts if isinstance(x, ms.Send)}
    assert set(verdicts) == {a, b, c}
    assert all(isinstance(v, m.CollectiveComplete) and v.seq == ticket for v in verdicts.values())
    assert len({v.next_seq for v in verdicts.values()}) == 1  # the same next ticket for all


def test_a_membership_change_voids_the_tickets_and_early_voters_start_over() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    ticket = complete(h, [a, b, c], 7).next_seq
    assert h.send(a, early(7, ticket)) == []
    h.disconnect(c)  # a new epoch: the ring the ticket was for is gone
    acts = h.send(b, early(7, ticket))  # b has not seen the new membership yet
    seqs = starts(acts)
    assert set(seqs) == {a, b} and len(set(seqs.values())) == 1
    assert seqs[a] > ticket  # a fresh seq: a and b drop their early attempt and follow it
    # a stale report of the void attempt changes nothing
    assert h.send(a, m.CollectiveDone(7, ticket, True)) == []
    assert h.st.running(0) == {7: seqs[a]}


def test_a_departure_while_early_voters_wait_restarts_them_on_the_new_ring() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    ticket = complete(h, [a, b, c], 3).next_seq
    assert h.send(a, early(3, ticket)) == []
    assert h.send(b, early(3, ticket)) == []
    acts = h.disconnect(c)  # the last voter is gone: the op starts with the two left
    seqs = starts(acts)
    assert set(seqs) == {a, b} and seqs[a] == seqs[b] != ticket


def test_a_spoiled_ticket_makes_a_fresh_seq_for_everyone() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    ticket = complete(h, [a, b], 1).next_seq
    assert h.send(a, early(1, ticket)) == []
    acts = h.send(b, early(1, ticket, spoiled=True))  # b dropped frames of it: no room
    seqs = starts(acts)
    assert set(seqs) == {a, b} and seqs[a] == seqs[b] != ticket


def test_an_early_attempt_that_fails_before_the_start_aborts_the_vote() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    ticket = complete(h, [a, b, c], 5).next_seq
    assert h.send(a, early(5, ticket)) == []
    assert h.send(b, early(5, ticket)) == []
    acts = h.send(a, m.CollectiveDone(5, ticket, False, "cancelled by the caller"))
    aborts = {x.conn: x.msg for x in acts if isinstance(x, ms.Send)}
    assert set(aborts) == {a, b}
    assert all(isinstance(v, m.CollectiveAbort) and v.seq == 0 for v in aborts.values())
    # c votes late with the ticket: a new round, with a fresh seq once all voted again
    assert h.send(c, early(5, ticket)) == []
    acts = h.init([a, b], 5)
    seqs = starts(acts)
    assert set(seqs) == {a, b, c} and len(set(seqs.values())) == 1 and seqs[a] != ticket


def test_a_ticket_is_not_honoured_in_another_group_or_for_another_tag() -> None:
    h = Harness()
    a, b, c, d = h.run(0, 0, 1, 1)
    ticket = complete(h, [a, b], 1).next_seq
    # group 1 claims group 0's ticket for its own tag 1: not early, a fresh seq
    assert h.send(c, early(1, ticket)) == []
    seqs = starts(h.send(d, early(1, ticket)))
    assert set(seqs) == {c, d} and seqs[c] != ticket
    # tag 2 of group 0 with tag 1's ticket: a fresh seq too; tag 1 keeps its ticket
    assert h.send(a, early(2, ticket)) == []
    assert starts(h.send(b, early(2, ticket)))[a] != ticket
    assert h.start([a, b], 1) == ticket


def test_tickets_are_bounded_and_evictions_are_announced(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mc, "MAX_TICKETS", 2)
    h = Harness()
    a, b = h.run(0, 0)
    done = [complete(h, [a, b], tag) for tag in (10, 11, 12, 13)]
    assert [d.evicted for d in done] == [[], [], [10], [11]]
    # tag 10's ticket is gone: its next run gets a fresh seq even if both claim the old one
    assert h.send(a, early(10, done[0].next_seq)) == []
    assert starts(h.send(b, early(10, done[0].next_seq)))[a] != done[0].next_seq
