"""Error-feedback sparse compression of one float32 vector, averaged over a peer group with
an all-gather of the compressed parts (``pccl_aio.SparseCompressor``; needs numpy)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from .._compute import ops, sparse
from .._errors import InvalidUsageError
from .._types import ReduceInfo

__all__ = ["SparseCompressor"]

MAX_THREADS = 4  # the default's cap: a compression is bound by memory beyond a few cores
_NAN_BITS = 0x7FC00000  # a poisoned part's scales (float32's quiet NaN)


class _AsyncHandle(Protocol):
    async def wait(self, timeout: float | None = None) -> ReduceInfo: ...


class _Async(Protocol):
    @property
    def ranks(self) -> list[int]: ...
    def all_gather_async(self, src: Any, dst: Any, *, tag: int = 0,
                         ring: Sequence[int] | None = None) -> _AsyncHandle: ...


class _BlockingHandle(Protocol):
    def wait(self, timeout: float | None = None) -> ReduceInfo: ...


class _Blocking(Protocol):
    @property
    def ranks(self) -> list[int]: ...
    def all_gather_async(self, src: Any, dst: Any, *, tag: int = 0,
                         ring: Sequence[int] | None = None) -> _BlockingHandle: ...


def _zeros(n: int) -> NDArray[np.float32]:
    """``n`` float32 zeros, every page written (``np.zeros`` maps them at the first write)."""
    a = np.empty(n, np.float32)
    a.fill(0)
    return a


class SparseCompressor:
    """Error feedback with chunked top-k and 2-, 4- or 8-bit codes, for one float32 vector of
    ``numel`` elements (SparseLoCo's and DisTrO's shape of compression).

    ``average(comm, x, out)`` adds ``x`` to the error buffer (``error = decay * error + x``),
    keeps of each chunk of ``chunk`` elements the ``ceil(density * chunk)`` of largest
    magnitude, codes them on ``bits`` bits against the chunk's largest magnitude, and
    all-gathers every peer's part (``nbytes`` bytes, the same on every peer); every peer
    decodes the parts and sums them in rank order, so ``out`` (the mean) is bit-identical on
    every peer. Only then the error buffer keeps what this peer did not send (``error -=
    decoded own part``). When the all-gather raises (a peer lost, the group changed, alone:
    ``TooFewPeersError``), the error buffer is unchanged and ``out`` holds unspecified values:
    call again. ``x`` is only read.

    A check that fails on one peer's data fails the average on every peer, never only there
    (the others would wait in the all-gather): a NaN or infinity in ``error * decay + x`` (a
    chunk's kept value not finite), or an ``x`` or ``out`` this call refuses, makes this
    peer send a *poisoned* part (every scale NaN), and every peer, having gathered it, raises
    ``InvalidUsageError`` naming its rank; nothing is written to ``out`` and no error buffer
    changes, and the group goes on with the next call.

    The error buffer is this peer's own (what it has not sent yet): it is not shared state,
    and a joiner starts with zeros (another peer's residual is no substitute; what the joiner
    has not sent is nothing). ``error`` reads it; ``reset()`` zeroes it. Parts from other peers
    are checked (an index outside its chunk raises ``RemoteProtocolError`` on every peer).

    Bytes per element sent: ``nbytes / numel`` against 4 uncompressed (``ratio``).
    ``threads`` (default: the CPUs, at most 4; one with ``PCCL_AIO_KERNEL_THREADS=1``)
    share ``compress``'s chunks, each at least 64 chunks (``threads`` reads how many a call
    uses); the bytes do not depend on it.
    """

    def __init__(self, numel: int, *, density: float = 0.01, bits: int = 2, chunk: int = 4096,
                 decay: float = 1.0, threads: int | None = None) -> None:
        if not isinstance(decay, float | int) or not 0 <= decay <= 1:
            raise InvalidUsageError(f"decay must be in [0, 1], not {decay!r}")
        if threads is None:  # (PCCL_AIO_KERNEL_THREADS=1: one, as for the other kernels)
            threads = min(MAX_THREADS, os.cpu_count() or 1) if ops.KERNEL_THREADS > 1 else 1
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise InvalidUsageError(f"threads must be a positive int or None, not {threads!r}")
        self.layout = sparse.layout(numel, density=density, bits=bits, chunk=chunk)
        self.decay = float(decay)
        self.threads = len(sparse.spans(self.layout, threads))
        # Both written now: a fresh buffer is mapped page by page at its first write, which
        # would land in the second call (the buffers swap at each commit).
        self._error, self._pending = _zeros(numel), _zeros(numel)
        self._part = np.zeros(self.layout.nbytes, np.uint8)
        self._scratch = np.empty(sparse.scratch_size(self.layout) * self.threads, np.uint32)
        self._gathered = np.empty(0, np.uint8)

    @property
    def nbytes(self) -> int:
        """Bytes of one peer's part."""
        return self.layout.nbytes

    @property
    def ratio(self) -> float:
        """Uncompressed bytes (float32) over the part's bytes."""
        return 4 * self.layout.n / self.layout.nbytes

    @property
    def error(self) -> NDArray[np.float32]:
        """The error buffer (a read-only view)."""
        view = self._error.view()
        view.flags.writeable = False
        return view

    def reset(self) -> None:
        """Zero the error buffer."""
        self._error[:] = 0

    def compress(self, x: Any) -> NDArray[np.uint8]:
        """This peer's part for ``x`` (the error buffer added in, not yet changed; the part is
        reused by the next call). Pure computation, on ``threads`` threads at most (the
        calling one among them): blocks until it is done. A chunk whose kept value is not
        finite gives the poisoned part (``decompress`` raises on it, on every peer);
        InvalidUsageError for an ``x`` that is not float32 of ``numel`` elements."""
        part, _ = self._compress(x, None)
        return part

    def _compress(self, x: Any, out: Any) -> tuple[NDArray[np.uint8], str | None]:
        """The part for ``x``, and None; or the poisoned part and why (a non-finite kept
        value; with ``out`` given, also an ``x`` or ``out`` refused: the checks of
        ``decompress`` made before the exchange)."""
        src = np.asarray(x)
        if src.dtype != np.float32 or src.size != self.layout.n:
            problem = (f"x must be float32 with {self.layout.n} elements, not {src.dtype} x "
                       f"{src.size}")
            if out is None:
                raise InvalidUsageError(problem)
            return self._poisoned(), problem
        try:
            if out is not None:
                sparse.checked(out, np.float32, self.layout.n, "out", True)
            sparse.compress(self._part, src.reshape(-1), self.layout, self._scratch,
                            error=self._error, pending=self._pending, decay=self.decay,
                            threads=self.threads)
        except InvalidUsageError as exc:
            return self._poisoned(), str(exc)
        return self._part, None

    def _poisoned(self) -> NDArray[np.uint8]:
        """The part that fails the exchange on every peer: every scale a NaN, the rest 0
        (indices 0 are inside every chunk: the part is otherwise well formed)."""
        a = self.layout.sections[0]
        self._part[a:] = 0
        self._part[:a].view("<u4")[:] = _NAN_BITS
        return self._part

    def decompress(self, gathered: Any, out: Any) -> None:
        """``out`` = the mean of the decoded parts in ``gathered`` (world x ``nbytes``, rank
        order), summed in that order."""
        parts = np.asarray(gathered).reshape(-1)
        world, left = divmod(parts.size, self.nbytes)
        if world < 1 or left or parts.dtype != np.uint8:
            raise InvalidUsageError(f"gathered must be uint8, a whole number of {self.nbytes}-"
                                    f"byte parts, not {parts.dtype} x {parts.size}")
        flat = sparse.checked(out, np.float32, self.layout.n, "out", True)
        self._check_scales(parts, world, None)
        flat[:] = 0
        for r in range(world):
            sparse.accumulate(flat, parts[r * self.nbytes:(r + 1) * self.nbytes], self.layout)
        if world > 1:
            np.divide(flat, np.float32(world), out=flat)

    def _check_scales(self, parts: NDArray[np.uint8], world: int, mine: str | None) -> None:
        """InvalidUsageError (before anything is written) when a part has a scale that is not
        finite: the same bytes, so the same verdict, on every peer. ``mine``: why this
        peer's own part is poisoned, if it is."""
        a, nb = self.layout.sections[0], self.nbytes
        bad = [r for r in range(world) if not np.isfinite(
            parts[r * nb:r * nb + a].view("<f4")).all()]
        if bad or mine is not None:
            ranks = ", ".join(map(str, bad)) or "?"
            raise InvalidUsageError(
                f"sparse average failed on every peer: the part of rank {ranks} is poisoned "
                "(NaN or infinity in error * decay + x, or a call refused there)"
                + (f"; here: {mine}" if mine is not None else ""))

    def commit(self) -> None:
        """Keep in the error buffer what the last ``compress`` did not send."""
        sparse.accumulate(self._pending, self._part, self.layout, -1)
        self._error, self._pending = self._pending, self._error

    def _buffers(self, world: int) -> NDArray[np.uint8]:
        if self._gathered.size != world * self.nbytes:
            self._gathered = np.empty(world * self.nbytes, np.uint8)
        return self._gathered

    async def average(self, comm: _Async, x: Any, out: Any, *, tag: int = 0,
                      timeout: float | None = None) -> ReduceInfo:
        """Average ``x`` over ``comm``'s peer group into ``out`` (see the class). Blocks until
        the all-gather ended; raises what it raises, the error buffer then unchanged (a
        group that changed since the call: ``PeerLostError`` on every peer, the gather being
        pinned to the ring its buffer was sized for), and InvalidUsageError on every peer
        when a part is poisoned (see the class). Cancelling
        it cancels the all-gather (the error buffer unchanged)."""
        part, mine = self._compress(x, out)
        ranks = comm.ranks  # (the gather is pinned to the ring its buffer is sized for)
        gathered = self._buffers(len(ranks))
        handle = comm.all_gather_async(part, gathered, tag=tag, ring=ranks or None)
        info = await handle.wait(timeout)
        self._check_scales(gathered, gathered.size // self.nbytes, mine)
        self.decompress(gathered, out)
        self.commit()
        return info

    def average_blocking(self, comm: _Blocking, x: Any, out: Any, *, tag: int = 0,
                         timeout: float | None = None) -> ReduceInfo:
        """``average`` on a ``pccl_aio.blocking.Communicator``; blocks the calling thread."""
        part, mine = self._compress(x, out)
        ranks = comm.ranks
        gathered = self._buffers(len(ranks))
        info = comm.all_gather_async(part, gathered, tag=tag, ring=ranks or None).wait(timeout)
        self._check_scales(gathered, gathered.size // self.nbytes, mine)
        self.decompress(gathered, out)
        self.commit()
        return info
