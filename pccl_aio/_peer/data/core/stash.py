"""Frames of a ticket's collective that arrive before this peer launched it (sans-IO).

With a ticket (``CollectiveComplete.next_seq``) a peer starts a collective's data at once,
without the master's ``CollectiveStart``; its successor may not have launched that collective
yet. The successor keeps those frames here, within a byte budget, and hands them to the
collective when it is launched (``Registry.add``); no connection is held up meanwhile, so
frames of other collectives behind them still flow. A frame that finds no room *spoils* the
ticket: it is dropped, and this peer's vote says so (``CollectiveInit.spoiled``), so the master
starts the collective with a fresh seq for everyone and nothing waits for the lost frame.
Nothing here blocks or touches a socket.
"""

from __future__ import annotations

from typing import Final, TypeAlias

#: (sending peer, phase, offset, payload, p0, p1) of one frame.
Early: TypeAlias = tuple[int, int, int, memoryview, float, float]

STASH_BYTES: Final = 64 << 20  # budget of one communicator's stashed payloads
FRAME_MAX: Final = 1 << 20  # a pipeline segment on the wire; a longer frame spoils the ticket


class Stash:
    """The stashed frames of every reserved (ticket) seq, and the spoiled ones."""

    __slots__ = ("_frames", "budget", "spoiled", "used")

    def __init__(self, budget: int = STASH_BYTES) -> None:
        self.budget = budget
        self.used = 0  # bytes stashed or being received into the stash
        self._frames: dict[int, list[Early]] = {}  # reserved seq -> its frames, in order
        self.spoiled: set[int] = set()

    def reserve(self, seq: int) -> None:
        """Frames of ``seq`` are stashed from now on."""
        self._frames.setdefault(seq, [])

    def wants(self, seq: int) -> bool:
        """``seq`` is reserved and not spoiled."""
        return seq in self._frames

    def room(self, seq: int, n: int) -> memoryview | None:
        """A buffer for an ``n``-byte payload of ``seq``, or None: no room, ``seq`` spoiled."""
        if n > FRAME_MAX or self.used + n > self.budget:
            self.spoil(seq)
            return None
        self.used += n
        return memoryview(bytearray(n))

    def keep(self, seq: int, frame: Early) -> None:
        """A payload from ``room`` arrived whole; dropped if ``seq`` is no longer reserved."""
        frames = self._frames.get(seq)
        if frames is None:
            self.release(len(frame[3]))
        else:
            frames.append(frame)

    def take(self, seq: int) -> list[Early]:
        """The frames of ``seq`` (launched now); it is no longer reserved."""
        frames = self._frames.pop(seq, None) or []
        self.release(sum(len(f[3]) for f in frames))
        self.spoiled.discard(seq)
        return frames

    def release(self, n: int) -> None:
        self.used -= n

    def spoil(self, seq: int) -> None:
        """Drop what ``seq`` holds; its later frames are dropped too (not reserved any more)."""
        self.take(seq)
        self.spoiled.add(seq)

    def unreserve(self, seq: int) -> None:
        """The ticket is gone (the master evicted it): forget ``seq`` entirely."""
        self.take(seq)

    def void(self) -> None:
        """A new membership voids every ticket: drop everything."""
        for seq in list(self._frames):
            self.take(seq)
        self.spoiled.clear()
