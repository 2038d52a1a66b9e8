"""The broadcast's data path: the root's tensor pipelined once along the ring.

The root sends its tensor in segments to its successor; every other peer receives each
segment in place and forwards it at once unless its successor is the root. Each link carries
the tensor once, and the segments overlap along the ring: about one tensor's transfer time
plus P - 2 segment hops. A segment about to land on a non-root's tensor is first copied aside
(``InputBackup``), so an aborted broadcast leaves every tensor as it was. Nothing here blocks
beyond that copy, or awaits.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..core.backup import InputBackup
from ..core.gather import GatherPlan
from ..core.steps import Forward
from .base import Sent

BROADCAST = 4  # the frames' phase


class BroadcastPath:
    """One rank's part of broadcasting ``root``'s ``tensor``."""

    def __init__(self, rank: int, world: int, root: int, tensor: memoryview, seg: int,
                 backup: InputBackup | None) -> None:
        # the root's tensor is the one block; its frames are the root's block's
        self._plan = GatherPlan(0, 1, tensor.nbytes, seg, BROADCAST)
        self._root, self._tensor, self._backup = root, tensor, backup
        self._forward = (rank + 1) % world != root
        self._mine = rank == root
        self._expected = {} if self._mine else self._plan.expected_block(0)
        self.remaining = len(self._expected)
        self.own_first = self.defers = False

    def target(self, phase: int, offset: int, length: int) -> memoryview | None:
        """A segment of the root's tensor, into ours (saved first, for an abort)."""
        if self._expected.pop((phase, offset), -1) != length:
            return None
        if self._backup is not None:
            self._backup.save(offset, length)
        return self._tensor[offset : offset + length]

    def process(self, phase: int, offset: int, p0: float, p1: float) -> Forward | None:
        """Forwarded as it came unless the successor is the root."""
        self.remaining -= 1
        if not self._forward:
            return None
        n = min(self._plan.seg, self._tensor.nbytes - offset)
        return Forward(phase, offset, self._tensor[offset : offset + n], p0, p1, None)

    def first_sends(self) -> Iterator[Forward]:
        """The root's tensor, segment by segment; nothing on the others."""
        if self._mine:
            for off, n in self._plan.block(0):
                yield Forward(BROADCAST, off, self._tensor[off : off + n], 0.0, 0.0, None)

    def sent(self, sender: Sent, end: int, slot: memoryview) -> None:
        """No slots here."""

    def finish(self) -> None:
        """The root's bytes are in place."""

    def release(self) -> None:
        """Nothing pooled (the tensor is the caller's; the backup the collective's)."""
