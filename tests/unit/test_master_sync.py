"""The shared-state sync barrier of the sans-IO master (``SyncBarrier`` inside ``MasterState``).

A group's sync starts when every accepted member voted; the election (tested on its own in
``test_election.py``) decides revision, plans and kicks; the sync completes when every
participant still present reported ``SyncDone``. Harness: ``master_harness``.
"""

from __future__ import annotations

import pytest

from pccl_aio._master.core import state as ms
from pccl_aio._master.core.barrier import SyncBarrier
from pccl_aio._types import SyncStrategy
from pccl_aio._wire import messages as m
from tests.unit.master_harness import (
    DEPARTURES,
    Harness,
    assert_kicked,
    closes,
    departure,
    digest,
    index_of,
    msgs,
    run_with_silent,
    sent_to,
    sync_vote,
)

RO = SyncStrategy.RECEIVE_ONLY


def addr(conn: int, state_port: int = 0) -> m.PeerAddr:
    return m.PeerAddr(conn, "127.0.0.1", 40000 + conn, state_port)


def kinds(acts: list[ms.Action]) -> list[tuple[int, type]]:
    """(conn, message type or Close) of every action."""
    return [(a.conn, type(a.msg) if isinstance(a, ms.Send) else ms.Close) for a in acts]


def plans(acts: list[ms.Action]) -> dict[int, m.SyncPlan]:
    out = {}
    for conn, v in msgs(acts, m.SyncPlan).items():
        (out[conn],) = v
        assert isinstance(out[conn], m.SyncPlan)
    return out


def finish(h: Harness, conns: list[int]) -> list[ms.Action]:
    """Every peer of ``conns`` reports SyncDone; returns all actions."""
    acts: list[ms.Action] = []
    for c in conns:
        acts += h.send(c, m.SyncDone(True))
    return acts


def synced(h: Harness, conns: list[int], revision: int = 0) -> None:
    """``conns`` (the whole group) sync once, successfully, at ``revision``."""
    acts: list[ms.Action] = []
    for c in conns:
        acts += h.send(c, sync_vote(revision))
    assert sorted(plans(acts)) == sorted(conns), acts
    assert msgs(finish(h, conns), m.SyncComplete) == {c: [m.SyncComplete(revision)] for c in conns}


# ---- start ------------------------------------------------------------------------------------


def test_sync_starts_when_every_accepted_member_of_the_group_voted() -> None:
    h = Harness()
    a, b, c, x = h.run(0, 0, 0, 1)
    h.join(0)  # pending: no member of the vote
    assert h.send(a, sync_vote()) == []
    assert h.send(b, sync_vote()) == []
    # group 1 has one member: its sync runs at once, without waiting for group 0
    assert h.send(x, sync_vote()) == [ms.Send(x, m.SyncPlan(0, [], [], [addr(x)]))]
    acts = h.send(c, sync_vote())
    srcs = [addr(a), addr(b), addr(c)]
    assert acts == [ms.Send(conn, m.SyncPlan(0, [], [], srcs)) for conn in (a, b, c)]


def test_plan_names_what_each_voter_fetches_and_where_sources_serve() -> None:
    h = Harness()
    a, _ = h.join(0, state_port=7001)
    b, _ = h.join(0, state_port=7002)
    c, _ = h.join(0, state_port=7003)
    h.send(a, m.VoteUpdateTopology())
    h.send(a, sync_vote(1, 5))
    h.send(b, sync_vote(1, 5))
    acts = h.send(c, sync_vote(0, 6, fresh=True))  # outdated, other content
    srcs = [addr(a, 7001), addr(b, 7002)]
    assert plans(acts) == {a: m.SyncPlan(1, [], [], srcs, [c]), b: m.SyncPlan(1, [], [], srcs, [c]),
                           c: m.SyncPlan(1, ["w"], [digest(5)], srcs, [c])}


def test_syncs_of_peer_groups_are_independent() -> None:
    h = Harness()
    a, b, x, y = h.run(0, 0, 1, 1)
    assert h.send(a, sync_vote(3)) == []
    assert h.send(x, sync_vote(7)) == []
    assert sorted(plans(h.send(y, sync_vote(7)))) == [x, y]
    assert {p.revision for p in plans(h.send(b, sync_vote(3))).values()} == {3}
    assert finish(h, [a]) == []
    assert msgs(finish(h, [x, y]), m.SyncComplete) == {c: [m.SyncComplete(7)] for c in (x, y)}
    assert msgs(finish(h, [b]), m.SyncComplete) == {c: [m.SyncComplete(3)] for c in (a, b)}


# ---- completion -------------------------------------------------------------------------------


def test_every_part_succeeded_completes_and_a_failed_part_that_left_fails_nobody() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    for conn in (a, b, c):
        h.send(conn, sync_vote(4))
    assert h.send(a, m.SyncDone(True)) == []
    assert h.send(b, m.SyncDone(False, "fetch failed")) == []
    acts = h.send(b, m.Leave())  # the failed part left: the others' sync is whole
    assert acts[0] == ms.Close(b, "left")
    acts = h.send(c, m.SyncDone(True))
    assert acts == [ms.Send(conn, m.SyncComplete(4)) for conn in (a, c)]


def test_a_withdrawn_part_fails_the_sync_for_the_others_and_hears_no_more() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    for conn in (a, b):
        h.send(conn, sync_vote(4))
    assert h.send(a, m.SyncDone(True)) == []
    acts = h.send(b, m.WithdrawVote("sync"))  # b's caller timed out while a was done
    why = f"peer {b}'s part failed (gave up waiting); every peer retries the sync"
    assert acts == [ms.Send(a, m.SyncFailed(why, True)), ms.Send(b, m.VoteWithdrawn("sync"))]


def test_sync_completes_when_every_participant_reported_done() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    for conn in (a, b, c):
        h.send(conn, sync_vote(4))
    assert h.send(a, m.SyncDone(True)) == []
    assert h.send(b, m.SyncDone(False, "fetch failed")) == []  # a failure is done too
    acts = h.send(c, m.SyncDone(True))
    # ... and fails the sync for everyone, so that every peer retries it together
    why = f"peer {b}'s part failed (fetch failed); every peer retries the sync"
    assert acts == [ms.Send(conn, m.SyncFailed(why, True)) for conn in (a, b, c)]
    # the barrier is reset: the next sync is a new one (the revision advances by one)
    for conn in (a, b):
        assert h.send(conn, sync_vote(5)) == []
    assert {p.revision for p in plans(h.send(c, sync_vote(4))).values()} == {5}


# ---- departures -------------------------------------------------------------------------------


@pytest.mark.parametrize("last", [True, False], ids=["last-to-finish", "others-still-busy"])
@pytest.mark.parametrize("how", DEPARTURES)
def test_participant_leaving_mid_barrier_is_dropped_and_the_others_complete(
        how: str, last: bool) -> None:
    h = Harness()
    a, b, c = run_with_silent(h, (0, 0, 0), 1)
    h.send(a, sync_vote())
    h.send(c, sync_vote())
    h.now = -10.0
    assert sorted(plans(h.send(b, sync_vote()))) == [a, b, c]
    h.now = 0.0
    h.send(a, m.SyncDone(True))
    if last:
        h.send(c, m.SyncDone(True))
    acts = departure(h, how, b)
    assert sorted(msgs(acts, m.Membership)) == [a, c]
    if not last:
        assert msgs(acts, m.SyncComplete) == {}
        acts = h.send(c, m.SyncDone(True))
    assert msgs(acts, m.SyncComplete) == {a: [m.SyncComplete(0)], c: [m.SyncComplete(0)]}
    if last:  # the survivors see the smaller ring first
        assert index_of(acts, a, m.Membership) < index_of(acts, a, m.SyncComplete)


@pytest.mark.parametrize("how", DEPARTURES)
def test_departure_of_the_last_non_voter_starts_the_sync(how: str) -> None:
    h = Harness()
    a, b, c = run_with_silent(h, (0, 0, 0), 2)
    assert h.send(a, sync_vote()) == []
    assert h.send(b, sync_vote()) == []
    acts = departure(h, how, c)
    assert sorted(plans(acts)) == [a, b]
    assert plans(acts)[a].sources == [addr(a), addr(b)]
    assert index_of(acts, a, m.Membership) < index_of(acts, a, m.SyncPlan)


def test_departed_voter_does_not_count_in_the_election() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    h.send(a, sync_vote(9, 2))  # the highest revision would be the resume target
    h.disconnect(a)
    h.send(b, sync_vote(0, 1))
    acts = h.send(c, sync_vote(0, 1))
    assert {conn: (p.revision, p.sources) for conn, p in plans(acts).items()} == {
        b: (0, [addr(b), addr(c)]), c: (0, [addr(b), addr(c)])}


def test_every_participant_leaving_clears_the_barrier() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    h.send(a, sync_vote(2))
    h.send(b, sync_vote(2))
    h.disconnect(a)
    assert h.disconnect(b) == []
    h.tick(5.0)  # nobody rejoined within the grace
    c, _ = h.join(0)  # a new run of group 0; the master remembers the last revision
    d, _ = h.join(0)
    h.send(c, m.VoteUpdateTopology())
    synced(h, [c, d], 2)


# ---- the election's verdicts ------------------------------------------------------------------


def test_election_kick_at_the_start_then_the_others_complete() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    h.send(a, sync_vote())
    h.send(b, sync_vote())
    acts = h.send(c, sync_vote(nbytes=65))  # another layout
    assert kinds(acts) == [(a, m.SyncPlan), (b, m.SyncPlan), (c, m.Kicked), (c, ms.Close),
                           (a, m.Membership), (b, m.Membership)]
    assert "differ" in sent_to(acts, c, m.Kicked)[0].reason
    assert h.st.accepted() == [a, b]
    assert h.send(a, m.SyncDone(True)) == []
    assert msgs(h.send(b, m.SyncDone(True)), m.SyncComplete) == {
        a: [m.SyncComplete(0)], b: [m.SyncComplete(0)]}


def test_revision_skipping_voter_is_kicked_on_a_later_sync() -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    synced(h, [a, b, c], 3)
    h.send(a, sync_vote(4))
    h.send(b, sync_vote(4))
    acts = h.send(c, sync_vote(6))
    assert "skips ahead" in sent_to(acts, c, m.Kicked)[0].reason
    assert {conn: p.revision for conn, p in plans(acts).items()} == {a: 4, b: 4}


def test_sync_failed_for_everyone_when_nobody_can_serve() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    h.send(a, sync_vote(strategy=RO))
    acts = h.send(b, sync_vote(strategy=RO))
    assert kinds(acts) == [(a, m.SyncFailed), (b, m.SyncFailed)]
    assert closes(acts) == []
    # nothing runs: a SyncDone is out of place, a new vote is welcome
    assert_kicked(h.send(a, m.SyncDone(True)), a)
    synced(h, [b], 0)


def test_sync_failed_goes_to_the_survivors_before_the_election_kicks() -> None:
    h = Harness()
    a, b = h.run(0, 0)
    synced(h, [a, b], 1)
    h.send(a, sync_vote(0))  # behind the master's revision 1: cannot serve it
    acts = h.send(b, sync_vote(5))  # skips ahead: kicked
    assert kinds(acts)[:3] == [(a, m.SyncFailed), (b, m.Kicked), (b, ms.Close)]
    assert "revision 1" in sent_to(acts, a, m.SyncFailed)[0].reason
    assert h.st.accepted() == [a]


def test_vote_with_an_unknown_strategy_is_a_kick_not_a_crash() -> None:
    """Regression: the election names the strategy of a voter it kicks for mixing strategies,
    so an unknown value raised ValueError out of handle() once the group's votes were in."""
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    h.send(b, sync_vote())
    h.send(c, sync_vote())
    acts = h.send(a, m.VoteSync(0, 7, sync_vote().entries))
    assert_kicked(acts, a)
    assert "strategy 7" in sent_to(acts, a, m.Kicked)[0].reason
    assert sorted(plans(acts)) == [b, c]  # a's departure lets the others' sync start


# ---- illegal sync messages --------------------------------------------------------------------


def _illegal(h: Harness, a: int, b: int, c: int, p: int, case: str) -> tuple[int, list[ms.Action]]:
    match case:
        case "vote twice":
            h.send(a, sync_vote())
            return a, h.send(a, sync_vote())
        case "vote while syncing":
            for conn in (a, b, c):
                h.send(conn, sync_vote())
            return a, h.send(a, sync_vote())
        case "done outside a sync":
            return a, h.send(a, m.SyncDone(True))
        case "done twice":
            for conn in (a, b, c):
                h.send(conn, sync_vote())
            h.send(a, m.SyncDone(True))
            return a, h.send(a, m.SyncDone(True))
        case "vote while voting topology":
            h.send(a, m.VoteUpdateTopology())
            return a, h.send(a, sync_vote())
        case "vote with a collective voting":
            h.send(a, m.CollectiveInit(1, 8, 10, 0))
            return a, h.send(a, sync_vote())
        case "vote from pending":
            return p, h.send(p, sync_vote())
        case "done from pending":
            return p, h.send(p, m.SyncDone(True))
    raise AssertionError(case)


ILLEGAL = ["vote twice", "vote while syncing", "done outside a sync", "done twice",
           "vote while voting topology", "vote with a collective voting", "vote from pending",
           "done from pending"]


@pytest.mark.parametrize("case", ILLEGAL)
def test_illegal_sync_message_kicks_only_the_offender(case: str) -> None:
    h = Harness()
    a, b, c = h.run(0, 0, 0)
    p, _ = h.join(0)
    offender, acts = _illegal(h, a, b, c, p, case)
    assert_kicked(acts, offender)
    survivors = [x for x in (a, b, c) if x != offender]
    assert h.st.accepted() == survivors
    if case in ("vote while syncing", "done twice"):  # the running sync completes without it
        assert msgs(finish(h, survivors), m.SyncComplete) == {
            x: [m.SyncComplete(0)] for x in survivors}
    synced(h, survivors, 0)  # nothing of the offender's is left: a fresh sync runs


# ---- the barrier on its own --------------------------------------------------------------------


class _Roster:
    """A stand-in for the master's state: the barrier needs nothing else."""

    def __init__(self, members: list[int]) -> None:
        self.members = members
        self.kicked: list[tuple[int, str]] = []
        self.barrier = SyncBarrier(self)

    def accepted(self, group: int | None = None) -> list[int]:
        return sorted(self.members)

    def addr(self, conn: int) -> m.PeerAddr:
        return m.PeerAddr(conn, "h", 1000 + conn, 2000 + conn)

    def kick(self, conn: int, reason: str, out: list[ms.Action]) -> None:
        self.kicked.append((conn, reason))
        self.members.remove(conn)
        self.barrier.drop(conn, 0)
        self.barrier.check(0, out)


def test_barrier_runs_on_any_roster() -> None:
    r = _Roster([1, 2, 3])
    out: list[ms.Action] = []
    r.barrier.vote(1, 0, sync_vote(), out)
    r.barrier.vote(2, 0, sync_vote(), out)
    assert out == [] and r.barrier.busy(1) and not r.barrier.busy(3)
    r.barrier.vote(3, 0, sync_vote(nbytes=1), out)
    srcs = [m.PeerAddr(c, "h", 1000 + c, 2000 + c) for c in (1, 2)]
    assert [c for c, _ in r.kicked] == [3] and not r.barrier.busy(3)
    note = f"peer 3 was kicked: {r.kicked[0][1]}"  # the survivors are told why
    assert "key 'w' is uint8, 1 element (1 B) on peer 3" in note
    assert out == [ms.Send(c, m.SyncPlan(0, [], [], srcs, [], [note])) for c in (1, 2)]
    out.clear()
    r.barrier.done(1, 0, out)
    assert out == [] and r.barrier.busy(2)
    r.barrier.done(2, 0, out)
    assert out == [ms.Send(c, m.SyncComplete(0)) for c in (1, 2)]
    assert not r.barrier.busy(1) and not r.barrier.busy(2)
    with pytest.raises(m.RemoteProtocolError):
        r.barrier.done(1, 0, out)
