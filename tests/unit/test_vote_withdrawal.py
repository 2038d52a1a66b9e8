"""The peer's side of a withdrawn vote, in the orders the network can deliver: tables on the
vote book alone (``_peer/session/core/votes.py``; no master, no socket, no event loop).

Each row is one event and what the book answers: a call of this peer (``open``, ``cast``,
``stop``: the caller stopped waiting, ``abandon``, ``withdraw``: its ``WithdrawVote`` left) or
a message of the master (``answer``, ``peers_pending``, ``withdrawn``, ...). ``abandon``
answering True is the ``WithdrawVote`` the control plane sends; ``Withdraw`` in an answer is
another one.
"""

from __future__ import annotations

from typing import Any

import pytest

from pccl_aio._errors import InvalidUsageError
from pccl_aio._peer.session.core.votes import Carried, Settle, VoteBook, Withdraw
from pccl_aio._wire import messages as m

pytestmark = pytest.mark.timeout(10)


class Caller:
    """A waiter: the caller of one vote. ``stop`` marks it gone (cancelled)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.gone = False

    def done(self) -> bool:
        return self.gone

    def __repr__(self) -> str:
        return self.name


Row = tuple[str, tuple[Any, ...], Any]


def play(table: list[Row], book: VoteBook[Caller] | None = None) -> VoteBook[Caller]:
    """Apply each row's event to ``book`` (a new one by default) and check its answer."""
    book = VoteBook() if book is None else book
    for i, (event, args, want) in enumerate(table):
        if event == "stop":
            args[0].gone = True
            continue
        got = getattr(book, event)(*args)
        assert got == want, f"row {i}: {event}{args} answered {got!r}, not {want!r}"
    return book


def cancelled(kind: m.VoteKind, caller: Caller) -> list[Row]:
    """A vote of ``kind`` sent by ``caller``, who then stops waiting: it is taken back."""
    return [("open", (kind,), None), ("cast", (kind, caller), None), ("stop", (caller,), None),
            ("abandon", (kind, caller), True), ("withdraw", (kind,), None)]


def test_withdrawal_won_the_race_the_next_vote_gets_the_next_round():
    a, b = Caller("a"), Caller("b")
    play([
        *cancelled("pending", a),
        ("withdrawn", ("pending",), None),
        ("open", ("pending",), None),  # no carried answer: a new vote goes out
        ("cast", ("pending", b), None),
        ("peers_pending", (1, True), [Settle(b, True)]),
    ])


def test_a_round_that_counted_the_withdrawn_vote_answers_the_next_vote_already_sent():
    """The others' votes reached the master before the withdrawal: that round counted it
    and they went on, so the next vote is that round's (its own copy is taken back)."""
    a, b, c = Caller("a"), Caller("b"), Caller("c")
    play([
        *cancelled("pending", a),
        ("open", ("pending",), None),
        ("cast", ("pending", b), None),
        ("peers_pending", (1, False), [Settle(b, False), Withdraw("pending")]),
        ("withdraw", ("pending",), None),  # b's copy is taken back too
        ("withdrawn", ("pending",), None),
        ("peers_pending", (2, True), []),  # still the answer of a vote taken back: carried
        ("withdrawn", ("pending",), None),
        ("open", ("pending",), Carried(True)),
    ])
    play([
        *cancelled("pending", a),
        ("open", ("pending",), None),
        ("cast", ("pending", b), None),
        ("peers_pending", (1, False), [Settle(b, False), Withdraw("pending")]),
        ("withdraw", ("pending",), None),
        ("withdrawn", ("pending",), None),
        ("withdrawn", ("pending",), None),  # both withdrawals acknowledged: a fresh round
        ("open", ("pending",), None),
        ("cast", ("pending", c), None),
        ("peers_pending", (2, True), [Settle(c, True)]),
    ])


def test_a_round_answer_before_the_next_vote_is_carried_to_it():
    a = Caller("a")
    play([
        *cancelled("pending", a),
        ("peers_pending", (1, True), []),  # the withdrawn vote's round completed
        ("withdrawn", ("pending",), None),
        ("open", ("pending",), Carried(True)),  # no new round
        ("open", ("pending",), None),  # carried once only
    ])


@pytest.mark.parametrize("kind, answer, value", [
    ("pending", "peers_pending", (1, False)),
    ("topology", "topology_updated", (1,)),
    ("optimize", "answer", ("optimize", "DONE")),
])
def test_every_joint_kind_carries_the_round_of_a_withdrawn_vote(kind, answer, value):
    carried = {"pending": False, "topology": None, "optimize": "DONE"}[kind]
    play([*cancelled(kind, Caller("a")), (answer, value, []), ("withdrawn", (kind,), None),
          ("open", (kind,), Carried(carried))])


def test_a_late_answer_to_a_caller_that_stopped_waiting_is_dropped_and_not_withdrawn():
    """The answer came between the caller's cancellation and its wake-up: the vote was
    answered (the master counted it), so nothing is taken back."""
    a, b = Caller("a"), Caller("b")
    play([
        ("cast", ("pending", a), None),
        ("stop", (a,), None),
        ("peers_pending", (1, True), []),  # a is gone: its future is not completed
        ("abandon", ("pending", a), False),  # no WithdrawVote
        ("open", ("pending",), None),  # and nothing carried: the answer was a's
        ("cast", ("pending", b), None),
        ("peers_pending", (2, False), [Settle(b, False)]),
    ])


def test_a_late_answer_while_withdrawing_to_a_next_caller_gone_too_is_carried():
    a, b = Caller("a"), Caller("b")
    play([
        *cancelled("topology", a),
        ("cast", ("topology", b), None),
        ("stop", (b,), None),
        ("topology_updated", (3,), []),  # the round counted a's vote; b is gone as well
        ("abandon", ("topology", b), False),
        ("withdrawn", ("topology",), None),
        ("open", ("topology",), Carried(None)),
    ])


def test_answers_after_the_master_acknowledged_the_withdrawal_belong_to_the_next_vote():
    a, b = Caller("a"), Caller("b")
    play([
        *cancelled("optimize", a),
        ("withdrawn", ("optimize",), None),
        ("answer", ("optimize", "late"), []),  # nobody waits: dropped, not carried
        ("open", ("optimize",), None),
        ("cast", ("optimize", b), None),
        ("answer", ("optimize", "done"), [Settle(b, "done")]),
    ])


def test_a_rejection_of_a_vote_taken_back_is_dropped():
    a, b = Caller("a"), Caller("b")
    old, new = InvalidUsageError("the withdrawn vote's"), InvalidUsageError("the next vote's")
    play([
        *cancelled("optimize", a),
        ("cast", ("optimize", b), None),
        ("reject", ("optimize", old), []),
        ("withdrawn", ("optimize",), None),
        ("reject", ("optimize", new), [Settle(b, None, new)]),
    ])


def test_a_sync_round_that_counted_a_withdrawn_vote_is_not_carried():
    """A sync that counted a withdrawn vote fails for the group: its plan is nobody's."""
    a, b = Caller("a"), Caller("b")
    plan = m.SyncPlan(4, [], [], [])
    book = play([
        *cancelled("sync", a),
        ("planned", (plan,), []),
        ("withdrawn", ("sync",), None),
        ("open", ("sync",), None),
        ("cast", ("sync", b), None),
    ])
    assert book.sync is not None and book.sync.revision == 4  # in doubt if the master goes


def test_one_vote_of_a_kind_at_a_time():
    a = Caller("a")
    book = play([("cast", ("sync", a), None), ("open", ("pending",), None)])
    with pytest.raises(InvalidUsageError, match="a sync vote is already waiting"):
        book.open("sync")
    with pytest.raises(InvalidUsageError, match="a sync vote is already waiting"):
        book.cast("sync", Caller("b"))
