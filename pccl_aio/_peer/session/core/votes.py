"""This peer's votes and the master's answers to them, sans-IO: the vote book.

A vote of each ``VoteKind`` waits at most once at a time. It is cast (``cast``), then
answered by the master (``answer``, ``reject``, and the joint rounds' ``membership``,
``topology_updated``, ``peers_pending``), or taken back by a caller that stopped waiting
(``abandon``; ``withdraw`` once its ``WithdrawVote`` left, ``withdrawn`` at the master's
``VoteWithdrawn``). The answers of a kind sent before that ``VoteWithdrawn`` belong to the
vote taken back: a joint round that counted it (the withdrawal lost the race against the
others' votes) answers this peer's next vote of that kind, which ``open`` returns at once
(``Carried``) or, already out, is answered and taken back in turn; a sync's are dropped.

A sync has two stages: its vote, answered by the plan (``planned``), then the group's
verdict on the transfer (``SyncComplete`` or ``SyncFailed``), awaited from this peer's
``SyncDone`` on (``await_verdict``, ``reported``; ``sync`` holds the plan's revision).

When the master is lost, ``in_doubt`` says which votes wait for the next master and what
this peer tells it (``Doubt``); ``rejoined`` fails the joint votes it did not answer.

Nothing here blocks or holds a future: each waiting vote has an opaque ``waiter`` (the
control plane's future; ``done()``: its caller stopped waiting), and every method answers
with values: ``Settle`` (complete that waiter with a value or an error) and ``Withdraw``
(send ``WithdrawVote(kind)``).
"""

from __future__ import annotations

import dataclasses
from typing import Final, Generic, Protocol, TypeAlias, TypeVar, get_args

from ...._errors import InvalidUsageError, PcclError
from ...._wire import messages as m
from ...._wire.fields import VoteKind
from ...._wire.recovery import DOUBT_SYNC

__all__ = ["KINDS", "Carried", "Settle", "Sync", "VoteBook", "Waiter", "Withdraw"]

#: Every kind of vote; a cancelled caller takes back each of them.
KINDS: Final[tuple[VoteKind, ...]] = get_args(VoteKind)
#: Votes whose round, once it counted a withdrawn vote, answers the next vote of the kind
#: (the group's calls stay in step); a sync that counted one fails for the group instead.
CARRIED: Final[frozenset[VoteKind]] = frozenset({"topology", "pending", "optimize"})
#: Joint votes kept in doubt through a master outage (the next master may answer them).
JOINT: Final[tuple[VoteKind, ...]] = ("pending", "topology")


class Waiter(Protocol):
    """What the book asks of a waiter: has its caller stopped waiting (or been answered)?"""

    def done(self) -> bool: ...


W = TypeVar("W", bound=Waiter)


@dataclasses.dataclass(frozen=True, slots=True)
class Settle(Generic[W]):
    """Complete ``waiter`` with ``value``, or with ``error`` if one is given."""

    waiter: W
    value: object = None
    error: PcclError | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Withdraw:
    """Send ``WithdrawVote(kind)`` (then tell the book: ``withdraw``)."""

    kind: VoteKind


@dataclasses.dataclass(frozen=True, slots=True)
class Carried:
    """The answer of a round that counted a withdrawn vote: the next vote's, without a
    new round."""

    value: object


@dataclasses.dataclass(frozen=True, slots=True)
class Sync:
    """A sync past its plan: the plan's ``revision`` and the ok of this peer's ``SyncDone``
    (None: not sent)."""

    revision: int
    reported: bool | None = None


Action: TypeAlias = "Settle[W] | Withdraw"


class VoteBook(Generic[W]):
    """Every vote of one peer: the waiting ones, the ones being taken back, the answers
    carried to the next vote, the joint rounds seen and the sync's stages."""

    __slots__ = ("_carried", "_heard", "_rounds", "_verdict", "_waiting", "_withdrawing",
                 "revision", "seconds", "sync")

    def __init__(self) -> None:
        self._waiting: dict[VoteKind, W] = {}
        self._verdict: W | None = None  # the sync's second stage: the group's verdict
        self._withdrawing: dict[VoteKind, int] = {}  # WithdrawVotes not acknowledged
        self._carried: dict[VoteKind, object] = {}  # answers of rounds a withdrawn vote made
        self._rounds: dict[VoteKind, tuple[int, bool]] = {}  # last joint round answered
        self._heard: dict[VoteKind, int] = {}  # rounds the run had answered (Membership)
        self.sync: Sync | None = None
        self.revision = -1  # the shared-state revision of the last completed sync
        self.seconds = 0.0  # callers' time waiting for answers (metrics)

    # ---- this peer's calls ----------------------------------------------------------------
    def open(self, kind: VoteKind) -> Carried | None:
        """A call is about to vote: the answer carried to it, if any (no vote then).
        Raises ``InvalidUsageError`` while a vote of ``kind`` waits."""
        self._free(kind)
        if kind in self._carried:
            return Carried(self._carried.pop(kind))
        return None

    def cast(self, kind: VoteKind, waiter: W) -> None:
        """A vote of ``kind`` goes out; ``waiter`` gets its answer. Raises
        ``InvalidUsageError`` while another waits."""
        self._free(kind)
        self._waiting[kind] = waiter

    def _free(self, kind: VoteKind) -> None:
        if kind in self._waiting:
            raise InvalidUsageError(f"a {kind} vote is already waiting on this peer")

    def waiting(self, kind: VoteKind) -> bool:
        """A vote of ``kind`` waits for its answer."""
        return kind in self._waiting

    def abandon(self, kind: VoteKind, waiter: W) -> bool:
        """The caller of ``waiter`` stopped waiting. True: its vote was still out (the
        master counts it until a ``WithdrawVote``); False: it had been answered."""
        if self._waiting.get(kind) is not waiter:
            return False
        del self._waiting[kind]
        return True

    def withdraw(self, kind: VoteKind) -> None:
        """A ``WithdrawVote(kind)`` left: the answers of ``kind`` until the master's
        ``VoteWithdrawn`` belong to the vote taken back."""
        self._withdrawing[kind] = self._withdrawing.get(kind, 0) + 1

    def await_verdict(self, waiter: W) -> None:
        """The sync's second stage: ``waiter`` gets the group's verdict on the transfer."""
        self._verdict = waiter

    def reported(self, ok: bool) -> None:
        """This peer's ``SyncDone(ok)`` is going out."""
        if self.sync is not None:
            self.sync = Sync(self.sync.revision, ok)

    def waited(self, seconds: float) -> None:
        """A caller waited ``seconds`` for an answer."""
        self.seconds += seconds

    # ---- the master's answers -------------------------------------------------------------
    def answer(self, kind: VoteKind, value: object) -> list[Action[W]]:
        """The master answered a vote of ``kind`` with ``value``."""
        if kind in self._withdrawing:  # a round that counted a vote taken back
            if kind not in CARRIED:
                return []
            waiter = self._waiting.pop(kind, None)
            if waiter is not None and not waiter.done():  # the next vote is out: it is
                return [Settle(waiter, value), Withdraw(kind)]  # this round's; take it back
            self._carried[kind] = value
            return []
        return _settle(self._waiting.pop(kind, None), value)

    def reject(self, kind: VoteKind, error: PcclError) -> list[Action[W]]:
        """The master refused a vote of ``kind`` (``VoteRejected``, or the sync failed)."""
        if kind in self._withdrawing:
            return []
        return _settle(self._waiting.pop(kind, None), error=error)

    def withdrawn(self, kind: VoteKind) -> None:
        """The master's ``VoteWithdrawn(kind)``: the oldest withdrawal of ``kind`` is done."""
        if (n := self._withdrawing.get(kind, 0)) > 1:
            self._withdrawing[kind] = n - 1
        else:
            self._withdrawing.pop(kind, None)

    def membership(self, pending_round: int, topology_round: int) -> list[Action[W]]:
        """A ``Membership`` with the run's joint rounds: one that completed a topology round
        counting this peer's vote answers it (its answer, which follows, may be lost with
        the master)."""
        rounds: tuple[tuple[VoteKind, int], ...] = (("pending", pending_round),
                                                    ("topology", topology_round))
        for kind, n in rounds:
            self._heard[kind] = max(self._heard.get(kind, 0), n)
        if (topology_round > self._round("topology") and "topology" not in self._withdrawing
                and "topology" in self._waiting):
            self._rounds["topology"] = (topology_round, True)
            return self.answer("topology", None)
        return []

    def topology_updated(self, n: int) -> list[Action[W]]:
        """``TopologyUpdated`` of round ``n`` (0: unnumbered)."""
        if n and n <= self._round("topology"):
            return []  # its Membership answered the vote already (a new one may wait now)
        self._rounds["topology"] = (n, True)
        return self.answer("topology", None)

    def peers_pending(self, n: int, pending: bool) -> list[Action[W]]:
        """``PeersPendingAnswer`` of round ``n``."""
        self._rounds["pending"] = (n, pending)
        return self.answer("pending", pending)

    def planned(self, plan: m.SyncPlan) -> list[Action[W]]:
        """The sync's plan: the first stage's answer."""
        self.sync = Sync(plan.revision)
        return self.answer("sync", plan)

    def sync_failed(self, completed: bool, error: PcclError) -> list[Action[W]]:
        """``SyncFailed``: of the transfer (``completed``: the verdict) or of the vote."""
        self.sync = None
        if completed:
            waiter, self._verdict = self._verdict, None
            return _settle(waiter, error=error)
        return self.reject("sync", error)

    def sync_completed(self, msg: m.SyncComplete) -> list[Action[W]]:
        """``SyncComplete``: the group's verdict, success."""
        self.sync = None
        self.revision = msg.revision
        waiter, self._verdict = self._verdict, None
        return _settle(waiter, msg)

    # ---- the session ----------------------------------------------------------------------
    def restart(self) -> None:
        """A new session from scratch (``connect``): no withdrawal or carried answer holds."""
        self._withdrawing.clear()
        self._carried.clear()

    def fail(self, error: PcclError) -> list[Action[W]]:
        """The session ended for good: every waiting vote fails with ``error``."""
        waiters = [*self._waiting.values(), self._verdict]
        self._waiting.clear()
        self._verdict = None
        return [a for w in waiters for a in _settle(w, error=error)]

    def in_doubt(self, keep: bool, error: PcclError) -> tuple[list[Action[W]], list[m.Doubt]]:
        """The master was lost: fail with ``error`` the votes the next master cannot answer,
        and say what this peer tells it of its sync. ``keep`` False: nothing of the run
        stays in doubt (its master stepped down). Kept: the joint votes not being taken back,
        and the verdict of a sync whose transfer this peer finished."""
        reported = keep and self.sync is not None and self.sync.reported is True
        doubts = []
        if "sync" in self._waiting:  # voted, no plan yet: the group's sync cannot complete
            doubts.append(m.Doubt(DOUBT_SYNC, 0, 0, False))
        actions: list[Action[W]] = []
        for kind in list(self._waiting):
            if keep and kind in JOINT and kind not in self._withdrawing:
                continue  # in doubt: answered by the next master if a member had the answer
            actions += _settle(self._waiting.pop(kind), error=error)
        if not reported:
            waiter, self._verdict = self._verdict, None
            actions += _settle(waiter, error=error)
        self._withdrawing.clear()
        if self.sync is not None and not reported:
            doubts.append(m.Doubt(DOUBT_SYNC, 0, self.sync.revision, False))
            self.sync = None
        return actions, doubts

    def rejoined(self, error: PcclError) -> list[Action[W]]:
        """The run is rejoined: the joint votes in doubt that it did not answer fail."""
        return [a for kind in JOINT for a in _settle(self._waiting.pop(kind, None),
                                                     error=error)]

    def sync_doubt(self) -> list[m.Doubt]:
        """The sync past its plan, for the next master (``Rejoin``)."""
        if self.sync is None:
            return []
        return [m.Doubt(DOUBT_SYNC, 0, self.sync.revision, bool(self.sync.reported))]

    def rounds(self) -> list[m.Round]:
        """The last joint round of each kind this peer saw answered, or heard of in a
        ``Membership`` (then ``known`` False: it had joined after that round)."""
        out = []
        for kind in JOINT:
            n, answer = self._rounds.get(kind, (0, False))
            heard, waiting = self._heard.get(kind, 0), kind in self._waiting
            if heard > n:
                out.append(m.Round(kind, heard, False, False, waiting))
            elif n or waiting:
                out.append(m.Round(kind, n, answer, True, waiting))
        return out

    def _round(self, kind: VoteKind) -> int:
        return self._rounds.get(kind, (0, True))[0]


def _settle(waiter: W | None, value: object = None, error: PcclError | None = None
            ) -> list[Action[W]]:
    """Complete ``waiter`` unless there is none or its caller stopped waiting."""
    if waiter is None or waiter.done():
        return []
    return [Settle(waiter, value, error)]
