"""How the sync barrier (``barrier.Roster``), the optimizer (``topology.Roster``), the joint
votes (``joint.Roster``) and deadlock detection (``deadlock.Board``) reach a ``MasterState``:
what they read of it and the few changes they make (kick, publish, admit). Sans-IO."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from typing import Protocol

from ..._wire import messages as m
from .barrier import SyncBarrier
from .collectives import Collectives
from .deadlock import GLOBAL, HELD, Deadlock, Item
from .events import Action, Send
from .failover import Failover
from .joint import JointVotes
from .limits import Admission
from .quiet import Quiet
from .records import Op, Peer
from .topology import Topology

__all__ = ["StateAccess"]


class _State(Protocol):
    """What of a ``MasterState`` (``state.py``) is reached through ``StateAccess``."""

    now: float
    epoch: int
    _peers: dict[int, Peer]
    _admission: Admission
    _colls: Collectives
    _sync: SyncBarrier
    _topo: Topology
    _fo: Failover
    _votes: JointVotes
    _quiet: Quiet

    def accepted(self, group: int | None = None) -> list[int]: ...
    def roster(self, group: int | None = None) -> tuple[int, ...]: ...
    def publish(self, out: list[Action]) -> int: ...
    def admit(self, conns: Iterable[int] | None = None) -> list[int]: ...
    def _kick(self, conn: int, reason: str, out: list[Action]) -> None: ...


class StateAccess:
    """A ``MasterState`` as the sync barrier (``barrier.Roster``) and deadlock detection
    (``deadlock.Board``) reach it (reads, and kick, publish, admit), and read access for the
    status page and metrics."""

    __slots__ = ("_state",)

    def __init__(self, state: _State) -> None:
        self._state = state

    def accepted(self, group: int | None = None) -> list[int]:
        return self._state.accepted(group)

    def roster(self, group: int | None = None) -> tuple[int, ...]:
        return self._state.roster(group)

    @property
    def epoch(self) -> int:
        return self._state.epoch

    def peer(self, conn: int) -> Peer | None:
        return self._state._peers.get(conn)

    def addr(self, conn: int) -> m.PeerAddr:
        return self._state._peers[conn].addr()

    def kick(self, conn: int, reason: str, out: list[Action]) -> None:
        self._state._kick(conn, reason, out)

    def publish(self, out: list[Action]) -> int:
        return self._state.publish(out)

    def admit(self) -> list[int]:
        return self._state.admit()

    def batch_due(self) -> bool:
        return self._state._admission.batch_due(self._state.now)

    def peers(self) -> list[Peer]:
        """Every connection's record (registered or not), by id."""
        return [self._state._peers[c] for c in sorted(self._state._peers)]

    def groups(self) -> list[int]:
        """Groups with accepted peers, ascending."""
        return sorted({p.group for p in self._state._peers.values() if p.accepted})

    def descriptor(self, group: int, tag: int) -> tuple[int, ...] | None:
        """(count, dtype, op, quant algo, quant dtype) of a started or voted collective."""
        op = self._state._colls.ops.get((group, tag))
        return next(iter(op.descs.values()), None) if op is not None else None

    def running_seqs(self) -> set[int]:
        """Seqs of the collectives that started and have not ended."""
        return {op.seq for op in self._state._colls.ops.values() if op.seq}

    def running(self) -> list[tuple[int, int, int, list[int]]]:
        """(group, tag, seq, participants that have not reported yet) of each collective
        that started and has not ended."""
        return [(g, tag, op.seq, sorted(set(op.participants) - op.done))
                for (g, tag), op in self._state._colls.ops.items() if op.seq]

    def collectives(self) -> dict[tuple[int, int], Op]:
        """(group, tag) -> the record of each collective voted or started and not ended (a
        copy of the table, of the live records: read them, never change them)."""
        return dict(self._state._colls.ops)

    def sync_voters(self) -> list[int]:
        """Peers whose shared-state sync vote is counted (waiting for the sync to start)."""
        return self._state._sync.voters()

    def syncing(self) -> list[int]:
        """Peers in a running shared-state sync that have not reported it done, ascending."""
        return self._state._sync.syncing()

    def sync_busy(self, conn: int) -> bool:
        """``conn`` has a sync vote counted or has not finished its part of a sync."""
        return self._state._sync.busy(conn)

    def vote_rounds(self) -> dict[str, int]:
        """Joint vote kind (``"pending"``, ``"topology"``) -> the rounds answered so far."""
        return dict(self._state._votes.rounds.items())

    def optimizing(self, conn: int) -> bool:
        """``conn`` voted ``optimize_topology`` or takes part in a running one."""
        return self._state._topo.busy(conn)

    def revisions(self) -> dict[int, int]:
        """Group -> its last elected shared-state revision."""
        return self._state._sync.revisions()

    def recovery(self) -> tuple[list[int], list[int]] | None:
        """A run being rebuilt (after a master restart): the peers that rejoined so far and
        the members still awaited; None otherwise."""
        return self._state._fo.rebuild()

    def members(self) -> dict[int, int]:
        return {p.conn: p.group for p in self._state._peers.values() if p.accepted}

    def waits(self) -> Iterator[tuple[Item, Collection[int], Collection[int]]]:
        st = self._state
        for kind in ("topology", "pending"):
            joint = st._votes.voters[kind]
            if joint:
                yield (kind, 0, 0), joint, joint
        syncs: dict[int, list[int]] = {}
        for c in st._sync.voters():
            syncs.setdefault(st._peers[c].group, []).append(c)
        for g, voters in syncs.items():
            yield ("sync", g, 0), voters, voters
        for g, voters in st._topo.voters().items():
            yield ("optimize", g, 0), voters, voters
        for (g, tag), op in st._colls.ops.items():
            if not op.seq:
                yield ("collective", g, tag), op.descs, op.waits

    def fail(self, found: Deadlock | None, out: list[Action]) -> None:
        """Fail every call of the deadlocked peers: withdraw their votes, reject the
        collectives they await for all who launched them."""
        if found is None:
            return
        st, reason = self._state, found.reason()
        ops: dict[tuple[int, int], None] = {}  # (in order, once each)
        for c, items in found.waits.items():
            peer = st._peers[c]
            for kind, group, tag in items:
                if kind == "collective":
                    ops[group, tag] = None
                    continue
                if kind == "topology" or kind == "pending":
                    st._votes.withdraw(peer, kind)
                elif kind == "sync":
                    st._sync.withdraw(c)
                else:
                    st._topo.reject(c)
                out.append(Send(c, m.VoteRejected(kind, reason, True)))
        for group, tag in ops:
            st._colls.end_vote(group, tag, reason, out, deadlock=True)

    # ---- the incremental rule (``quiet.Ledger``) ------------------------------------------------
    def deadlock_work(self) -> tuple[int, int]:
        """(peers the incremental rule examined, full ``deadlock.find`` runs) so far."""
        return self._state._quiet.steps, self._state._quiet.finds

    def waited(self, conn: int) -> list[Item]:
        st = self._state
        peer = st._peers.get(conn)
        if peer is None or not peer.accepted:
            return []
        out: list[Item] = [(k, 0, 0) for k in ("topology", "pending")
                           if conn in st._votes.voters[k]]
        if st._sync.voted(conn):
            out.append(("sync", peer.group, 0))
        if st._topo.voted(conn):
            out.append(("optimize", peer.group, 0))
        for tag in peer.tags:
            op = st._colls.ops.get((peer.group, tag))
            if op is not None and not op.seq and conn in op.waits:
                out.append(("collective", peer.group, tag))
        return out

    def witness(self, item: Item, conn: int) -> bool:
        st = self._state
        peer = st._peers.get(conn)
        kind, group = item[0], item[1]
        if (peer is None or not peer.accepted or (kind not in GLOBAL and peer.group != group)
                or self.cast(item, conn) or conn in st._votes.voters["topology"]
                or conn in st._votes.voters["pending"] or st._sync.voted(conn)
                or st._topo.voted(conn)):
            return False
        held = kind in HELD
        for tag in peer.tags:  # it awaits a collective, or (``held``) launched one unstarted
            op = st._colls.ops.get((peer.group, tag))
            if op is not None and not op.seq and (conn in op.waits or held):
                return False
        return True

    def cast(self, item: Item, conn: int) -> bool:
        kind, group, tag = item
        st = self._state
        if kind == "collective":
            op = st._colls.ops.get((group, tag))
            return op is not None and conn in op.descs
        if kind == "sync":
            return st._sync.voted(conn)
        if kind == "optimize":
            return st._topo.voted(conn)
        return conn in st._votes.voters[kind]

    def maybe_waited(self, item: Item) -> bool:
        kind, group, tag = item
        st = self._state
        if kind == "collective":
            op = st._colls.ops.get((group, tag))
            return op is not None and not op.seq and bool(op.waits)
        if kind == "sync":
            return st._sync.voted_any()
        if kind == "optimize":
            return st._topo.voted_any()
        return bool(st._votes.voters[kind])

    def items(self) -> Iterator[Item]:
        return (item for item, _, waiters in self.waits() if waiters)

