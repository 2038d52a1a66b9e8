"""``DataPath``: what the pipeline (``pipeline.py``) and the receiver need of one kind's data.

One object per attempt, made at the start (``paths.start``) and released at its end. Its
calls never block and never await: the pipeline owns the link, the task and the backlog; a
path only says where a frame lands, what a received segment becomes, what it sends first and
what is left to do once every segment is in.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from ..core.steps import Forward


class Sent(Protocol):
    """A connection's sender: has it passed a position of its queue to the kernel?"""

    def written(self, position: int) -> bool: ...


class DataPath(Protocol):
    """One kind's data path of one attempt."""

    remaining: int  # segments still to receive and process
    own_first: bool  # forwards wait until our own first sends are out
    defers: bool  # a segment that must wait for room waits unprocessed (``Arrival``)

    def target(self, phase: int, offset: int, length: int) -> memoryview | None:
        """Where the frame (phase, offset) of ``length`` bytes lands; None if it is not
        expected (a repeat, a wrong length or offset)."""

    def process(self, phase: int, offset: int, p0: float, p1: float) -> Forward | None:
        """Work one received segment; what to forward, if anything."""

    def first_sends(self) -> Iterator[Forward]:
        """The frames this peer sends of its own, each made as it is taken (after the
        pipeline's drain); clears ``own_first`` once all are taken."""

    def sent(self, sender: Sent, end: int, slot: memoryview) -> None:
        """A forward from ``slot`` was queued up to ``end``: free it once written."""

    def finish(self) -> None:
        """Every segment is in: the work left (blocks for the kernels only)."""

    def release(self) -> None:
        """Give back every buffer (idempotent): the attempt is over."""


class Nothing:
    """A barrier's data path: nothing to move (``Pipeline.done_now`` ends it at its start)."""

    remaining = 0
    own_first = defers = False

    def target(self, phase: int, offset: int, length: int) -> memoryview | None:
        return None

    def process(self, phase: int, offset: int, p0: float, p1: float) -> Forward | None:
        return None

    def first_sends(self) -> Iterator[Forward]:
        return iter(())

    def sent(self, sender: Sent, end: int, slot: memoryview) -> None:
        """No slots."""

    def finish(self) -> None:
        """Nothing to do."""

    def release(self) -> None:
        """Nothing held."""
