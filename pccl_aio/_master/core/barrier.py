"""The master's shared-state sync barrier, sans-IO (an object ``MasterState`` holds).

Rules: a group's sync starts when every accepted member voted ``VoteSync``; ``election.elect``
decides the revision, the kicks and the plans (``SyncPlan``, or ``SyncFailed`` for all); the
sync completes (``SyncComplete`` to every participant) when every participant still present
reported ``SyncDone``. A peer that leaves is dropped from both steps, so it never blocks them.
"""

from __future__ import annotations

from typing import Protocol

from ..._errors import RemoteProtocolError
from ..._types import SyncStrategy
from ..._wire import messages as m
from .election import elect
from .events import Action, Send

__all__ = ["Roster", "SyncBarrier"]

_STRATEGIES = frozenset(int(s) for s in SyncStrategy)


class Roster(Protocol):
    """What the barrier needs from the master's state."""

    def accepted(self, group: int | None = None) -> list[int]:
        """Accepted peers of ``group``, ascending."""

    def addr(self, conn: int) -> m.PeerAddr:
        """Where peer ``conn`` serves its shared state."""

    def kick(self, conn: int, reason: str, out: list[Action]) -> None:
        """End ``conn``'s session (a protocol violation) and treat it as departed."""


class SyncBarrier:
    """Shared-state votes and the barrier of every peer group."""

    def __init__(self, roster: Roster) -> None:
        self._roster = roster
        self._votes: dict[int, m.VoteSync] = {}  # conn -> its counted vote
        self._syncing: set[int] = set()  # got a SyncPlan, no SyncDone yet
        self._parts: dict[int, list[int]] = {}  # group -> participants of its running sync
        self._revisions: dict[int, int] = {}  # group -> last elected revision
        self._failed: dict[int, dict[int, str]] = {}  # group -> failed part -> why (running sync)

    def voters(self) -> list[int]:
        """Peers whose sync vote is counted (they wait for the sync to start)."""
        return list(self._votes)

    def withdraw(self, conn: int, group: int | None = None,
                 out: list[Action] | None = None) -> None:
        """Take back ``conn``'s counted vote (deadlock: the sync can never start; or the
        caller gave up). With ``group`` and ``out``, a sync it already takes part in counts
        as failed for it (as a failed ``SyncDone``)."""
        self._votes.pop(conn, None)
        if group is not None and out is not None and conn in self._syncing:
            if conn in self._parts.get(group, ()):
                self._parts[group].remove(conn)  # it hears nothing more of this sync
            self._failed.setdefault(group, {})[conn] = "gave up waiting"
            self._syncing.discard(conn)
            self._check_done(group, out)

    def revisions(self) -> dict[int, int]:
        """Group -> its last elected revision."""
        return dict(self._revisions)

    def syncing(self) -> list[int]:
        """Peers that got a ``SyncPlan`` and have not reported ``SyncDone`` yet, ascending."""
        return sorted(self._syncing)

    def voted(self, conn: int) -> bool:
        """``conn``'s sync vote is counted (it waits for the sync to start)."""
        return conn in self._votes

    def voted_any(self) -> bool:
        """Some sync vote is counted."""
        return bool(self._votes)

    def busy(self, conn: int) -> bool:
        """True while ``conn`` has a sync vote counted or has not finished its sync part."""
        return conn in self._votes or conn in self._syncing

    def vote(self, conn: int, group: int, vote: m.VoteSync, out: list[Action]) -> None:
        """Count ``conn``'s vote; starts the group's sync once every member voted."""
        if self.busy(conn):
            raise RemoteProtocolError("sync vote while another operation is running")
        if vote.strategy not in _STRATEGIES:  # the election could not even name it
            raise RemoteProtocolError(f"unknown shared-state sync strategy {vote.strategy}")
        self._votes[conn] = vote
        self._check_start(group, out)

    def done(self, conn: int, group: int, out: list[Action], ok: bool = True,
             reason: str = "") -> None:
        """``conn`` finished its part (``SyncDone``); completes the sync once all did: with
        ``SyncComplete``, or ``SyncFailed`` for everyone if any part failed."""
        if conn not in self._syncing:
            raise RemoteProtocolError("SyncDone outside a sync")
        self._syncing.discard(conn)
        if not ok:
            self._failed.setdefault(group, {})[conn] = reason[:200]
        self._check_done(group, out)


    def resume(self, group: int, revision: int) -> None:
        """A rebuilt run: the group's last revision as its peers hold it (the next sync
        keeps it or advances it by one)."""
        self._revisions[group] = max(self._revisions.get(group, revision), revision)

    def drop(self, conn: int, group: int) -> None:
        """Forget a departed peer's vote and its part (then ``check`` its group); a group
        left without members starts afresh (from any revision)."""
        if not self._roster.accepted(group):
            self._revisions.pop(group, None)
        self._votes.pop(conn, None)
        self._syncing.discard(conn)
        for failed in self._failed.values():  # a part that left does not fail the others
            failed.pop(conn, None)
        for group, parts in list(self._parts.items()):
            if conn in parts:
                parts.remove(conn)
                if not parts:
                    del self._parts[group]

    def check(self, group: int, out: list[Action]) -> None:
        """Re-evaluate both steps after the group's membership changed."""
        self._check_start(group, out)
        self._check_done(group, out)

    def _check_start(self, group: int, out: list[Action]) -> None:
        members = self._roster.accepted(group)
        if not members or len(self._votes) < len(members) or any(
                c not in self._votes for c in members):
            return
        votes = {c: self._votes.pop(c) for c in members}
        e = elect(votes, self._revisions.get(group))
        alive = [c for c in members if c not in e.kicks]
        kicked = [f"peer {c} was kicked: {why}" for c, why in sorted(e.kicks.items())]
        if e.failed:
            out.extend(Send(c, m.SyncFailed(e.failed)) for c in alive)
        else:
            self._revisions[group] = e.revision
            self._parts[group] = alive
            self._syncing.update(alive)
            srcs = [self._roster.addr(c) for c in e.sources]
            fetchers = [c for c in alive if c in e.plans and e.plans[c].keys]
            for c in alive:
                plan = e.plans.get(c)
                keys, hashes = (plan.keys, plan.hashes) if plan else ([], [])
                out.append(Send(c, m.SyncPlan(e.revision, keys, hashes, srcs, fetchers,
                                              kicked)))
        for c, reason in e.kicks.items():
            self._roster.kick(c, reason, out)

    def _check_done(self, group: int, out: list[Action]) -> None:
        parts = self._parts.get(group)
        if parts is None or any(c in self._syncing for c in parts):
            return
        del self._parts[group]
        failed = self._failed.pop(group, None)
        if failed:
            c, reason = min(failed.items())
            why = f"peer {c}'s part failed ({reason}); every peer retries the sync"
            out.extend(Send(c, m.SyncFailed(why, True)) for c in parts)
        else:
            out.extend(Send(c, m.SyncComplete(self._revisions[group])) for c in parts)
