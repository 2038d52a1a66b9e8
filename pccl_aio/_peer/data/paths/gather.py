"""The small all-reduce's data path (``core/gather.py``): every input once round the ring.

An all-gather (``allgather.py``) of every peer's input into a pooled scratch, whole inputs
as single frames; once all are in, they are reduced in rank order into ``dst``, so the bytes
are the same on every peer. Nothing here blocks beyond the copies and that final reduce, or
awaits.
"""

from __future__ import annotations

from ...._types import ReduceOp
from ...core.buffers import Buffer
from ..core.backup import InputBackup
from ..core.gather import GATHER
from ..core.slots import Pool
from .allgather import AllGatherPath


class GatherPath(AllGatherPath):
    """One rank's part of a small all-reduce of ``dst`` (``src``: its input)."""

    def __init__(self, rank: int, world: int, src: Buffer, dst: Buffer, op: ReduceOp,
                 pool: Pool, backup: InputBackup | None) -> None:
        nbytes = dst.count * dst.dtype.itemsize
        owner, scratch = pool.take(nbytes * world)
        self._owner: bytearray | None = owner
        self._pool, self._backup, self._dst = pool, backup, dst.view
        self._op, self._dt = int(op), int(dst.dtype)
        super().__init__(rank, world, src.view, scratch, nbytes, GATHER)

    def finish(self) -> None:
        """Every input is here: reduce them, in rank order."""
        if self._backup is not None:
            self._backup.save(0, self._g.nbytes)
        self._g.reduce(self._dst, self._out, self._op, self._dt)

    def release(self) -> None:
        if self._owner is not None:
            self._pool.give(self._owner)
        self._owner, self._out = None, memoryview(b"")
