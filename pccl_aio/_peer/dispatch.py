"""The master's messages as they change a ``ControlPlane`` (its reader calls ``dispatch``
for each, synchronously and in order)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._errors import DeadlockError, InvalidUsageError, PcclError, SharedStateError
from .._wire import messages as m

if TYPE_CHECKING:
    from .control import ControlPlane

__all__ = ["dispatch"]


def dispatch(self: ControlPlane, msg: m.MasterToPeer) -> None:
    """Apply one master message, synchronously and in the master's order."""
    match msg:
        case m.Membership():
            self.membership = msg
            self.term = max(self.term, msg.term)
            for kind, n in (("pending", msg.pending_round), ("topology", msg.topology_round)):
                self.heard[kind] = max(self.heard.get(kind, 0), n)
            if (msg.topology_round > self.rounds.get("topology", (0, True))[0]
                    and "topology" not in self._withdrawing and "topology" in self._votes):
                # the round that admits the joiners counted our vote: done (its answer,
                # which follows, may have been lost with the master)
                self.rounds["topology"] = (msg.topology_round, True)
                _resolve(self, "topology", None)
            self.tickets.void()
            self._on_membership(msg)
            if self._up is not None and not self._up.done():
                self._up.set_result(None)
                self.outage.end(self)
            self.arrivals.wake()
        case m.PeersWaiting(waiting=waiting):
            self.arrivals.told(waiting)
        case m.CollectiveStart(tag=tag, seq=seq):
            coll = self.colls.get(tag)
            if coll is not None and self.membership is not None:
                coll.on_start(seq, [p.peer_id for p in self.membership.ring], self.peer_id)
        case m.CollectiveComplete(tag=tag):
            self.tickets.issued(msg)
            if (coll := self.colls.get(tag)) is not None:
                coll.on_complete()
        case m.CollectiveAbort(tag=tag, seq=seq, reason=reason):
            coll = self.colls.get(tag)
            if coll is not None and not (seq and coll.seq and seq != coll.seq):
                coll.on_abort(reason)
        case m.CollectiveRejected(tag=tag, reason=reason, deadlock=deadlock):
            if (coll := self.colls.get(tag)) is not None:
                coll.on_rejected(reason, deadlock)
        case m.TopologyUpdated(round=n):
            if n and n <= self.rounds.get("topology", (0, True))[0]:
                return  # its Membership resolved the vote already (a new one may wait now)
            self.rounds["topology"] = (n, True)
            _resolve(self, "topology", None)
        case m.SyncPlan():
            self.sync = (msg.revision, None)
            _resolve(self, "sync", msg)
        case m.SyncFailed(reason=reason, completed=completed):
            self.sync = None
            exc = SharedStateError(f"shared-state sync failed: {reason}")
            _reject(self, "sync_done" if completed else "sync", exc)
        case m.VoteWithdrawn(kind=kind):
            if (n := self._withdrawing.get(kind, 0)) > 1:
                self._withdrawing[kind] = n - 1
            else:
                self._withdrawing.pop(kind, None)
        case m.SyncComplete():
            self.sync = None
            self.revision = msg.revision
            _resolve(self, "sync_done", msg)
        case m.VoteRejected(kind=kind, reason=reason, deadlock=deadlock):
            cls = DeadlockError if deadlock else InvalidUsageError
            _reject(self, kind, cls(f"{m.VOTE_CALLS.get(kind, kind)} failed: {reason}"))
        case m.PeersPendingAnswer(pending=pending, round=n):
            self.rounds["pending"] = (n, pending)
            _resolve(self, "pending", pending)
        case m.TopologyOptimized():
            _resolve(self, "optimize", msg)
        case m.MeasurePlan():
            if self.on_measure is not None:
                self.on_measure(msg)
        case _:
            pass  # MasterHeartbeat: liveness only

def _resolve(self: ControlPlane, kind: str, value: Any) -> None:
    if kind in self._withdrawing:  # a round that counted a vote taken back
        if kind in ("topology", "pending", "optimize"):
            fut = self._votes.pop(kind, None)
            if fut is not None and not fut.done():  # the next vote is out: it is this
                fut.set_result(value)               # round's, and its copy goes back
                self._withdraw(kind)
            else:
                self._carried[kind] = value
        return
    fut = self._votes.pop(kind, None)
    if fut is not None and not fut.done():
        fut.set_result(value)

def _reject(self: ControlPlane, kind: str, exc: PcclError) -> None:
    if kind in self._withdrawing:
        return
    fut = self._votes.pop(kind, None)
    if fut is not None and not fut.done():
        fut.set_exception(exc)
