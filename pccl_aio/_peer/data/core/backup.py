"""``InputBackup``: what lets an aborted in-place all-reduce put its input back bit-exactly.

Unquantized, ``dst`` is written once per segment, so each segment is copied aside into a
pooled buffer just before its first write: by the reduce-scatter kernel that reads it anyway
(``into`` hands it the place), or just before an all-gather frame lands on a segment not
saved yet (``save``). The quantized path accumulates into ``dst`` repeatedly, so it saves the
whole input at once. ``restore`` puts back what was saved. Sans-IO; nothing here blocks
beyond the copies themselves.
"""

from __future__ import annotations

from ...._compute import ops as _ops
from .slots import Pool


class InputBackup:
    """The saved input of one in-place all-reduce attempt; ``whole`` copies it at once."""

    __slots__ = ("_copy", "_dst", "_owner", "_saved", "_stream_copy")

    def __init__(self, pool: Pool, dst: memoryview, *, whole: bool) -> None:
        self._owner: bytearray | None
        self._owner, self._copy = pool.take(dst.nbytes)
        self._dst = dst
        self._stream_copy = _ops.kernels().stream_copy
        self._saved: dict[int, int] | None = None if whole else {}  # offset -> length saved
        if whole:
            _ops.copy(self._copy, dst)

    def into(self, off: int, n: int) -> memoryview | None:
        """Segment-wise: where the kernel about to read ``dst[off:off+n]`` for the first time
        copies it (recorded as saved); None if it was saved already (or all was)."""
        saved = self._saved
        if saved is None or off in saved:
            return None
        saved[off] = n
        return self._copy[off : off + n]

    def save(self, off: int, n: int) -> None:
        """Copy ``dst[off:off+n]`` aside unless it was saved already."""
        into = self.into(off, n)
        if into is not None:
            self._stream_copy(into, self._dst[off : off + n])

    def restore(self) -> None:
        """Put every saved byte back into ``dst``."""
        if self._owner is None:
            return
        if self._saved is None:
            _ops.copy(self._dst, self._copy)
            return
        for off, n in self._saved.items():
            _ops.copy(self._dst[off : off + n], self._copy[off : off + n])

    def release(self, pool: Pool) -> None:
        """Give the buffer back (idempotent); ``restore`` does nothing afterwards."""
        if self._owner is not None:
            pool.give(self._owner)
        self._owner, self._saved, self._copy = None, {}, memoryview(b"")
