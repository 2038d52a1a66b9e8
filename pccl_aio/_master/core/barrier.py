"""Shared-state sync consensus of the master, sans-IO (a part of ``MasterState``).

Rules: a group's sync starts when every accepted member voted ``VoteSync``; ``_election.elect``
decides revision, kicks and plans; the sync completes (``SyncComplete`` to all) when every
participant still alive reported ``SyncDone``. A peer that leaves is dropped from both steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._wire import messages as m
from .election import elect
from .events import Action, Close, Send

if TYPE_CHECKING:
    from .state import _Peer


class SyncRules:
    """Mixin of MasterState: the shared-state votes and barrier."""

    _peers: dict[int, _Peer]
    _revisions: dict[int, int]
    _sync_parts: dict[int, list[int]]

    def accepted(self, group: int | None = None) -> list[int]:
        raise NotImplementedError

    def _remove(self, conn: int, out: list[Action]) -> None:
        raise NotImplementedError

    def _check_sync(self, group: int, out: list[Action]) -> None:
        members = self.accepted(group)
        if not members or any(self._peers[c].sync_vote is None for c in members):
            return
        votes = {c: self._peers[c].sync_vote for c in members}
        for c in members:
            self._peers[c].sync_vote = None
        e = elect({c: v for c, v in votes.items() if v is not None}, self._revisions.get(group))
        alive = [c for c in members if c not in e.kicks]
        if e.failed:
            out.extend(Send(c, m.SyncFailed(e.failed)) for c in alive)
        else:
            self._revisions[group] = e.revision
            self._sync_parts[group] = alive
            srcs = [m.PeerAddr(c, self._peers[c].host, self._peers[c].port,
                               self._peers[c].state_port) for c in e.sources]
            for c in alive:
                self._peers[c].syncing = True
                plan = e.plans.get(c)
                keys, hashes = (plan.keys, plan.hashes) if plan else ([], [])
                out.append(Send(c, m.SyncPlan(e.revision, keys, hashes, srcs)))
        for c, reason in e.kicks.items():
            out.append(Send(c, m.Kicked(reason)))
            out.append(Close(c, reason))
            self._remove(c, out)

    def _check_sync_done(self, group: int, out: list[Action]) -> None:
        parts = self._sync_parts.get(group)
        if parts is None:
            return
        live = [c for c in parts if c in self._peers]
        if any(self._peers[c].syncing for c in live):
            return
        del self._sync_parts[group]
        out.extend(Send(c, m.SyncComplete(self._revisions[group])) for c in live)
