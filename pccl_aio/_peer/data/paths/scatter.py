"""The reduce-scatter's data path: the first half of the ring all-reduce.

Rank r's plan is the ring's as rank r - 1 (``core/ring.py``), so the chunk it ends owning,
reduced by every rank, is chunk r, in rank order, and its final values are written straight
into the caller's ``dst`` (``core/steps.start``'s ``scatter``); the input is only read.
Quantized, the ring accumulates into a pooled copy of the input and into ``dst``, which
start as the input. Nothing here blocks beyond those copies and the kernels on one segment.
"""

from __future__ import annotations

from ...._compute import ops as _ops
from ...._types import Quantization, ReduceOp
from ...core.buffers import Buffer
from ..core.slots import Pool
from .base import DataPath
from .quant import QuantRingPath
from .ring import RingPath


def reduce_scatter(rank: int, world: int, src: Buffer, dst: Buffer, op: ReduceOp,
                   quant: Quantization | None, pool: Pool, connections: int) -> DataPath:
    """Rank ``rank``'s part of reducing ``src`` (``world`` chunks of ``dst.count``) into
    ``dst``."""
    if quant is None:  # (the ring reads ``src`` only; partial sums go through slots)
        return RingPath(rank, world, src, src, op, None, pool, None, connections, dst.view)
    return _QuantScatter(rank, world, src, dst, op, quant, pool, connections)


class _QuantScatter(QuantRingPath):
    def __init__(self, rank: int, world: int, src: Buffer, dst: Buffer, op: ReduceOp,
                 quant: Quantization, pool: Pool, connections: int) -> None:
        owner, work = pool.take(src.view.nbytes)
        self._work: bytearray | None = owner
        _ops.copy(work, src.view)
        lo = rank * dst.view.nbytes
        _ops.copy(dst.view, work[lo : lo + dst.view.nbytes])
        into = Buffer(work, src.dtype, src.count, owner, 0)
        super().__init__(rank, world, src, into, op, quant, pool, None, connections, dst.view)

    def release(self) -> None:
        super().release()
        if self._work is not None:
            self._pool.give(self._work)
            self._work = None
