"""The small collectives in log2 P rounds (``core/bruck.py``): all-gather and all-reduce.

Every rank's block is gathered into a pooled scratch, kept rotated (this rank's block first);
once all are in, the all-gather copies them to the output in rank order and the all-reduce
reduces them in rank order into ``dst`` (the bytes of the ring's small path). Which round's
frame goes where, and when, is the ``Rounds`` pipeline's (``rounds.py``): this path only lays
frames out and takes them in. Nothing here blocks beyond the copies and that final reduce,
or awaits.
"""

from __future__ import annotations

from collections.abc import Iterator

from ...._compute import ops as _ops
from ...._types import ReduceOp
from ...core.buffers import Buffer
from ..core.backup import InputBackup
from ..core.bruck import BruckPlan
from ..core.gather import reduce_in_order
from ..core.slots import Pool
from ..core.steps import Forward
from .base import Sent


class BruckPath:
    """One rank's part of gathering every rank's ``src`` (its bytes) in rounds into
    ``out`` (rank order; ``None``: the blocks stay in the scratch for a subclass's
    ``finish``)."""

    own_first = defers = False

    def __init__(self, rank: int, world: int, src: memoryview, out: memoryview | None,
                 pool: Pool) -> None:
        self.plan = plan = BruckPlan(rank, world, src.nbytes)
        owner, scratch = pool.take(src.nbytes * world)
        self._owner: bytearray | None = owner
        self._pool, self._scratch, self._out = pool, scratch, out
        _ops.copy(scratch[: src.nbytes], src)
        self.remaining = plan.rounds
        self._pending = {plan.frame(k)[0]: plan.frame(k)[1:] for k in range(plan.rounds)}
        self._got: set[int] = set()  # phases of the frames wholly in
        self._in = 0  # rounds 0 .. _in - 1 are all in

    @property
    def through(self) -> int:
        """Rounds 0 .. through - 1 are all in."""
        return self._in

    def ready(self, k: int) -> bool:
        """Round ``k``'s frame can go: every earlier round's frame is in."""
        return k <= self._in

    def got(self, k: int) -> bool:
        """Round ``k``'s frame is wholly in."""
        return self.plan.frame(k)[0] in self._got

    def send(self, k: int) -> Forward:
        """Round ``k``'s frame: the slots this rank holds, from the scratch."""
        phase, off, n = self.plan.frame(k)
        return Forward(phase, off, self._scratch[:n], 0.0, 0.0, None)

    def target(self, phase: int, offset: int, length: int) -> memoryview | None:
        """A round's frame (once), into its slots of the scratch."""
        if self._pending.get(phase) != (offset, length):
            return None
        del self._pending[phase]
        return self._scratch[offset : offset + length]

    def process(self, phase: int, offset: int, p0: float, p1: float) -> Forward | None:
        """A round's frame is in: counted; what is sent next is the pipeline's to say."""
        self.remaining -= 1
        self._got.add(phase)
        plan = self.plan
        while self._in < plan.rounds and plan.frame(self._in)[0] in self._got:
            self._in += 1
        return None

    def first_sends(self) -> Iterator[Forward]:
        """None: every round's frame is sent by the pipeline (``send``)."""
        return iter(())

    def sent(self, sender: Sent, end: int, slot: memoryview) -> None:
        """No slots here."""

    def finish(self) -> None:
        """Every block is in: to the output, in rank order."""
        if self._out is not None:
            n = self.plan.nbytes
            for r, block in enumerate(self.plan.in_rank_order(self._scratch)):
                _ops.copy(self._out[r * n : (r + 1) * n], block)

    def release(self) -> None:
        """Give the scratch back (idempotent)."""
        if self._owner is not None:
            self._pool.give(self._owner)
        self._owner, self._scratch = None, memoryview(b"")


class BruckReducePath(BruckPath):
    """One rank's part of a small all-reduce of ``dst`` in rounds (``src``: its input)."""

    def __init__(self, rank: int, world: int, src: Buffer, dst: Buffer, op: ReduceOp,
                 pool: Pool, backup: InputBackup | None) -> None:
        super().__init__(rank, world, src.view, None, pool)
        self._backup, self._dst = backup, dst.view
        self._op, self._dt = int(op), int(dst.dtype)

    def finish(self) -> None:
        """Every input is here: reduce them, in rank order."""
        if self._backup is not None:
            self._backup.save(0, self.plan.nbytes)
        reduce_in_order(self._dst, self.plan.in_rank_order(self._scratch), self._op, self._dt)
