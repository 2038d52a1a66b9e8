"""Sans-IO plan of a ring all-reduce: chunk bounds and the segments each rank moves.

Reduce-scatter then all-gather over ``world`` ranks. Chunk ``c`` holds elements
``[bounds[c], bounds[c+1])``; rank ``r`` sends chunk ``(r - s) mod W`` at reduce-scatter step
``s`` and ends owning chunk ``(r + 1) mod W``, which it finalises and sends first in the
all-gather. Each chunk's final bytes are computed by its owner only and forwarded verbatim, so
every rank ends with identical bytes. Chunks are cut into segments so that receive, reduce and
send overlap. With a ``grain`` (2 for 4-bit codes, two per byte) every chunk and segment
starts on a multiple of ``grain`` elements, so each is a whole number of bytes on the wire.
Without ``gather`` the plan is the reduce-scatter alone: a rank keeps the chunk it owns (the
reduce-scatter collective gives rank r its plan as rank r - 1, so that it owns chunk r).
"""

from __future__ import annotations

RS = 0  # reduce-scatter phase
AG = 1  # all-gather phase


def chunk_bounds(count: int, world: int, grain: int = 1) -> list[int]:
    """Element offsets of the ``world`` chunks: ``base + (c < rem)`` units of ``grain``
    elements each, the last unit cut at ``count``."""
    base, rem = divmod(-(-count // grain), world)
    out = [0]
    for c in range(world):
        out.append(out[-1] + base + (1 if c < rem else 0))
    return [min(count, u * grain) for u in out] if grain > 1 else out


def segments(lo: int, hi: int, seg: int) -> list[tuple[int, int]]:
    """Split element range [lo, hi) into (start, length) pieces of at most ``seg`` elements."""
    return [(s, min(seg, hi - s)) for s in range(lo, hi, seg)]


class RingPlan:
    """What rank ``rank`` of ``world`` does for ``count`` elements, in byte offsets."""

    __slots__ = ("bounds", "gather", "itemsize", "owned", "rank", "seg", "world")

    def __init__(self, rank: int, world: int, count: int, itemsize: int, seg_elems: int,
                 grain: int = 1, gather: bool = True) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside a ring of {world}")
        self.rank, self.world, self.itemsize = rank, world, itemsize
        self.seg = max(grain, seg_elems // grain * grain)
        self.bounds = chunk_bounds(count, world, grain)
        self.owned = (rank + 1) % world
        self.gather = gather

    def chunk_segments(self, chunk: int) -> list[tuple[int, int]]:
        """Segments of ``chunk`` as (byte offset, byte length)."""
        b = self.itemsize
        return [(s * b, n * b) for s, n in
                segments(self.bounds[chunk], self.bounds[chunk + 1], self.seg)]

    def first_sends(self) -> list[tuple[int, int]]:
        """Segments sent at reduce-scatter step 0: this rank's own chunk."""
        return self.chunk_segments(self.rank)

    def chunk_of(self, byte_offset: int) -> int:
        """Chunk holding the element at ``byte_offset``."""
        elem = byte_offset // self.itemsize
        lo, hi = 0, self.world
        while hi - lo > 1:  # bounds are sorted; the first chunk whose end is past elem
            mid = (lo + hi) // 2
            if self.bounds[mid] <= elem:
                lo = mid
            else:
                hi = mid
        while self.bounds[lo + 1] <= elem:  # skip empty chunks
            lo += 1
        return lo

    def expected(self) -> dict[tuple[int, int], int]:
        """Every (phase, byte offset) this rank receives, with its byte length."""
        out: dict[tuple[int, int], int] = {}
        for c in range(self.world):
            if c != self.rank:  # reduce-scatter brings every chunk but our own
                for off, n in self.chunk_segments(c):
                    out[(RS, off)] = n
            if c != self.owned and self.gather:  # all-gather: every chunk but the one we own
                for off, n in self.chunk_segments(c):
                    out[(AG, off)] = n
        return out

    def after_receive(self, phase: int, byte_offset: int) -> tuple[bool, int | None]:
        """After receiving a segment: (is it the final reduce of our owned chunk, phase to
        forward it in or None)."""
        c = self.chunk_of(byte_offset)
        if phase == RS:
            if c == self.owned:
                return True, (AG if self.gather else None)
            return False, RS
        # all-gather: forward unless our successor owns it (it would be its last hop)
        step = (self.rank - c) % self.world
        return False, (AG if step < self.world - 2 else None)
