"""The master's messages as they change the control plane (its reader calls ``dispatch``
for each, synchronously and in order). Votes' answers go through the vote book
(``core/votes.py``), whose answers the plane turns into completed futures."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..._errors import (
    DeadlockError,
    InvalidUsageError,
    KickedError,
    MasterConnectionError,
    PcclError,
    SharedStateError,
)
from ..._wire import messages as m
from ..core.config import PeerConfig
from ..data.core.tickets import Tickets
from .arrivals import Arrivals
from .core.votes import Settle, VoteBook, Withdraw

if TYPE_CHECKING:
    from ..data.collective import Collective
    from .failover import Outage

__all__ = ["Plane", "dispatch"]


class Plane(Protocol):
    """The control plane as the master's messages change it (``control.ControlPlane``)."""

    membership: m.Membership | None
    term: int
    run_id: str

    @property
    def config(self) -> PeerConfig: ...

    @property
    def peer_id(self) -> int: ...

    @property
    def colls(self) -> Mapping[int, Collective]: ...

    @property
    def tickets(self) -> Tickets: ...

    @property
    def arrivals(self) -> Arrivals: ...

    @property
    def outage(self) -> Outage: ...

    @property
    def votes(self) -> VoteBook[Any]: ...

    @property
    def on_measure(self) -> Callable[[m.MeasurePlan], None]: ...

    def settle(self, actions: Iterable[Settle[Any] | Withdraw]) -> None:
        """Do what the vote book answered (complete futures, take votes back)."""

    def admitted(self, msg: m.Membership) -> None:
        """After a ``Membership``: the communicator's turn, the end of an outage."""


def dispatch(cp: Plane, msg: m.MasterToPeer) -> PcclError | None:
    """Apply one master message, synchronously and in the master's order. Returns why the
    session ends (kicked, or the master stepped down), else None."""
    votes = cp.votes
    match msg:
        case m.Membership():
            cp.membership = msg
            cp.term = max(cp.term, msg.term)
            cp.settle(votes.membership(msg.pending_round, msg.topology_round))
            cp.tickets.void()
            cp.admitted(msg)
        case m.PeersWaiting(waiting=waiting):
            cp.arrivals.told(waiting)
        case m.CollectiveStart(tag=tag, seq=seq):
            coll = cp.colls.get(tag)
            if coll is not None and cp.membership is not None:
                coll.on_start(seq, [p.peer_id for p in cp.membership.ring], cp.peer_id)
        case m.CollectiveComplete(tag=tag):
            cp.tickets.issued(msg)
            if (coll := cp.colls.get(tag)) is not None:
                coll.on_complete()
        case m.CollectiveAbort(tag=tag, seq=seq, reason=reason):
            coll = cp.colls.get(tag)
            if coll is not None and not (seq and coll.seq and seq != coll.seq):
                coll.on_abort(reason)
        case m.CollectiveRejected(tag=tag, reason=reason, deadlock=deadlock):
            if (coll := cp.colls.get(tag)) is not None:
                coll.on_rejected(reason, deadlock)
        case m.TopologyUpdated(round=n):
            cp.settle(votes.topology_updated(n))
        case m.SyncPlan():
            cp.settle(votes.planned(msg))
        case m.SyncFailed(reason=reason, completed=completed):
            exc = SharedStateError(f"shared-state sync failed: {reason}")
            cp.settle(votes.sync_failed(completed, exc))
        case m.VoteWithdrawn(kind=kind):
            votes.withdrawn(kind)
        case m.SyncComplete():
            cp.settle(votes.sync_completed(msg))
        case m.VoteRejected(kind=kind, reason=reason, deadlock=deadlock):
            cls = DeadlockError if deadlock else InvalidUsageError
            cp.settle(votes.reject(kind, cls(f"{m.VOTE_CALLS[kind]} failed: {reason}")))
        case m.PeersPendingAnswer(pending=pending, round=n):
            cp.settle(votes.peers_pending(n, pending))
        case m.TopologyOptimized():
            cp.settle(votes.answer("optimize", msg))
        case m.MeasurePlan():
            cp.on_measure(msg)
        case m.Kicked(reason=reason):
            return KickedError(f"kicked by the master: {reason}")
        case m.Superseded(term=term, reason=reason):  # rejoin the run where it is, as a joiner
            cp.term = max(cp.term, term)
            cp.outage.demoted = True
            cp.run_id = cp.config.run_id
            return MasterConnectionError(f"the master stepped down: {reason}")
        case _:
            pass  # MasterHeartbeat: liveness only
    return None
