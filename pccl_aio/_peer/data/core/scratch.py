"""``ScratchPool``: reusable receive and backup buffers of one communicator (sans-IO)."""

from __future__ import annotations


class ScratchPool:
    """Reusable buffers, so a 64 MiB all-reduce does not page-fault a new one each time.

    Plain ``bytearray``s, on purpose: ``np.empty`` (which asks for transparent huge pages) made
    the P = 3 64 MiB loopback all-reduce ~25 % slower on the 2-core reference VM (paired runs,
    see bench/RESULTS.md).
    """

    def __init__(self, keep: int = 16) -> None:
        self._free: list[bytearray] = []
        self._keep = keep

    def take(self, nbytes: int) -> tuple[bytearray, memoryview]:
        """A buffer of at least ``nbytes`` and a view of its first ``nbytes`` (contents stale)."""
        for i, b in enumerate(self._free):
            if len(b) >= nbytes:
                del self._free[i]
                return b, memoryview(b)[:nbytes]
        b = bytearray(nbytes)
        return b, memoryview(b)

    def give(self, b: bytearray) -> None:
        """Return a buffer taken with ``take``; the pool keeps the ``keep`` largest."""
        self._free.append(b)
        self._free.sort(key=len)
        del self._free[: max(0, len(self._free) - self._keep)]
