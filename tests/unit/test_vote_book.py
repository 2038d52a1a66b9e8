"""The vote book's answers besides withdrawals (``test_vote_withdrawal.py``): the joint rounds
a ``Membership`` completes, the sync's two stages, and what a lost master leaves in doubt.
Tables of events and answers on the book alone (no master, no socket, no event loop)."""

from __future__ import annotations

import pytest

from pccl_aio._errors import MasterLostError, PcclError, SharedStateError
from pccl_aio._peer.session.core.votes import KINDS, Settle, Sync, VoteBook
from pccl_aio._wire import messages as m
from pccl_aio._wire.recovery import DOUBT_SYNC

from .test_vote_withdrawal import Caller, cancelled, play

pytestmark = pytest.mark.timeout(10)

PLAN = m.SyncPlan(7, ["w"], [b""], [])
LOST = MasterLostError("the master was lost")


def test_the_kinds_are_the_wires():
    assert set(KINDS) == {"topology", "pending", "sync", "optimize"}


def test_a_membership_that_completed_the_topology_round_answers_the_vote():
    """Its ``TopologyUpdated`` may be lost with the master; once it comes it is stale."""
    a, b = Caller("a"), Caller("b")
    book = play([
        ("cast", ("topology", a), None),
        ("membership", (0, 0), []),  # no round completed
        ("membership", (2, 3), [Settle(a, None)]),
        ("topology_updated", (3,), []),  # the same round: answered already
        ("cast", ("topology", b), None),
        ("topology_updated", (3,), []),  # still stale: b waits for round 4
        ("topology_updated", (4,), [Settle(b, None)]),
    ])
    assert book.rounds() == [m.Round("pending", 2, False, False, False),
                             m.Round("topology", 4, True, True, False)]


def test_a_membership_does_not_answer_a_topology_vote_being_taken_back():
    a = Caller("a")
    play([*cancelled("topology", a), ("cast", ("topology", Caller("b")), None),
          ("membership", (0, 5), [])])


def test_the_rounds_told_to_the_next_master():
    a = Caller("a")
    book = play([("peers_pending", (4, True), []), ("cast", ("pending", a), None)])
    assert book.rounds() == [m.Round("pending", 4, True, True, True)]
    play([("membership", (6, 0), [])], book)  # the run answered round 6 before this peer
    assert book.rounds() == [m.Round("pending", 6, False, False, True)]
    assert VoteBook[Caller]().rounds() == []


def test_a_sync_in_two_stages_the_plan_then_the_verdict():
    a, verdict = Caller("a"), Caller("verdict")
    done = m.SyncComplete(7)
    book = play([
        ("cast", ("sync", a), None),
        ("planned", (PLAN,), [Settle(a, PLAN)]),
        ("await_verdict", (verdict,), None),
        ("waiting", ("sync",), False),  # a new vote of the kind may go out meanwhile
    ])
    assert book.sync == Sync(7) and book.revision == -1
    book.reported(True)
    assert book.sync == Sync(7, True)
    play([("sync_completed", (done,), [Settle(verdict, done)])], book)
    assert book.sync is None and book.revision == 7


@pytest.mark.parametrize("completed", [False, True])
def test_a_failed_sync_fails_its_stage(completed: bool):
    a, verdict = Caller("a"), Caller("verdict")
    err = SharedStateError("shared-state sync failed")
    if completed:  # the transfer failed somewhere: the verdict
        table = [("cast", ("sync", a), None), ("planned", (PLAN,), [Settle(a, PLAN)]),
                 ("await_verdict", (verdict,), None),
                 ("sync_failed", (True, err), [Settle(verdict, None, err)])]
    else:  # refused before any plan: the vote
        table = [("cast", ("sync", a), None), ("sync_failed", (False, err), [Settle(a, None, err)])]
    assert play(table).sync is None


def test_a_master_lost_keeps_the_joint_votes_in_doubt_and_fails_the_others():
    p, t, o, s = Caller("p"), Caller("t"), Caller("o"), Caller("s")
    book = play([("cast", ("pending", p), None), ("cast", ("topology", t), None),
                 ("cast", ("optimize", o), None), ("cast", ("sync", s), None)])
    settled, doubts = book.in_doubt(True, LOST)
    assert settled == [Settle(o, None, LOST), Settle(s, None, LOST)]
    assert doubts == [m.Doubt(DOUBT_SYNC, 0, 0, False)]  # voted, no plan: it cannot complete
    assert [r.waiting for r in book.rounds()] == [True, True]
    rejoin_lost = MasterLostError("not answered")
    assert book.rejoined(rejoin_lost) == [Settle(p, None, rejoin_lost),
                                          Settle(t, None, rejoin_lost)]
    assert book.rejoined(rejoin_lost) == []


def test_a_master_lost_fails_a_joint_vote_being_taken_back_and_forgets_the_withdrawal():
    a, b = Caller("a"), Caller("b")
    book = play([*cancelled("pending", a), ("cast", ("pending", b), None)])
    assert book.in_doubt(True, LOST) == ([Settle(b, None, LOST)], [])
    c = Caller("c")  # the next master's answers are the new vote's
    play([("cast", ("pending", c), None), ("peers_pending", (1, True), [Settle(c, True)])], book)


def test_a_master_that_stepped_down_leaves_nothing_in_doubt():
    p, verdict = Caller("p"), Caller("verdict")
    book = play([("cast", ("pending", p), None), ("planned", (PLAN,), []),
                 ("await_verdict", (verdict,), None)])
    book.reported(True)
    settled, doubts = book.in_doubt(False, LOST)
    assert settled == [Settle(p, None, LOST), Settle(verdict, None, LOST)]
    assert doubts == [m.Doubt(DOUBT_SYNC, 0, 7, False)] and book.sync is None


@pytest.mark.parametrize("reported", [None, False, True])
def test_a_sync_past_its_plan_is_in_doubt_only_once_this_peer_finished_it(reported):
    verdict = Caller("verdict")
    book = play([("planned", (PLAN,), []), ("await_verdict", (verdict,), None)])
    if reported is not None:
        book.reported(reported)
    settled, doubts = book.in_doubt(True, LOST)
    if reported:  # the next master gives the verdict; the rejoin tells it this peer's part
        assert (settled, doubts) == ([], [])
        assert book.sync_doubt() == [m.Doubt(DOUBT_SYNC, 0, 7, True)]
        done = m.SyncComplete(7)
        play([("sync_completed", (done,), [Settle(verdict, done)])], book)
    else:
        assert settled == [Settle(verdict, None, LOST)]
        assert doubts == [m.Doubt(DOUBT_SYNC, 0, 7, False)]
        assert book.sync is None and book.sync_doubt() == []


def test_the_session_ending_for_good_fails_every_waiting_vote():
    a, b, verdict, gone = Caller("a"), Caller("b"), Caller("verdict"), Caller("gone")
    err = PcclError("closed")
    book = play([("cast", ("pending", a), None), ("cast", ("optimize", gone), None),
                 ("stop", (gone,), None), ("cast", ("sync", b), None),
                 ("await_verdict", (verdict,), None)])
    assert book.fail(err) == [Settle(a, None, err), Settle(b, None, err),
                              Settle(verdict, None, err)]
    assert book.fail(err) == [] and not any(book.waiting(k) for k in KINDS)


def test_a_new_session_forgets_withdrawals_and_carried_answers():
    book = play([*cancelled("pending", Caller("a")), ("peers_pending", (1, True), [])])
    book.restart()
    b = Caller("b")
    play([("open", ("pending",), None), ("cast", ("pending", b), None),
          ("peers_pending", (1, False), [Settle(b, False)])], book)


def test_time_waiting_adds_up():
    book = VoteBook[Caller]()
    book.waited(0.25)
    book.waited(0.5)
    assert book.seconds == 0.75
