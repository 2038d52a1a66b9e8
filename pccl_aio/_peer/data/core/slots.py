"""Segment-sized receive slots of one all-reduce attempt (the unquantized reduce-scatter).

A frame is received into a slot, reduced there (a partial sum, forwarded from the slot) or out
of it (the final value of our own chunk, written to ``dst``). A slot is reused last in, first
out, so the kernel's receive copy, the reduce and the forward's send copy all hit cache. One
that was forwarded from is reused only once its sender's queue has passed the frame; if no
slot is free (frames wait for room on a slow link), another block is taken from the
communicator's pool, so memory follows the backlog, not the buffer size. Nothing here blocks.
"""

from __future__ import annotations

from typing import Protocol

SLOTS_BASE = 4  # slots per block: this many plus two per connection


class Pool(Protocol):
    """Where blocks of slots come from (the communicator's ``ScratchPool``)."""

    def take(self, nbytes: int) -> tuple[bytearray, memoryview]: ...

    def give(self, b: bytearray) -> None: ...


class _Sent(Protocol):
    def written(self, position: int) -> bool: ...


class Slots:
    """Receive slots of ``size`` bytes, taken from ``pool`` in blocks of ``block``."""

    __slots__ = ("_block", "_free", "_owners", "_pool", "_sending", "_size", "landed")

    def __init__(self, pool: Pool, size: int, block: int) -> None:
        self._pool, self._size, self._block = pool, size, max(1, block)
        self._free: list[memoryview] = []
        self._owners: list[bytearray] = []
        self._sending: list[tuple[_Sent, int, memoryview]] = []  # (sender, end, slot)
        self.landed: dict[int, memoryview] = {}  # byte offset -> the slot it is received in
        self._more()

    def land(self, off: int, n: int) -> memoryview:
        """A slot for the segment at ``off`` (recorded in ``landed``); its first ``n`` bytes."""
        if not self._free and self._sending:  # reclaim the slots whose forward left
            sending, self._sending = self._sending, []
            for entry in sending:
                if entry[0].written(entry[1]):
                    self._free.append(entry[2])
                else:
                    self._sending.append(entry)
        if not self._free:
            self._more()
        slot = self.landed[off] = self._free.pop()
        return slot[:n]

    def free(self, slot: memoryview) -> None:
        """``slot`` may be reused now."""
        self._free.append(slot)

    def free_when_written(self, sender: _Sent, end: int, slot: memoryview) -> None:
        """``slot`` may be reused once ``sender`` has passed position ``end`` to the kernel."""
        if sender.written(end):
            self._free.append(slot)
        else:
            self._sending.append((sender, end, slot))

    def release(self) -> None:
        """Give every block back to the pool (the attempt is over)."""
        for owner in self._owners:
            self._pool.give(owner)
        self._owners, self._free, self._sending, self.landed = [], [], [], {}

    def _more(self) -> None:
        size = self._size
        owner, whole = self._pool.take(self._block * size)
        self._owners.append(owner)
        self._free.extend(whole[i * size : (i + 1) * size] for i in range(self._block))
