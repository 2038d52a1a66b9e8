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
    """Rank ``rank`` of ``world``: frame ``(GATHER, r * nbytes)`` carries rank r's input."""

    __slots__ = ("nbytes", "rank", "world")

    def __init__(self, rank: int, world: int, nbytes: int) -> None:
        self.rank, self.world, self.nbytes = rank, world, nbytes

    def expected(self) -> dict[tuple[int, int], int]:
        """(phase, offset) -> length of every frame this peer receives."""
        n = self.nbytes
        return {(GATHER, r * n): n for r in range(self.world) if r != self.rank}

    def mine(self) -> int:
        """Offset of this peer's own input, the one frame it sends first."""
        return self.rank * self.nbytes

    def forwarded(self, offset: int) -> bool:
        """A received input goes on to the successor unless the successor is its origin."""
        return offset // self.nbytes != (self.rank + 1) % self.world

    def reduce(self, dst: memoryview, inputs: memoryview, op: int, dtype: int) -> None:
        """``dst`` = every rank's input (``inputs``, in rank order) reduced in rank order."""
        n = self.nbytes
        _ops.reduce_from(dst, inputs[:n], inputs[n : 2 * n], op, dtype)
        for r in range(2, self.world):
            _ops.reduce_into(dst, inputs[r * n : (r + 1) * n], op, dtype)
        if op == ReduceOp.AVG:
            _ops.divide(dst, self.world, dtype)
