"""The run's story as the master sees it: log lines, counters and recent events.

``Story.observe`` reads each event the master handles and the actions its state answered
with (``core.state.MasterState`` stays sans-IO and knows nothing of this) and turns them into
one log line per run event, with its cause and the run, peer and group ids (INFO: joins,
departures with their cause, rings, aborts, rejections, syncs that moved data; DEBUG: the
rest), into plain counters (``Counts``, read by ``/metrics`` and ``/status.json`` at scrape
time) and into a short list of recent notable events for the status page. It never raises
into the master and costs a dictionary lookup per action on the hot path.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import time
from typing import Any

from .. import _log
from .._text import plural
from .._types import DTYPE_ITEMSIZE, CollectiveKind, DataType
from .._wire import messages as m
from .._wire import recovery as r
from .core import state as ms
from .core.records import describe

__all__ = ["Counts", "Member", "Story"]

log = logging.getLogger("pccl_aio.master")

RECENT = 50  # notable events kept for the status page


@dataclasses.dataclass(slots=True)
class Member:
    """A registered peer as the story knows it (host, group, since when, admitted)."""

    host: str
    group: int
    since: float  # wall clock (time.time) of its registration
    accepted: bool = False


@dataclasses.dataclass(slots=True)
class Counts:
    """Monotonic counters of the run (labels as dict keys)."""

    started: int = 0
    completed: int = 0
    reduced_bytes: int = 0  # payload bytes of completed collectives
    # (kind label, "started" | "completed") -> collectives, e.g. ("broadcast", "started")
    kinds: collections.Counter[tuple[str, str]] = dataclasses.field(
        default_factory=collections.Counter)
    aborted: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    rejected: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    votes: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    syncs: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    sync_bytes: int = 0  # bytes fetched by peers in syncs (as planned)
    joins: int = 0
    departures: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)


@dataclasses.dataclass(slots=True)
class LastSync:
    """A group's last shared-state sync: revision, winner's hash fingerprint, who fetched."""

    revision: int = -1
    fingerprint: str = ""
    fetchers: list[int] = dataclasses.field(default_factory=list)
    agreed: bool = True  # every voter held the winning content already
    completed: bool = False
    at: float = 0.0


def cause_of(reason: str) -> str:
    """A label for an abort's reason (metrics): ``peer_left``, ``peer_failed``,
    ``mismatch``, ``too_few``, ``withdrawn``, ``deadlock`` or ``other``."""
    if "left the run" in reason:
        return "peer_left"
    if "failed" in reason:
        return "peer_failed"
    if "disagree" in reason:
        return "mismatch"
    if "too few" in reason:
        return "too_few"
    if "wait on each other" in reason or "deadlock" in reason:
        return "deadlock"
    return "withdrawn" if reason.startswith("peer ") else "other"


def departure_cause(reason: str, kicked: bool, refused: bool) -> str:
    """A label for why a peer went: ``left``, ``heartbeat``, ``closed``, ``kicked``,
    ``refused``, ``superseded`` or ``other``."""
    if kicked:
        return "kicked"
    if refused:
        return "refused"
    if reason == "left":
        return "left"
    if reason == "heartbeat timeout":
        return "heartbeat"
    if reason == "connection closed":
        return "closed"
    return "superseded" if "term" in reason else "other"


class Story:
    """Observer of one master's ``MasterState`` (see the module docstring)."""

    def __init__(self, state: ms.MasterState) -> None:
        self._state, self._access = state, state.access
        self.members: dict[int, Member] = {}
        self.counts = Counts()
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=RECENT)
        self.syncs: dict[int, LastSync] = {}  # group -> its last sync
        self.rings: dict[int, list[int]] = {}  # group -> ring as last logged
        self._epoch = 0
        self._votes: dict[int, m.VoteSync] = {}  # conn -> its last sync vote
        # seq -> payload bytes (per rank) and kind of a running collective
        self._bytes: dict[int, tuple[int, str]] = {}

    # ---- entry point --------------------------------------------------------------------------
    def observe(self, event: ms.Event, actions: list[ms.Action]) -> None:
        """Account for ``event`` and the ``actions`` it produced (before they are sent)."""
        try:
            if isinstance(event, ms.Received) and isinstance(event.msg, m.VoteSync):
                self._votes[event.conn] = event.msg
            if isinstance(event, ms.Disconnected) and event.conn in self.members:
                self._gone(event.conn, "connection closed", "closed")  # before its new ring
            if actions:
                self._actions(actions)
        except Exception:  # a bug here must never take the master down
            log.exception("status bookkeeping failed (the run is not affected)")

    def _actions(self, actions: list[ms.Action]) -> None:
        seen: set[tuple[type, int, int]] = set()  # (type, seq, tag) counted in this batch
        kicked: set[int] = set()
        refused: dict[int, str] = {}
        for act in actions:
            if isinstance(act, ms.Close):
                if act.conn in self.members or act.conn in refused:
                    self._close(act.conn, act.reason, act.conn in kicked, refused.get(act.conn))
                continue
            msg, conn = act.msg, act.conn
            if type(msg) is m.MasterHeartbeat:  # (a tick's beacons: one per peer)
                continue
            key = (type(msg), getattr(msg, "seq", 0), getattr(msg, "tag", 0))
            if key in seen:  # one message to every participant: one story event
                continue
            match msg:
                case m.MeasurePlan() | m.VoteWithdrawn():
                    continue
                case m.CollectiveStart() | m.CollectiveComplete():
                    self._collective(conn, msg)
                case m.CollectiveAbort() | m.CollectiveRejected():
                    self._failed(conn, msg)
                case m.Membership():
                    self._membership(msg)
                case m.Welcome():
                    self._welcome(conn, msg)
                    continue
                case m.Kicked():
                    kicked.add(conn)
                    continue
                case m.Rejected():
                    refused[conn] = msg.reason
                    continue
                case m.SyncPlan() | m.SyncComplete() | m.SyncFailed():
                    self._sync(conn, msg, actions)
                case m.TopologyUpdated() | m.PeersPendingAnswer() | m.TopologyOptimized():
                    self._vote(msg)
                case m.VoteRejected():
                    self.counts.votes[f"{msg.kind}_rejected"] += 1
                    self._note(logging.INFO, "vote_rejected", "%s votes rejected: %s",
                               msg.kind, msg.reason, peer=conn, kind=msg.kind)
                case r.Superseded() if msg.reason == r.REBUILT_WITHOUT:
                    self._note(logging.WARNING, "demoted", "peer %d rejoined as a member of a "
                               "run rebuilt without it: it joins again", conn, peer=conn)
                    continue
                case r.Superseded():
                    self._note(logging.WARNING, "stepped_down", "stepping down: %s",
                               msg.reason or "a master of a higher term", term=msg.term)
                case _:
                    continue
            seen.add(key)

    # ---- membership ---------------------------------------------------------------------------
    def _welcome(self, conn: int, msg: m.Welcome) -> None:
        peer = self._access.peer(conn)
        host, group = (peer.host, peer.group) if peer else ("?", 0)
        self.members[conn] = Member(host, group, time.time(), msg.accepted)
        self.counts.joins += 1
        if msg.accepted:
            what = "joined as the first member"
        elif msg.rebuild:
            what = f"rejoined (rebuilding the run at term {msg.term})"
        else:
            what = "registered, waiting for admission"
        self._note(logging.INFO, "registered", "peer %d from %s (group %d) %s", conn, host,
                   group, what, peer=conn, group=group, host=host)

    def _membership(self, msg: m.Membership) -> None:
        if msg.epoch == self._epoch:
            return
        self._epoch = msg.epoch
        admitted = [c for c in self._state.accepted()
                    if c in self.members and not self.members[c].accepted]
        for c in admitted:
            self.members[c].accepted = True
            self._note(logging.INFO, "admitted", "peer %d admitted", c, peer=c,
                       group=self.members[c].group)
        rings = {g: self._state.ring(g) for g in self._access.groups()}
        for g, ring in rings.items():
            if self.rings.get(g) != ring:
                self._note(logging.INFO, "ring", "group %d ring %s (epoch %d, world size %d)",
                           g, ring, msg.epoch, msg.global_world_size, group=g, ring=ring,
                           epoch=msg.epoch)
        self.rings = rings
        if self._bytes:  # collectives aborted for nobody (their peers all went) leave none
            running = self._access.running_seqs()
            self._bytes = {s: b for s, b in self._bytes.items() if s in running}

    def _close(self, conn: int, reason: str, kicked: bool, refused: str | None) -> None:
        cause = departure_cause(reason, kicked, refused is not None)
        if refused is not None and conn not in self.members:
            self.counts.departures["refused"] += 1
            self._note(logging.INFO, "refused", "refused connection %d: %s", conn, refused,
                       peer=conn, cause="refused")
            return
        self._gone(conn, reason, cause)

    def _gone(self, conn: int, reason: str, cause: str) -> None:
        member = self.members.pop(conn)
        self._votes.pop(conn, None)
        self.counts.departures[cause] += 1
        words = {"left": "left the run", "heartbeat": "dead: no heartbeat",
                 "closed": "dead: its connection closed", "kicked": f"kicked: {reason}",
                 "refused": f"refused: {reason}"}.get(cause, f"dropped: {reason}")
        self._note(logging.INFO, "departed", "peer %d %s", conn, words, peer=conn,
                   group=member.group, cause=cause, reason=reason)

    # ---- collectives, votes, syncs ------------------------------------------------------------
    def _collective(self, conn: int, msg: m.CollectiveStart | m.CollectiveComplete) -> None:
        if isinstance(msg, m.CollectiveStart):
            self.counts.started += 1
            group = self.members[conn].group if conn in self.members else 0
            desc = self._access.descriptor(group, msg.tag)
            if desc is not None:
                kind = CollectiveKind(desc[5]).label
                self.counts.kinds[(kind, "started")] += 1
                self._bytes[msg.seq] = (desc[0] * DTYPE_ITEMSIZE.get(DataType(desc[1]), 1),
                                        kind)
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("collective tag %d seq %d started: %s", msg.tag, msg.seq,
                              describe(desc), extra=self._ids(group=group))
            return
        self.counts.completed += 1
        nbytes, kind = self._bytes.pop(msg.seq, (0, ""))
        self.counts.reduced_bytes += nbytes
        if kind:
            self.counts.kinds[(kind, "completed")] += 1

    def _failed(self, conn: int, msg: m.CollectiveAbort | m.CollectiveRejected) -> None:
        group = self.members[conn].group if conn in self.members else 0
        if isinstance(msg, m.CollectiveAbort):
            cause = cause_of(msg.reason)
            self.counts.aborted[cause] += 1
            kind = self._bytes.pop(msg.seq, (0, "collective"))[1]  # (not started: unknown)
            self._note(logging.INFO, "aborted", "%s tag %d seq %d aborted: %s", kind,
                       msg.tag, msg.seq, msg.reason, group=group, tag=msg.tag, seq=msg.seq,
                       cause=cause)
        else:
            cause = "deadlock" if msg.deadlock else cause_of(msg.reason)
            self.counts.rejected[cause] += 1
            self._note(logging.INFO, "rejected", "collective tag %d rejected: %s", msg.tag,
                       msg.reason, group=group, tag=msg.tag, cause=cause)

    def _vote(self, msg: m.TopologyUpdated | m.PeersPendingAnswer | m.TopologyOptimized) -> None:
        if isinstance(msg, m.TopologyUpdated):
            self.counts.votes["update_topology"] += 1
            log.debug("update_topology round %d answered", msg.round, extra=self._ids())
        elif isinstance(msg, m.PeersPendingAnswer):
            self.counts.votes["are_peers_pending"] += 1
        elif isinstance(msg, m.TopologyOptimized):
            self.counts.votes["optimize_topology"] += 1
            self._note(logging.INFO, "optimized", "ring optimized to %s (%d links measured, "
                       "slowest %.3g Gbit/s)", list(msg.ring), msg.measured,
                       msg.bottleneck_bps / 1e9, ring=list(msg.ring))

    def _sync(self, conn: int, msg: m.SyncPlan | m.SyncComplete | m.SyncFailed,
              actions: list[ms.Action]) -> None:
        group = self.members[conn].group if conn in self.members else 0
        last = self.syncs.setdefault(group, LastSync())
        if isinstance(msg, m.SyncComplete):
            self.counts.syncs["completed"] += 1
            last.completed, last.at = True, time.time()
            log.debug("shared-state sync of group %d complete at revision %d", group,
                      msg.revision, extra=self._ids(group=group))
            return
        if isinstance(msg, m.SyncFailed):
            self.counts.syncs["failed"] += 1
            self._note(logging.INFO, "sync_failed", "shared-state sync of group %d failed: %s",
                       group, msg.reason, group=group)
            return
        self.counts.syncs["started"] += 1
        plans = {a.conn: a.msg for a in actions
                 if isinstance(a, ms.Send) and isinstance(a.msg, m.SyncPlan)}
        sources = [s.peer_id for s in msg.sources]
        winner = next((self._votes[s] for s in sources if s in self._votes), None)
        last.revision, last.fetchers = msg.revision, list(msg.fetchers)
        last.fingerprint = fingerprint(winner) if winner else ""
        last.agreed, last.completed = not msg.fetchers, False
        for c, plan in sorted(plans.items()):
            if not plan.keys:
                continue
            sizes = {e.key: e.nbytes for e in self._votes[c].entries} if c in self._votes else {}
            nbytes = sum(sizes.get(k, 0) for k in plan.keys)
            self.counts.sync_bytes += nbytes
            keys = ", ".join(plan.keys[:4]) + (", ..." if len(plan.keys) > 4 else "")
            self._note(logging.INFO, "sync_fetch", "shared-state sync of group %d, revision "
                       "%d: peer %d fetches %s (%s; %d B) from peers %s", group,
                       msg.revision, c, plural(len(plan.keys), "key"), keys, nbytes, sources,
                       peer=c, group=group, revision=msg.revision, bytes=nbytes,
                       sources=sources, keys=len(plan.keys))
        if not msg.fetchers:
            log.debug("shared-state sync of group %d, revision %d: every peer holds the same "
                      "content", group, msg.revision, extra=self._ids(group=group))

    # ---- output -------------------------------------------------------------------------------
    def _ids(self, peer: int = 0, group: int | None = None, **fields: Any) -> dict[str, Any]:
        return _log.ids(self._state.run_id, peer, group, **fields)

    def _note(self, level: int, event: str, fmt: str, *args: Any, peer: int = 0,
              group: int | None = None, **fields: Any) -> None:
        """Log one event and keep it for the status page."""
        log.log(level, fmt, *args, extra=self._ids(peer, group, event=event, **fields))
        if level >= logging.INFO:
            self.recent.append({"at": time.time(), "event": event, "text": fmt % args})


def fingerprint(vote: m.VoteSync) -> str:
    """A short hex digest of a sync vote's compared content (what "hashes agree" means)."""
    h = hashlib.blake2b(digest_size=6)
    for key, digest in sorted((e.key, e.hash) for e in vote.entries if not e.allow_inequality):
        h.update(key.encode())
        h.update(digest)
    return h.hexdigest()
