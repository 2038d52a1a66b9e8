"""The ring all-gather's data path: every rank's block once round the ring, in segments.

Rank r's block lands at ``r * nbytes`` of the output; each peer sends its own block's
segments first and forwards every segment it receives unless its successor is the block's
origin: P - 1 hops, (P - 1) x the block per link. Frames land in the output itself and are
forwarded from there, so nothing is copied but this peer's own block (not even that when the
input already is its slot of the output, as FSDP passes it). The small all-reduce
(``gather.py``) gathers into a scratch the same way, then reduces. Nothing here blocks
beyond that one copy, or awaits.
"""

from __future__ import annotations

from collections.abc import Iterator

from ...._compute import ops as _ops
from ..core.gather import GatherPlan
from ..core.steps import Forward
from .base import Sent

ALL_GATHER = 3  # the frames' phase


class AllGatherPath:
    """One rank's part of gathering every rank's ``src`` (``nbytes`` each) into ``out``."""

    def __init__(self, rank: int, world: int, src: memoryview, out: memoryview,
                 seg: int, phase: int = ALL_GATHER, copy: bool = True) -> None:
        self._g = g = GatherPlan(rank, world, src.nbytes, seg, phase)
        self._expected = g.expected()
        self.remaining = len(self._expected)
        self._out, self._phase = out, phase
        mine = g.mine()
        if copy:  # (not when ``src`` is this rank's slot of ``out``)
            _ops.copy(out[mine : mine + g.nbytes], src)
        self.own_first = self.defers = False

    def target(self, phase: int, offset: int, length: int) -> memoryview | None:
        """A segment of another rank's block, into its place in the output."""
        if self._expected.pop((phase, offset), -1) != length:
            return None
        return self._out[offset : offset + length]

    def process(self, phase: int, offset: int, p0: float, p1: float) -> Forward | None:
        """Forwarded as it came, from where it landed, unless the successor is its origin."""
        self.remaining -= 1
        if not self._g.forwarded(offset):
            return None
        n = min(self._g.seg, self._g.nbytes - offset % self._g.nbytes)
        return Forward(phase, offset, self._out[offset : offset + n], p0, p1, None)

    def first_sends(self) -> Iterator[Forward]:
        """Our own block, segment by segment, from its slot of the output."""
        out, phase = self._out, self._phase
        for off, n in self._g.block(self._g.rank):
            yield Forward(phase, off, out[off : off + n], 0.0, 0.0, None)

    def sent(self, sender: Sent, end: int, slot: memoryview) -> None:
        """No slots here."""

    def finish(self) -> None:
        """Every block is in place."""

    def release(self) -> None:
        """Nothing pooled (the output is the caller's)."""

