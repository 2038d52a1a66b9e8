"""How the sync barrier (``barrier.Roster``), the optimizer (``topology.Roster``), the joint
votes (``joint.Roster``) and deadlock detection (``deadlock.Board``) reach a ``MasterState``:
what they read of it and the few changes they make (kick, publish, admit). Sans-IO."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from typing import Protocol

from ..._wire import messages as m
from .barrier import SyncBarrier
from .collectives import Collectives
from .deadlock import Item
from .events import Action
from .failover import Failover
from .joint import JointVotes
from .limits import Admission
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

    def accepted(self, group: int | None = None) -> list[int]: ...
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
        topology = [p.conn for p in st._peers.values() if p.voted_topology]
        if topology:
            yield ("topology", 0, 0), topology, topology
        pending = [p.conn for p in st._peers.values() if p.voted_pending]
        if pending:
            yield ("pending", 0, 0), pending, pending
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
