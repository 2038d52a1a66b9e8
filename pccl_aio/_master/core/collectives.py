"""The master's collectives, sans-IO: votes, starts, verdicts and tickets of every group's
tagged all-reduces (an object ``MasterState`` holds, as it holds the sync barrier).

Rules: a collective ``tag`` of a group starts when every accepted member voted
``CollectiveInit`` with one descriptor, as the tag's ticket seq if the ring is still the
ticket's (the early voters already run it so: the start confirms it), else as a fresh seq; it
completes when every participant reported ``CollectiveDone(ok)`` and is aborted (once, for
everyone) when a participant fails or leaves. Every voter gets exactly one terminal message
(``CollectiveComplete``, ``CollectiveAbort`` or ``CollectiveRejected``). A verdict of the
whole group hands out the tag's next ticket; a new epoch voids them all (``void_tickets``).
"""

from __future__ import annotations

import collections
from typing import Protocol

from ..._errors import RemoteProtocolError
from ..._wire import messages as m
from .events import Action, Send
from .records import Desc, Op, Peer, describe

__all__ = ["MAX_TICKETS", "Collectives", "Roster"]

#: Tickets a group holds at most (older ones are evicted); each peer holds as many.
MAX_TICKETS = 4096


class Roster(Protocol):
    """What the collectives need from the master's state."""

    @property
    def epoch(self) -> int:
        """The master's current epoch (membership version)."""

    def roster(self, group: int | None = None) -> tuple[int, ...]:
        """Accepted peers of ``group``, ascending."""

    def peer(self, conn: int) -> Peer | None:
        """The peer of connection ``conn``, if it is still there."""

    def kick(self, conn: int, reason: str, out: list[Action]) -> None:
        """End ``conn``'s session (a misbehaving member) and treat it as departed."""


class Collectives:
    """Every group's collectives by (group, tag) (``ops``), the seq counter and the tickets."""

    def __init__(self, roster: Roster, max_per_peer: int) -> None:
        self._roster = roster
        self._max = max_per_peer
        self.ops: dict[tuple[int, int], Op] = {}
        self._seq = 0
        self._tickets: dict[int, dict[int, tuple[int, int]]] = {}  # group -> tag -> seq, epoch
        self._rings: dict[int, tuple[list[int], int]] = {}  # group -> its ring, epoch since
        # (group, tag) -> (seq, participants) of its last aborted attempt: a stall report
        # that arrives after another participant's report aborted it still names the culprit
        self._aborted: collections.OrderedDict[tuple[int, int], tuple[int, tuple[int, ...]]] = (
            collections.OrderedDict())

    def running(self, group: int) -> dict[int, int]:
        """tag -> seq of the group's collectives that started."""
        return {t: op.seq for (g, t), op in self.ops.items() if g == group and op.seq}

    def floor(self, seq: int) -> None:
        """Number the next collectives above ``seq`` (a rebuilt run: above anything its
        peers saw, so that stale frames stay stale)."""
        self._seq = max(self._seq, seq)

    def new_epoch(self, epoch: int, rings: dict[int, list[int]]) -> None:
        """A new epoch: every ticket of the old ring is void, and a ranked collective launched
        before a group's ring changed can no longer start (``check_start``)."""
        self._tickets.clear()
        for g, ring in rings.items():
            if self._rings.get(g, (None, 0))[0] != ring:
                self._rings[g] = (ring, epoch)

    def vote(self, peer: Peer, msg: m.CollectiveInit) -> None:
        """Count ``peer``'s vote (the caller then checks conflicts and ``check_start``);
        raises RemoteProtocolError for an illegal one."""
        if msg.tag in peer.tags or peer.voted_topology:
            raise RemoteProtocolError(f"collective tag {msg.tag} already running")
        if len(peer.tags) >= self._max:
            raise RemoteProtocolError(f"more than {len(peer.tags)} collectives at once")
        op = self.ops.get((peer.group, msg.tag))
        if op is None:  # the first vote of this round takes the tag's ticket
            op = self.ops[(peer.group, msg.tag)] = Op(
                ticket=self._tickets.get(peer.group, {}).pop(msg.tag, (0, 0)))
        if op.seq:
            raise RemoteProtocolError(f"collective tag {msg.tag} already started")
        peer.tags.add(msg.tag)
        op.descs[peer.conn] = (msg.count, msg.dtype, msg.op, msg.quant_algo, msg.quant_dtype,
                               msg.kind, msg.root, msg.epoch)
        if msg.seq and msg.seq == op.ticket[0]:
            if msg.spoiled:  # it dropped frames of the ticket: start afresh
                op.ticket = (0, 0)
            else:
                op.early.add(peer.conn)  # else a void ticket: it follows the start

    def wait(self, peer: Peer, tag: int) -> None:
        """``CollectiveWait``: the voter now waits on ``tag`` (stale if it started or ended)."""
        op = self.ops.get((peer.group, tag))
        if op is not None and not op.seq and peer.conn in op.descs:
            op.waits.add(peer.conn)

    def done(self, peer: Peer, msg: m.CollectiveDone, out: list[Action]) -> None:
        """A participant's report; a stale one (of an attempt already ended) is ignored."""
        group, tag = peer.group, msg.tag
        op = self.ops.get((group, tag))
        if msg.stalled and (op is None or op.seq != msg.seq):  # an attempt aborted already
            seq, parts = self._aborted.get((group, tag), (0, ()))
            if msg.seq == seq and peer.conn in parts:
                self._stalled(peer.conn, msg.suspect, tag, parts, out)
            return
        if op is not None and not op.seq:
            if not msg.seq and not msg.ok and peer.conn in op.descs:  # withdrawn before start
                self.end_vote(group, tag, f"peer {peer.conn}: {msg.reason}", out, abort=True)
            elif msg.seq and peer.conn in op.early and msg.seq == op.ticket[0]:
                if msg.ok:  # an early start finished before the last vote arrived
                    op.done.add(peer.conn)
                else:
                    self.end_vote(group, tag, f"peer {peer.conn}: {msg.reason}", out,
                                  abort=True)
            return
        if op is None or op.seq != msg.seq or peer.conn not in op.descs:  # (its participants)
            return  # stale: the op was aborted before this report arrived
        if msg.ok:
            op.done.add(peer.conn)
            self._check_complete(group, tag, out)
        elif msg.stalled and self._stalled(peer.conn, msg.suspect, tag, op.participants, out):
            return  # its departure aborted the attempt for the others
        else:
            self.abort(group, tag, f"peer {peer.conn} failed: {msg.reason}", out)

    def _stalled(self, reporter: int, suspect: int, tag: int, parts: tuple[int, ...],
                 out: list[Action]) -> bool:
        """``reporter`` got nothing of an attempt from its predecessor ``suspect`` within the
        data timeout: a participant that voted and sends no data is kicked (True)."""
        if suspect == reporter or suspect not in parts or self._roster.peer(suspect) is None:
            return False
        self._roster.kick(suspect, f"sent no data of collective tag {tag} to peer {reporter} "
                          "within the data timeout", out)
        return True

    def check_start(self, group: int, tag: int, out: list[Action]) -> None:
        """Start (or reject) the collective once every member of the group voted."""
        op = self.ops.get((group, tag))
        if op is None or op.seq:
            return
        members = self._roster.roster(group)
        if not op.descs or len(op.descs) < len(members) or not all(c in op.descs for c in members):
            return
        voters = sorted(op.descs)
        since = self._rings.get(group, ([], 0))[1]
        stale = sorted(c for c, d in op.descs.items() if d[7] and d[7] < since)
        if stale:  # launched in a ring that changed since: its ranks and shape are void
            self.end_vote(group, tag, f"the group's ring changed (epoch {since}) after peers "
                          f"{stale} launched it; retry in the new world", out, abort=True)
            return
        descs = {c: d[:7] for c, d in op.descs.items()}  # (launched in the same ring)
        if len(set(descs.values())) > 1:
            odd = _lone_dissenter(descs)
            if odd is not None:  # the others agree: it is removed, they start without it
                c, agreed = odd
                self._roster.kick(c, f"collective tag {tag}: its descriptor "
                                  f"({describe(descs[c])}) disagrees with every other "
                                  f"member's ({describe(agreed)})", out)
                return
            reason = "peers disagree on kind/count/dtype/op/root/quantization: " + ", ".join(
                f"peer {c}: {describe(descs[c])}" for c in voters)
            self.end_vote(group, tag, reason, out)
            return
        if len(voters) < 2:
            self.end_vote(group, tag, "too few peers in the group", out, abort=True)
            return
        root = descs[voters[0]][6]
        if root >= len(voters):
            self.end_vote(group, tag, f"root rank {root} is not in a group of {len(voters)}",
                          out)
            return
        op.participants = tuple(voters)
        epoch = self._roster.epoch
        if op.ticket[0] and op.ticket[1] == epoch:
            op.seq = op.ticket[0]  # the early voters run it already (this confirms it)
        else:  # no ticket, or the ring changed since: early voters start over
            self._seq += 1
            op.seq = self._seq
            op.done.clear()
        start = m.CollectiveStart(tag, op.seq, epoch)
        out.extend(Send(c, start) for c in voters)
        self._check_complete(group, tag, out)

    def end_vote(self, group: int, tag: int, reason: str, out: list[Action], *,
                 abort: bool = False, deadlock: bool = False) -> None:
        """Answer every voter of a collective that never started: ``CollectiveAbort`` (seq 0,
        the caller may retry) or ``CollectiveRejected``."""
        op = self.ops.pop((group, tag))
        for c in sorted(op.descs):
            self._untag(c, tag)
            out.append(Send(c, m.CollectiveAbort(tag, 0, reason) if abort
                            else m.CollectiveRejected(tag, reason, deadlock)))

    def abort(self, group: int, tag: int, reason: str, out: list[Action]) -> None:
        """Abort a running collective for every participant still there."""
        op = self.ops.pop((group, tag))
        self._aborted[(group, tag)] = (op.seq, op.participants)
        self._aborted.move_to_end((group, tag))
        while len(self._aborted) > MAX_TICKETS:
            self._aborted.popitem(last=False)
        for c in op.participants:
            if self._untag(c, tag):
                out.append(Send(c, m.CollectiveAbort(tag, op.seq, reason)))

    def depart(self, conn: int, group: int, out: list[Action]) -> None:
        """``conn`` left its group: abort what it runs in, drop its votes (the others' may
        start now, on the new ring)."""
        for (g, tag), op in list(self.ops.items()):
            if g != group:
                continue
            if op.seq:
                if conn in op.participants:
                    self.abort(g, tag, f"peer {conn} left the run", out)
            else:
                op.descs.pop(conn, None)
                op.waits.discard(conn)
                op.early.discard(conn)
                op.done.discard(conn)
                if op.descs:
                    self.check_start(g, tag, out)
                else:
                    del self.ops[(g, tag)]

    def _check_complete(self, group: int, tag: int, out: list[Action]) -> None:
        op = self.ops[(group, tag)]
        if len(op.done) < len(op.participants) or not op.done.issuperset(op.participants):
            return
        del self.ops[(group, tag)]
        done = m.CollectiveComplete(tag, op.seq)
        if op.participants == self._roster.roster(group):  # the ring as it was
            self._seq += 1
            epoch = self._roster.epoch
            tickets = self._tickets.setdefault(group, {})
            tickets[tag] = (self._seq, epoch)
            evicted: list[int] = []  # never-reused tags: forget the oldest tickets
            while len(tickets) > MAX_TICKETS and len(evicted) < m.MAX_EVICTED:
                evicted.append(next(iter(tickets)))
                del tickets[evicted[-1]]
            done = m.CollectiveComplete(tag, op.seq, self._seq, epoch, evicted)
        for c in op.participants:
            self._untag(c, tag)
            out.append(Send(c, done))

    def _untag(self, conn: int, tag: int) -> bool:
        peer = self._roster.peer(conn)
        if peer is None:
            return False
        peer.tags.discard(tag)
        return True


def _lone_dissenter(descs: dict[int, Desc]) -> tuple[int, Desc] | None:
    """The one voter whose descriptor differs from all the others', which agree (three voters
    at least: of two, neither is known to be the wrong one), and theirs; else None."""
    if len(descs) < 3:
        return None
    counts = collections.Counter(descs.values())
    (agreed, n), = counts.most_common(1)
    if n != len(descs) - 1:
        return None
    return next(c for c, d in descs.items() if d != agreed), agreed
