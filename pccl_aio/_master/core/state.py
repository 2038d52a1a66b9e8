"""The master's whole logic, sans-IO: events in, actions out.

Rule 1: every membership transition lives here (``admit``, ``close``, ``publish``,
``restore``). Collectives, sync barrier, optimizer, joint votes and fail-over are objects it
holds, each reaching it through a narrow Protocol; ``deadlock.py`` (when ``quiet.py`` cannot
rule it out) finds the calls that wait forever, this fails them. Rule 2: time arrives only
through ``Event.now`` (sans-IO: ``test_layering.py`` checks it).

Theory of operation. A connection becomes a peer with ``Hello``. The first peer (with its
replica's other processes, once all registered) is accepted at once (a rebuilt run's members
when the rebuild ends: ``failover.py``); later ones stay *pending* until every member votes
``VoteUpdateTopology`` (``joint.py``; a replica's processes together). A collective of a
group starts when every member of the group voted for it with one descriptor; every voter
gets one terminal message (``collectives.py``). ``VoteSync`` and ``VoteOptimize`` are votes
of a group (``barrier.py``, ``topology.py``); ``WithdrawVote`` takes one back. After every
event, calls that can never complete fail at once; at each tick a peer silent for
``heartbeat_timeout`` is dropped and a lone holdout of a vote is kicked (``withheld.py``).
Anything illegal gets ``Kicked`` and a ``Close``, never an exception out of ``handle``;
what hostile clients and members can make the master hold is bounded (``limits.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..._errors import RemoteProtocolError
from ..._wire import messages as m
from .access import StateAccess
from .barrier import SyncBarrier
from .collectives import Collectives
from .deadlock import find
from .events import (
    Action,
    Close,
    Connected,
    Disconnected,
    Event,
    Heard,
    Malformed,
    Received,
    Rejoining,
    Send,
    Tick,
)
from .failover import Failover
from .joint import JointVotes
from .limits import Admission, Limits
from .quiet import Quiet
from .records import Peer, membership, registration_error, version_reason
from .recovery import Outcome
from .topology import Topology
from .withheld import VoteTimer

__all__ = ["Action", "Close", "Connected", "Disconnected", "Event", "Heard", "Malformed",
           "MasterState", "Received", "Rejoining", "Send", "Tick"]

_MEMBERS_ONLY = (m.VoteUpdateTopology, m.VoteOptimize, m.MeasureReport, m.VotePeersPending,
                 m.CollectiveInit, m.CollectiveWait, m.VoteSync, m.CollectiveDone)


class MasterState:
    """Membership, votes and collective bookkeeping of one run. Single-threaded, no I/O."""

    def __init__(self, *, heartbeat_timeout: float = 5.0, max_collectives_per_peer: int = 1024,
                 max_pending_peers: int = 256, hello_timeout: float = 5.0,
                 admission_interval: float = 1.0, allow_any_advertise_host: bool = False,
                 run_id: str = "", recovery_grace: float | None = None,
                 vote_timeout: float | None = None) -> None:
        """Keywords: bounds on hostile clients and members (``limits.Limits``,
        ``withheld.VoteTimer``) and fail-over's (``failover.Failover``)."""
        self.heartbeat_timeout = heartbeat_timeout
        self.limits = Limits(max_collectives_per_peer=max_collectives_per_peer,
                             max_pending_peers=max_pending_peers, hello_timeout=hello_timeout,
                             admission_interval=admission_interval,
                             allow_any_advertise_host=allow_any_advertise_host)
        self._admission = Admission(self.limits)
        self.now = 0.0  # of the event being handled
        self.epoch = 0
        self._peers: dict[int, Peer] = {}
        self.access = StateAccess(self)  # also the status page's, metrics' and log lines'
        self._colls = Collectives(self.access, max_collectives_per_peer)
        self._sync = SyncBarrier(self.access)
        self._topo = Topology(self.access)
        self._fo = Failover(self, run_id, 2 * heartbeat_timeout if recovery_grace is None
                            else recovery_grace)
        self._votes = JointVotes(self.access)
        self._withheld = VoteTimer(vote_timeout)
        self._left = False  # the departure being handled said goodbye
        self._rosters: dict[int | None, tuple[int, ...]] = {}  # ``roster``'s, while valid
        self._quiet = Quiet()  # (``_settle``)

    # ---- queries (used by tests, the CLI's log lines and the demo) ----------------------------
    def accepted(self, group: int | None = None) -> list[int]:
        """Accepted peers (of ``group``), ascending (the ring order is ``ring``)."""
        return list(self.roster(group))

    def roster(self, group: int | None = None) -> tuple[int, ...]:
        """``accepted`` as a tuple, kept (the same object) until membership changes."""
        if (got := self._rosters.get(group)) is None:
            got = self._rosters[group] = tuple(sorted(
                c for c, p in self._peers.items() if p.accepted and group in (None, p.group)))
        return got

    def ring(self, group: int) -> list[int]:
        """The group's accepted peers in ring order (join order until optimized)."""
        return self._topo.order(group, self.accepted(group))

    def links(self) -> dict[tuple[int, int], tuple[float, float]]:
        """Measured links: (src, dst) -> (bits/s, one-way latency s); 0 bits/s: unreachable."""
        return dict(self._topo.links)

    def pending(self) -> list[int]:
        """Registered peers waiting for admission."""
        return sorted(self._admission.joiners)

    def allocate(self, wanted: int = 0, refused: bool = False) -> int:
        """The peer id of a new connection (``Failover.allocate``)."""
        return self._fo.allocate(wanted, self._peers, refused)

    def probe(self) -> m.ProbeAnswer:
        """What this master tells a ``Probe``: its term, run and member count."""
        return self._fo.probe()

    @property
    def term(self) -> int:  # 0 until this master serves a run (``failover.py``)
        return self._fo.term

    @property
    def run_id(self) -> str:
        """The run this master serves ("": none yet)."""
        return self._fo.run_id

    def running(self, group: int) -> dict[int, int]:  # tag -> seq of those started
        return self._colls.running(group)

    # ---- membership transitions (``failover.Master`` too) ------------------------------------
    def registered(self) -> list[int]:
        """Every peer that said ``Hello`` (members and joiners)."""
        return [c for c, p in self._peers.items() if p.registered]

    def admit(self, conns: Iterable[int] | None = None) -> list[int]:
        """Accept ``conns`` (default: the joiners of complete replicas); returns them."""
        conns = self._admission.ready() if conns is None else list(conns)
        for c in conns:
            self._peers[c].accepted = True
            self._admission.admitted(c)
        self._rosters.clear()
        return conns

    def publish(self, out: list[Action]) -> int:
        """A new epoch, its ``Membership`` to every member; returns the epoch."""
        self.epoch += 1
        out.extend(self._membership(self.accepted()))
        return self.epoch

    def close(self, conns: list[int], reason: str, out: list[Action]) -> None:
        """End these sessions (``Close``, departure), the first as one that said goodbye
        (``Leave``: no rebuild waits for it; a master that steps down drops any rebuild)."""
        self._left = True
        for c in conns:
            self._close(c, reason, out)

    def restore(self, outcome: Outcome) -> None:
        """Take a rebuilt run's rings, revisions and floors; the registered peers that are
        not members wait for admission."""
        self.epoch = max(self.epoch, outcome.epoch)
        self._quiet.everything()
        self._colls.floor(outcome.max_seq)
        for c in self.registered():
            if not self._peers[c].accepted:
                self._admission.registered(c, joiner=True)
        for g, ring in outcome.rings.items():
            self._topo.restore(g, ring)
        for g, rev in outcome.revisions.items():
            self._sync.resume(g, rev)
        self._votes.floor(outcome.rounds)

    # ---- entry point ----------------------------------------------------------------------------
    def handle(self, event: Event) -> list[Action]:
        """Apply one event; return the actions the transport must perform, in order."""
        out: list[Action] = []
        self.now = event.now
        if isinstance(event, Tick | Rejoining | Heard):
            self._quiet.everything()  # (they may change many peers at once)
        match event:
            case Connected(conn=conn, host=host, now=now):
                self._peers[conn] = Peer(conn=conn, host=host, last_seen=now)
                self._admission.connected(conn, now)
            case Received(conn=conn, msg=msg, now=now):
                peer = self._peers.get(conn)
                if peer is None:
                    return out
                peer.last_seen = now
                live = self._admission.heard(conn)
                if isinstance(msg, m.Heartbeat):
                    if live:
                        self._announce(out)
                    return out
                self._quiet.touch(conn)
                try:
                    self._on_message(peer, msg, out)
                except RemoteProtocolError as exc:
                    self._kick(conn, str(exc), out)
                self._settle(out)
                self._announce(out)
            case Malformed(conn=conn, reason=reason, body=body):
                version = m.peek_hello_version(body) if body else None
                peer = self._peers.get(conn)
                if version not in (None, m.PROTOCOL_VERSION) and peer and not peer.registered:
                    self._kick(conn, version_reason(version), out, refuse=True)
                elif conn in self._peers:
                    self._kick(conn, reason, out)
                else:
                    out.append(Close(conn, reason))
                self._settle(out)
                self._announce(out)
            case Disconnected(conn=conn):
                self._remove(conn, out)
                self._settle(out)
                self._announce(out)
            case Rejoining(msg=msg):
                self._fo.take_over(msg, out)
            case Heard(answer=answer, where=where):
                self._fo.heard(answer, where, out)
            case Tick(now=now, beacon=beacon):
                for c in self._admission.expired(now):
                    self._close(c, f"no Hello within {self.limits.hello_timeout:g} s", out)
                for peer in list(self._peers.values()):
                    if now - peer.last_seen > self.heartbeat_timeout:
                        self._close(peer.conn, "heartbeat timeout", out)
                self._topo.tick(now, out)
                for c, why in self._withheld.check(self.access, now):
                    self._kick(c, why, out)
                self._fo.check(out)
                self._settle(out)
                self._announce(out)
                out.extend(Send(c, b) for b in [m.MasterHeartbeat()] if beacon for c in self._peers)
        return out

    # ---- messages -------------------------------------------------------------------------------
    def _on_message(self, peer: Peer, msg: m.PeerToMaster, out: list[Action]) -> None:
        if isinstance(msg, m.Hello):
            self._on_hello(peer, msg, out)
            return
        if isinstance(msg, m.WithdrawVote):
            self._withdraw(peer, msg.kind, out)
            return
        if not peer.registered:
            raise RemoteProtocolError(f"{type(msg).__name__} before Hello")
        if isinstance(msg, _MEMBERS_ONLY) and not peer.accepted:
            raise RemoteProtocolError(f"{type(msg).__name__} from a peer not yet accepted")
        match msg:  # (the collectives' messages first: most of them)
            case m.CollectiveInit():
                self._colls.vote(peer, msg)
                self._votes.conflict(out)
                self._colls.check_start(peer.group, msg.tag, out)
                if msg.awaited:  # an init, then its wait (as two messages: the launch holds
                    self._settle(out)  # a vote back before it waits)
                    self._colls.wait(peer, msg.tag)
                    self._quiet.touch(peer.conn)
            case m.CollectiveWait():
                self._colls.wait(peer, msg.tag)
            case m.CollectiveDone():
                self._colls.done(peer, msg, out)
            case m.Leave():
                self.close([peer.conn], "left", out)
            case m.VoteUpdateTopology():
                if peer.voted_topology or peer.tags or self._topo.busy(peer.conn):
                    raise RemoteProtocolError(
                        "update_topology vote while already voting or with collectives running")
                if not self._fo.owed(peer.conn, "topology", out):
                    self._votes.vote(peer, "topology", out)
            case m.VoteOptimize():
                if peer.voted_topology or peer.tags or self._sync.busy(peer.conn):
                    raise RemoteProtocolError(
                        "optimize_topology vote while another operation is running")
                self._topo.vote(peer.conn, peer.group, self.now, out)
            case m.MeasureReport():
                self._topo.report(peer.conn, peer.group, msg, self.now, out)
            case m.VotePeersPending():
                if peer.voted_pending:
                    raise RemoteProtocolError("duplicate peers-pending vote")
                if not self._fo.owed(peer.conn, "pending", out):
                    self._votes.vote(peer, "pending", out)
            case m.VoteSync():
                if peer.tags or peer.voted_topology:
                    raise RemoteProtocolError("sync vote while another operation is running")
                self._sync.vote(peer.conn, peer.group, msg, out)
            case m.SyncDone():
                self._sync.done(peer.conn, peer.group, out, msg.ok, msg.reason)

    def _withdraw(self, peer: Peer, kind: m.VoteKind, out: list[Action]) -> None:
        """Take back a counted vote (no error if it already ended or never was); ack it."""
        if kind == "topology" or kind == "pending":
            self._votes.withdraw(peer, kind)
        elif kind == "optimize":
            if peer.accepted:
                self._topo.withdraw(peer.conn, peer.group, out)
        elif peer.accepted:
            self._sync.withdraw(peer.conn, peer.group, out)
        if peer.registered:  # the answers of the withdrawn vote came before this one
            out.append(Send(peer.conn, m.VoteWithdrawn(kind)))

    def _on_hello(self, peer: Peer, msg: m.Hello, out: list[Action]) -> None:
        if peer.registered:
            raise RemoteProtocolError("second Hello")
        if msg.version != m.PROTOCOL_VERSION:
            self._kick(peer.conn, version_reason(msg.version), out, refuse=True)
            return
        if not (0 <= msg.peer_group < 2**32 and 0 < msg.p2p_port < 65536
                and 0 <= msg.state_port < 65536):  # (decoding checks it: for direct callers)
            raise RemoteProtocolError("Hello with an invalid peer group or port")
        host = msg.advertise_host or peer.host
        other = next((p for p in self._peers.values() if p.registered), None)
        why = registration_error(msg, peer.host, other, self.limits.allow_any_advertise_host)
        if why is None and (self.accepted() or msg.replica) and self._admission.full():
            why = "too many peers waiting to join"
        why = why or self._fo.screen(msg, out)
        if why is not None:
            self._kick(peer.conn, why, out, refuse=True)
            return
        peer.host, peer.port, peer.group, peer.registered = host, msg.p2p_port, msg.peer_group, True
        peer.state_port, peer.tls = msg.state_port, msg.tls
        at = len(out)  # its Welcome goes before what ``joined`` tells it (aborted doubts)
        first, joiner, member = self._fo.joined(peer.conn, peer.group, msg, out,
                                                self._admission.completes(msg))
        peer.accepted = first
        self._rosters.clear()
        self._admission.registered(peer.conn, joiner, msg.replica, msg.replica_size)
        out.insert(at, Send(peer.conn, m.Welcome(peer.conn, first, term=self.term,
                                                 run_id=self.run_id, rebuild=member)))
        if first:  # the only member, with the rest of its replica (nobody else to admit them)
            self.admit(self._admission.ready(msg.replica) if msg.replica else ())
            self.publish(out)
        self._fo.check(out)

    # ---- consensus ----------------------------------------------------------------------------
    def _membership(self, conns: list[int]) -> list[Action]:
        groups = sorted({p.group for p in self._peers.values() if p.accepted})
        self._colls.new_epoch(self.epoch, {g: self.ring(g) for g in groups})
        accepted = [self._peers[c] for g in groups for c in self.ring(g)]
        rounds = (self._votes.rounds["pending"], self._votes.rounds["topology"])
        out: list[Action] = [Send(c, msg) for c, msg in membership(
            self.epoch, accepted, conns, self.term, rounds)]
        if self._admission.announced and self._admission.due(self.now):  # a new member learns it
            out.extend(Send(c, m.PeersWaiting(True)) for c in conns)
        return out

    def _announce(self, out: list[Action]) -> None:
        """After an event: tell the members when joiners become due or stop (``PeersWaiting``)."""
        due = self._admission.due(self.now)
        if due != self._admission.announced:
            self._admission.announced = due
            out.extend(Send(c, m.PeersWaiting(due)) for c in self.accepted())

    def _settle(self, out: list[Action]) -> None:
        """After an event: fail every call of the peers that wait forever (``deadlock.find``,
        run when ``quiet.Quiet`` cannot rule a deadlock out; ``StateAccess.fail``)."""
        if not self._quiet.settled(self.access):
            self.access.fail(find(self.access), out)

    # ---- departures -----------------------------------------------------------------------------
    def _kick(self, conn: int, reason: str, out: list[Action], refuse: bool = False) -> None:
        """End a session for a protocol violation (``Kicked``) or refuse a registration
        (``refuse``: ``Rejected``): the message, ``Close``, departure."""
        out.append(Send(conn, m.Rejected(reason) if refuse else m.Kicked(reason)))
        self._close(conn, reason, out)

    def _close(self, conn: int, reason: str, out: list[Action]) -> None:
        out.append(Close(conn, reason))
        self._remove(conn, out)

    def _remove(self, conn: int, out: list[Action]) -> None:
        try:
            self._depart(conn, out)
        finally:
            self._left = False

    def _depart(self, conn: int, out: list[Action]) -> None:
        peer = self._peers.pop(conn, None)
        self._rosters.clear()
        self._quiet.touch(conn)
        self._votes.forget(conn)
        self._admission.forget(conn)
        self._fo.forget(conn, out)
        if peer is None or not peer.accepted:
            return
        self._sync.drop(conn, peer.group)
        self._topo.drop(conn, peer.group)
        self.publish(out)  # first: when a survivor sees the abort, its world size is fresh
        self._colls.depart(conn, peer.group, out)
        if not self.accepted() and not self._left:  # the last member vanished, no goodbye
            self._fo.await_members(conn)  # (it and the others may be about to rejoin)
        elif not self.accepted() and self._admission.ready():
            self.admit()  # nobody is left to vote the waiting peers in: admit them now
            self.publish(out)
            return
        self._votes.check(out)
        self._sync.check(peer.group, out)
        self._topo.check(peer.group, self.now, out)
