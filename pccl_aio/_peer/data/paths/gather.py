"""The small all-reduce's data path (``core/gather.py``): every input once round the ring.

Each peer copies its input into its slot of a scratch, sends it first, forwards each input
it receives unless its successor is the input's origin, and once all are in reduces them in
rank order into ``dst``. Nothing here blocks beyond the copies and that final reduce, or
awaits.
"""

from __future__ import annotations

from collections.abc import Iterator

from ...._compute import ops as _ops
from ...._types import ReduceOp
from ...core.buffers import Buffer
from ..core.backup import InputBackup
from ..core.gather import GATHER, GatherPlan
from ..core.slots import Pool
from ..core.steps import Forward
from .base import Sent


class GatherPath:
    """One rank's part of a small all-reduce of ``dst`` (``src``: its input)."""

    def __init__(self, rank: int, world: int, src: Buffer, dst: Buffer, op: ReduceOp,
                 pool: Pool, backup: InputBackup | None) -> None:
        self._g = g = GatherPlan(rank, world, dst.count * dst.dtype.itemsize)
        self._expected, self.remaining = g.expected(), world - 1
        self._pool, self._backup, self._dst = pool, backup, dst.view
        self._op, self._dt = int(op), int(dst.dtype)
        owner, scratch = pool.take(g.nbytes * world)
        self._owner: bytearray | None = owner
        self._scratch = scratch
        self._mine = mine = g.mine()
        _ops.copy(scratch[mine : mine + g.nbytes], src.view)
        self.own_first = self.defers = False

    def target(self, phase: int, offset: int, length: int) -> memoryview | None:
        """An input, into its slot of the scratch."""
        if self._expected.pop((phase, offset), -1) != length:
            return None
        return self._scratch[offset : offset + length]

    def process(self, phase: int, offset: int, p0: float, p1: float) -> Forward | None:
        """An input: forwarded as it came, reduced at the end."""
        self.remaining -= 1
        if not self._g.forwarded(offset):
            return None
        return Forward(phase, offset, self._scratch[offset : offset + self._g.nbytes], p0, p1,
                       None)

    def first_sends(self) -> Iterator[Forward]:
        """Our whole input, from its slot."""
        mine = self._mine
        return iter((Forward(GATHER, mine, self._scratch[mine : mine + self._g.nbytes],
                             0.0, 0.0, None),))

    def sent(self, sender: Sent, end: int, slot: memoryview) -> None:
        """No slots here."""

    def finish(self) -> None:
        """Every input is here: reduce them, in rank order."""
        if self._backup is not None:
            self._backup.save(0, self._g.nbytes)
        self._g.reduce(self._dst, self._scratch, self._op, self._dt)

    def release(self) -> None:
        if self._owner is not None:
            self._pool.give(self._owner)
        self._owner, self._scratch = None, memoryview(b"")
