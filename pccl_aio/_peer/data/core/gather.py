"""The small all-reduce: every input passes once round the ring, each peer reduces them all.

A ring all-reduce takes 2(P - 1) hops one after another; for a small buffer each hop is a
link's latency, not its bandwidth. Here each peer sends its whole input to its successor, which
forwards it on until it reaches the peer before its origin: P - 1 hops, after which every peer
holds every input and reduces them *in rank order* with the same kernels, so the bytes are the
same on every peer. Each peer sends (P - 1) x the buffer instead of 2 (P - 1) / P x, so it is
used below ``GATHER_MAX`` bytes only, unquantized (the choice depends only on what every peer
of the collective agrees on: count, dtype, quantization and world size). Nothing here blocks
for longer than the final reduce of P small buffers.
"""

from __future__ import annotations

from typing import Final

from ...._compute import ops as _ops
from ...._types import ReduceOp

GATHER: Final = 2  # the frames' phase
GATHER_MAX: Final = 64 << 10  # bytes of a buffer that takes this path


def chosen(nbytes: int, world: int, quantized: bool) -> bool:
    """This collective takes the small path."""
    return not quantized and 0 < nbytes <= GATHER_MAX and world >= 2


class GatherPlan:
    """Rank ``rank`` of ``world``: rank r's block of ``nbytes`` lands at ``r * nbytes``, cut
    into frames ``(phase, offset)`` of at most ``seg`` bytes (whole blocks by default), which
    the all-gather (``paths/allgather.py``) and the small all-reduce share."""

    __slots__ = ("nbytes", "phase", "rank", "seg", "world")

    def __init__(self, rank: int, world: int, nbytes: int, seg: int = 0,
                 phase: int = GATHER) -> None:
        self.rank, self.world, self.nbytes, self.phase = rank, world, nbytes, phase
        self.seg = seg or max(1, nbytes)

    def block(self, r: int) -> list[tuple[int, int]]:
        """Rank ``r``'s frames: (byte offset, byte length)."""
        lo, n, seg = r * self.nbytes, self.nbytes, self.seg
        return [(lo + s, min(seg, n - s)) for s in range(0, n, seg)]

    def expected_block(self, r: int) -> dict[tuple[int, int], int]:
        """(phase, offset) -> length of rank ``r``'s frames."""
        return {(self.phase, off): n for off, n in self.block(r)}

    def expected(self) -> dict[tuple[int, int], int]:
        """(phase, offset) -> length of every frame this peer receives."""
        return {k: n for r in range(self.world) if r != self.rank
                for k, n in self.expected_block(r).items()}

    def mine(self) -> int:
        """Offset of this peer's own block, the frames it sends first."""
        return self.rank * self.nbytes

    def forwarded(self, offset: int) -> bool:
        """A received frame goes on to the successor unless the successor is its origin."""
        return offset // self.nbytes != (self.rank + 1) % self.world

    def reduce(self, dst: memoryview, inputs: memoryview, op: int, dtype: int) -> None:
        """``dst`` = every rank's input (``inputs``, in rank order) reduced in rank order."""
        n = self.nbytes
        reduce_in_order(dst, [inputs[r * n : (r + 1) * n] for r in range(self.world)], op,
                        dtype)


def reduce_in_order(dst: memoryview, blocks: list[memoryview], op: int, dtype: int) -> None:
    """``dst`` = ``blocks`` (every rank's input, rank 0 first; two or more) reduced in that
    order, AVG divided by their number once: the same operations on every peer."""
    _ops.reduce_from(dst, blocks[0], blocks[1], op, dtype)
    for b in blocks[2:]:
        _ops.reduce_into(dst, b, op, dtype)
    if op == ReduceOp.AVG:
        _ops.divide(dst, len(blocks), dtype)
