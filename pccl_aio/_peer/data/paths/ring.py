"""The ring all-reduce's data path (unquantized; ``quant.py`` extends it).

Reduce-scatter then all-gather (``core/ring.py``'s plan; ``core/steps.py``'s per-segment
work). Unquantized reduce-scatter frames land in reused receive slots (``core/slots.py``),
all-gather frames in ``dst`` itself; our own chunk is read from the input. Nothing here
blocks beyond the kernels on one segment, or awaits.

At two peers our chunk goes out before any forward (the final values land in ``dst``, no
slot is held), so the last forward never waits a hop at the end for the other's last
segment: ``own_first`` holds the forwards until ``first_sends`` is exhausted. This is the
one place that rule lives.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from ...._compute import ops as _ops
from ...._types import Quantization, ReduceOp
from ...core.buffers import Buffer
from ..core.backup import InputBackup
from ..core.ring import RS
from ..core.slots import SLOTS_BASE, Pool
from ..core.steps import Forward, landing, start, work
from .base import Sent

SEGMENT_BYTES = 1 << 20  # pipeline segment, in bytes on the wire


class RingPath:
    """One rank's part of a ring all-reduce of ``dst`` (``src``: its input); with
    ``scatter``, of a reduce-scatter (``scatter.py``) whose chunk lands there."""

    quantized: ClassVar[bool] = False

    def __init__(self, rank: int, world: int, src: Buffer, dst: Buffer, op: ReduceOp,
                 quant: Quantization | None, pool: Pool, backup: InputBackup | None,
                 connections: int, scatter: memoryview | None = None) -> None:
        b = dst.dtype.itemsize
        self._b, self._bits = b, self._wire_bits(b, quant)
        laid = start(rank, world, dst.view, src.view, dst.count, b, self._bits,
                     self.quantized, pool, SEGMENT_BYTES, SLOTS_BASE + 2 * connections,
                     scatter)
        self.plan, self._expected, self._steps, self._slots = laid[:4]
        self._pool, self._backup = pool, backup
        self._scratch_owner: bytearray | None = None  # quantized: the codes' scratch
        self._scratch: memoryview | None = None
        if laid.scratch is not None:
            self._scratch_owner, self._scratch = laid.scratch
        self._src, self._dst, self._world = src.view, dst.view, world
        self._k = _ops.kernels()  # per-segment jobs: views cut here, arguments checked once
        self._op, self._dt = int(op), int(dst.dtype)
        self._q = (int(quant.dtype), int(quant.algo)) if quant is not None else None
        self.own_first = world == 2  # (see the module's docstring)
        self.defers = self.quantized and not self.own_first
        self.remaining = len(self._expected)  # frames may arrive before the run task starts

    def _wire_bits(self, itemsize: int, quant: Quantization | None) -> int:
        """Bits per element on the wire."""
        return 8 * itemsize

    def target(self, phase: int, offset: int, length: int) -> memoryview | None:
        if self._expected.pop((phase, offset), -1) != length:
            return None
        return landing(self._steps[(phase, offset)], phase, offset, length, self.quantized,
                       self._slots, self._backup)

    def process(self, phase: int, offset: int, p0: float, p1: float) -> Forward | None:
        """Reduce (or decode) one received segment (``core/steps.work``)."""
        self.remaining -= 1
        return work(self._steps[(phase, offset)], phase, offset, p0, p1, self._k, self._op,
                    self._dt, self._q, self._world, self._slots, self._backup)

    def first_sends(self) -> Iterator[Forward]:
        """Our own chunk, read from the input (``dst`` itself when in place)."""
        for off, n in self.plan.first_sends():
            yield self._first(off, n)
        self._sends_done()

    def _first(self, off: int, n: int) -> Forward:
        return Forward(RS, off, self._src[off : off + n], 0.0, 0.0, None)

    def _sends_done(self) -> None:
        self.own_first = False  # now the forwards that waited
        self.defers = self.quantized

    def sent(self, sender: Sent, end: int, slot: memoryview) -> None:
        if self._slots is not None:
            self._slots.free_when_written(sender, end, slot)

    def finish(self) -> None:
        """Nothing is left: every segment was worked as it came."""

    def release(self) -> None:
        if self._scratch_owner is not None:
            self._pool.give(self._scratch_owner)
        self._scratch_owner = self._scratch = None
        if self._slots is not None:
            self._slots.release()
            self._slots = None
        self._steps = {}
