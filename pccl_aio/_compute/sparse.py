"""Front door of the sparse compression kernels: checks, then the Cython kernels or the numpy
specification (``sparse_reference.py``; ``PCCL_AIO_NO_EXTENSIONS`` as in ``ops.py``).

``layout(n, density=, bits=, chunk=)`` fixes the shape of a vector's parts; ``compress``
writes one part, ``accumulate`` adds or subtracts a decoded part into a float32 vector. A
part that lists an index outside its chunk (a corrupt or forged one) raises
``RemoteProtocolError``, leaving unspecified values in ``dst`` (never a byte outside it).
Needs numpy.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._errors import InvalidUsageError, RemoteProtocolError
from . import sparse_reference as ref
from .ops import NO_EXTENSIONS, kernels, run_all
from .sparse_reference import CODE_BITS, Layout

__all__ = ["Layout", "accumulate", "checked", "compress", "layout", "scratch_size", "spans"]

MAX_CHUNK = 1 << 16


def layout(n: int, *, density: float, bits: int, chunk: int) -> Layout:
    """The parts' layout of an ``n``-element vector: ``ceil(density * chunk)`` kept per chunk.
    InvalidUsageError for a value out of range."""
    if not isinstance(n, int) or n < 1:
        raise InvalidUsageError(f"the vector must have at least one element, not {n!r}")
    if not isinstance(chunk, int) or not 2 <= chunk <= MAX_CHUNK:
        raise InvalidUsageError(f"chunk must be an int in 2..{MAX_CHUNK}, not {chunk!r}")
    if bits not in CODE_BITS:
        raise InvalidUsageError(f"bits must be one of {CODE_BITS}, not {bits!r}")
    if not isinstance(density, float | int) or not 0 < density <= 1:
        raise InvalidUsageError(f"density must be in (0, 1], not {density!r}")
    k = min(chunk, max(1, -int(-density * chunk // 1)))
    return Layout(n, chunk, k, bits)


def checked(buf: Any, dtype: type[np.generic], count: int, name: str,
            writable: bool) -> NDArray[Any]:
    """``buf`` as a flat array, InvalidUsageError unless it is a C-contiguous (writable)
    ``dtype`` array of ``count`` elements (a copy would lose what is written)."""
    a = np.asarray(buf)
    if a.dtype != dtype or a.size != count or not a.flags.c_contiguous or (
            writable and not a.flags.writeable):
        raise InvalidUsageError(f"{name} must be a C-contiguous{' writable' if writable else ''} "
                                f"{np.dtype(dtype).name} array of {count} elements, not "
                                f"{a.dtype} x {a.size}")
    return a.reshape(-1)


def compress(dst: Any, src: Any, lay: Layout, scratch: NDArray[np.uint32] | None = None, *,
             error: NDArray[np.float32] | None = None,
             pending: NDArray[np.float32] | None = None, decay: float = 1.0,
             threads: int = 1) -> None:
    """Write the part of ``src`` (float32, ``lay.n``) into ``dst`` (uint8, ``lay.nbytes``).
    With ``error`` and ``pending`` (float32, ``lay.n``): the part of ``pending = error * decay
    + src`` (float32, in that order), written there in the same pass. ``scratch``:
    ``scratch_size(lay)`` uint32s per thread, to reuse. ``threads``: at most that many
    threads share the chunks (``spans``; the same bytes), the calling one among them; it
    blocks until all are done. InvalidUsageError if a kept value (a chunk's largest
    magnitude) is not finite."""
    x = checked(src, np.float32, lay.n, "src", False)
    d = checked(dst, np.uint8, lay.nbytes, "dst", True)
    fed = error is not None and pending is not None
    if fed:
        e = checked(error, np.float32, lay.n, "error", False)
        p = checked(pending, np.float32, lay.n, "pending", True)
    a, b, _ = lay.sections
    try:
        if NO_EXTENSIONS:
            if fed:
                np.multiply(e, np.float32(decay), out=p)
                np.add(p, x, out=p)
                x = p
            d[:] = ref.compress(x, lay)
            return
        parts = spans(lay, threads)
        size = scratch_size(lay)
        if scratch is None or scratch.size < size * len(parts):
            scratch = np.empty(size * len(parts), np.uint32)
        work = p if fed else x
        feed = (x.view(np.uint8), e.view(np.uint8), decay) if fed else (None, None, 1.0)

        def run(i: int) -> None:
            kernels().sparse_compress(
                d, work.view(np.uint8), lay.chunk, lay.k, lay.index_bits, lay.bits, a, a + b,
                scratch[i * size:(i + 1) * size].view(np.uint8), *feed, *parts[i])

        run_all([functools.partial(run, i) for i in range(len(parts))])
    except ValueError as exc:
        raise InvalidUsageError(f"cannot compress: {exc} (NaN or infinity in the input)") \
            from None


def scratch_size(lay: Layout) -> int:
    """uint32s of scratch ``compress`` works in, per thread."""
    return 3 * lay.chunk + 2


MIN_SPAN = 64  # chunks a thread takes at least (256 Ki elements at chunk 4096)


def spans(lay: Layout, threads: int) -> list[tuple[int, int]]:
    """The chunk ranges ``compress`` gives to at most ``threads`` threads, and to at most
    one per ``MIN_SPAN`` chunks (a thread's start costs more than a few small chunks take):
    about equal, each starting at a multiple of 8 chunks (so that no two write one byte)."""
    n = max(1, min(threads, lay.chunks // MIN_SPAN))
    step = -(-lay.chunks // n // 8) * 8
    return [(i, min(i + step, lay.chunks)) for i in range(0, lay.chunks, step)]


def accumulate(dst: Any, part: Any, lay: Layout, sign: int = 1) -> None:
    """Add (``sign`` 1) or subtract (-1) the decoded ``part`` into ``dst`` (float32,
    ``lay.n``), in the part's order. RemoteProtocolError for a part that lists an index
    outside its chunk."""
    d = checked(dst, np.float32, lay.n, "dst", True)
    p = checked(part, np.uint8, lay.nbytes, "part", False)
    a, b, _ = lay.sections
    if NO_EXTENSIONS:
        idx = ref.unpack(p[a:a + b], lay.kept, lay.index_bits)
        if _outside(idx, lay):
            raise RemoteProtocolError("a sparse part lists an index outside its chunk")
        ref.accumulate(d, p, lay, sign)
        return
    try:
        kernels().sparse_accumulate(d.view(np.uint8), p, lay.chunk, lay.k, lay.index_bits,
                                    lay.bits, a, a + b, 1 if sign > 0 else -1)
    except ValueError as exc:
        raise RemoteProtocolError(f"a corrupt sparse part: {exc}") from None


def _outside(idx: NDArray[np.int64], lay: Layout) -> bool:
    """Does any index of a part lie outside its chunk (only the last chunk is shorter)?"""
    tail = lay.n - (lay.chunks - 1) * lay.chunk
    limit = np.full(lay.kept, lay.chunk)
    limit[lay.kept - min(lay.k, tail):] = tail
    return bool((idx >= limit).any())
