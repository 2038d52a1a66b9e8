"""Front door of the kernels: checks arguments, then calls the Cython or numpy implementation.

The kernels themselves (``pccl_aio/_kernels.pyx``, and ``reference.py`` which is the specification)
trust their arguments; every check lives here and raises ``InvalidUsageError`` before any
byte is touched. The checks are O(1) because they run once per segment on the hot path.
Dtypes, ops and algorithms are the int values of ``_types``' enums; messages name them.

``PCCL_AIO_NO_EXTENSIONS=1`` (any value but "" or "0") forces the numpy reference;
otherwise the Cython module is used when it imports, else numpy (logged once at DEBUG).
Only the reference imports numpy. Buffers: anything exposing a C-contiguous buffer (numpy
arrays, memoryview, bytearray, a ``Buffer.view``); a ``dst`` must be writable. bfloat16
data is passed as its raw 16-bit words. A ``dst`` must not partially overlap its ``src``
(the same buffer is fine).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, cast

from .._errors import InvalidUsageError
from .._types import (
    DTYPE_ITEMSIZE,
    DTYPE_NAMES,
    FLOAT_DTYPES,
    MIN_MAX_ONLY,
    QUANT_BITS,
    QUANTIZED_DTYPES,
    DataType,
    QuantAlgo,
    ReduceOp,
    as_index,
)

if TYPE_CHECKING:
    from numpy.typing import NDArray
    from typing_extensions import Buffer

#: What the functions accept: anything exposing a C-contiguous buffer.
BufferLike: TypeAlias = "Buffer | NDArray[Any]"

__all__ = [
    "copy",
    "IMPLEMENTATION",
    "dequantize",
    "dequantize_accumulate",
    "divide",
    "minmax",
    "quantize",
    "reduce_into",
]

_log = logging.getLogger(__name__)

NO_EXTENSIONS = os.environ.get("PCCL_AIO_NO_EXTENSIONS", "") not in ("", "0")

_NEEDS_NUMPY = ("pccl_aio needs its compiled kernels or numpy: install numpy "
                "(pip install 'pccl_aio[numpy]') or build the extension")

if TYPE_CHECKING:
    from . import reference as _impl
elif NO_EXTENSIONS:
    try:
        from . import reference as _impl
    except ModuleNotFoundError as exc:  # pragma: no cover - numpy missing
        raise ImportError(f"PCCL_AIO_NO_EXTENSIONS is set: {_NEEDS_NUMPY}") from exc
else:
    try:
        from .. import _kernels as _impl
    except ImportError as exc:  # pragma: no cover - depends on the build
        try:
            from . import reference as _impl
        except ModuleNotFoundError as exc2:
            raise ImportError(f"{_NEEDS_NUMPY} ({exc})") from exc2
        _log.debug("pccl_aio._kernels unavailable (%s); using the numpy kernels", exc)

#: Which kernels run: "cython" (compiled extension) or "numpy" (the reference).
IMPLEMENTATION: Literal["cython", "numpy"] = (
    "cython" if _impl.__name__.endswith("._kernels") else "numpy"
)

# int value -> itemsize, derived from the dtype table of _types.py.
_ITEMSIZE: dict[int, int] = {int(dt): size for dt, size in DTYPE_ITEMSIZE.items()}
_QBITS: dict[int, int] = {int(dt): bits for dt, bits in QUANT_BITS.items()}
_MIN_MAX_ONLY: frozenset[int] = frozenset(int(dt) for dt in MIN_MAX_ONLY)
_FLOATS: frozenset[int] = frozenset(int(dt) for dt in FLOAT_DTYPES)
# The kernels take plain ints (an IntEnum argument costs a conversion per call).
_OP_INT: dict[ReduceOp, int] = {op: int(op) for op in ReduceOp}
_ALGO_INT: dict[QuantAlgo, int] = {a: int(a) for a in QuantAlgo if a is not QuantAlgo.NONE}
_MAX_DIVISOR = 2**31 - 1  # a world size
#: Largest magnitude accepted for dequantization metadata (twice the quantizer's limit).
_META_LIMIT = 2.0**1001

# Large element-wise jobs are split over two threads (the kernels release the GIL): one core
# does not saturate memory bandwidth here, two do (64 MiB f32 SUM: about 1.2-1.3x numpy's
# single-threaded add). The pipeline's 1 MiB segments stay on the calling thread.
# PCCL_AIO_KERNEL_THREADS=1 turns it off. quantize is never split (its range is global).
PARALLEL_MIN_BYTES = 8 << 20
KERNEL_THREADS = max(1, min(2, int(os.environ.get("PCCL_AIO_KERNEL_THREADS", "2") or 2),
                            os.cpu_count() or 1))
_pool: tuple[int, ThreadPoolExecutor] | None = None  # (the process it belongs to, the pool)


def kernels() -> ModuleType:
    """The kernel module in use, without argument checks or thread splitting: for a caller
    that validated its buffers once and calls with byte views it cut itself (the ring's
    per-segment jobs, at most one segment long)."""
    return _impl


def _split(nbytes: int, size: int) -> int:
    """Byte offset where a large job is cut in two (element- and cache-line aligned), or 0."""
    if KERNEL_THREADS < 2 or nbytes < PARALLEL_MIN_BYTES:
        return 0
    unit = size * 64
    return (nbytes // 2) // unit * unit


def _in_two(cut: int, job: Callable[[int, int], None], total: int) -> None:
    """Run ``job(0, cut)`` on a kernel thread and ``job(cut, total)`` here; both finish."""
    run_all([lambda: job(cut, total), lambda: job(0, cut)])


def run_all(jobs: list[Callable[[], None]]) -> None:
    """Run ``jobs[0]`` on the calling thread and the others on the kernel threads (the
    kernels release the GIL: they run at once); returns once every job finished, raising
    the first failure. Blocks the calling thread meanwhile."""
    global _pool
    if len(jobs) == 1:
        jobs[0]()
        return
    if _pool is None or _pool[0] != os.getpid():
        # (made at the first use in each process: a child forked after a parent's use has
        # none of its threads, and would wait for them forever)
        _pool = (os.getpid(), ThreadPoolExecutor(max(1, (os.cpu_count() or 1) - 1),
                                                 thread_name_prefix="pccl_aio-kernel"))
    others = [_pool[1].submit(j) for j in jobs[1:]]
    try:
        jobs[0]()
    finally:
        failures = [f.exception() for f in others]
    for exc in failures:
        if exc is not None:
            raise exc


def _bytes(buf: BufferLike, name: str, writable: bool) -> memoryview:
    """A flat byte memoryview of buf (a cast, no copy), checking writability if asked."""
    try:
        mv = memoryview(cast("Buffer", buf)).cast("B")  # fails unless C-contiguous
    except (TypeError, ValueError):
        raise InvalidUsageError(_buffer_problem(buf, name)) from None
    if writable and mv.readonly:
        raise InvalidUsageError(f"{name} is read-only")
    return mv


def _buffer_problem(buf: BufferLike, name: str) -> str:
    try:
        mv = memoryview(cast("Buffer", buf))
    except TypeError:
        return f"{name} must support the buffer protocol, not {type(buf).__name__}"
    if not mv.c_contiguous:
        return f"{name} must be a C-contiguous buffer"
    return f"{name} has an unsupported buffer format {mv.format!r}"


def _lookup(table: dict[int, int], value: object) -> int | None:
    """table[value] for an integer (int, IntEnum, numpy integer; not bool), else None."""
    if type(value) is int:  # the hot path's case, without a call
        return table.get(value)
    i = as_index(value)
    return None if i is None else table.get(i)


def _itemsize(dtype: int, name: str = "dtype") -> int:
    size = _lookup(_ITEMSIZE, dtype)
    if size is None:
        raise InvalidUsageError(f"unknown {name} {dtype!r}")
    return size


def _float_itemsize(dtype: int, name: str) -> int:
    size = _itemsize(dtype, name)
    if dtype not in _FLOATS:
        raise InvalidUsageError(f"{name} must be {_names(FLOAT_DTYPES)}, "
                                f"not {DTYPE_NAMES[DataType(int(dtype))]}")
    return size


def _names(dtypes: Collection[DataType]) -> str:
    names = [dt.label for dt in sorted(dtypes)]
    return f"{', '.join(names[:-1])} or {names[-1]}"


def _q_bits(q_dtype: int, algo: int) -> int:
    """Bits per code of a quantized dtype that ``algo`` (checked already) supports."""
    bits = _lookup(_QBITS, q_dtype)
    if bits is None:
        known = _lookup(_ITEMSIZE, q_dtype) is not None
        shown = DTYPE_NAMES[DataType(int(q_dtype))] if known else repr(q_dtype)
        raise InvalidUsageError(f"quantized dtype must be {_names(QUANTIZED_DTYPES)}, not {shown}")
    if q_dtype in _MIN_MAX_ONLY and algo != QuantAlgo.MIN_MAX:
        raise InvalidUsageError(f"{DataType(int(q_dtype)).label} quantization supports MIN_MAX "
                                f"only, not {QuantAlgo(algo).name}")
    return bits


def _code_bytes(count: int, bits: int) -> int:
    """Bytes of ``count`` codes of ``bits`` each (4-bit codes: two per byte, rounded up)."""
    return (count * bits + 7) >> 3


def _op(op: int) -> int:
    """The reduce op's value. The check is ``ReduceOp.parse`` (shared with the peer's
    arguments); the per-segment calls' plain ints skip the call."""
    if type(op) is int and op in _OP_INT:
        return op
    return _OP_INT[ReduceOp.parse(op)]


def _algo(algo: int) -> int:
    """The value of a quantizing algorithm (not NONE), checked as :func:`_op`."""
    if type(algo) is int and algo in _ALGO_INT:
        return algo
    a = _ALGO_INT.get(QuantAlgo.parse(algo))
    if a is None:
        raise InvalidUsageError("quantization algorithm NONE does not quantize")
    return a


def _check_elements(nbytes: int, size: int, name: str) -> int:
    if nbytes % size:
        raise InvalidUsageError(f"{name} has {nbytes} bytes, not a multiple of itemsize {size}")
    return nbytes // size


def _check_meta(p0: float, p1: float) -> None:
    """Finite numbers up to 2**1001, or a NaN ``p0`` (a poisoned block: ``p1`` any number)."""
    try:
        finite = [math.isfinite(p) and abs(float(p)) <= _META_LIMIT for p in (p0, p1)]
        ok = all(finite) or math.isnan(p0)
    except TypeError:
        ok = False
    if not ok:
        raise InvalidUsageError(
            f"quantization metadata must be finite numbers up to 2**1001 (or a NaN p0: a "
            f"poisoned block), got {(p0, p1)!r}")


def _run(total: int, size: int, job: Callable[[int, int], None]) -> None:
    """``job(0, total)`` over byte offsets, as two halves on two threads when it is large."""
    cut = _split(total, size)
    if cut:
        _in_two(cut, job, total)
    else:
        job(0, total)


def reduce_into(dst: BufferLike, src: BufferLike, op: int, dtype: int) -> None:
    """``dst[i] = op(dst[i], src[i])`` element-wise (AVG adds; see :func:`divide`)."""
    d, s = _bytes(dst, "dst", True), _bytes(src, "src", False)
    size = _itemsize(dtype)
    op = _op(op)
    if d.nbytes != s.nbytes:
        raise InvalidUsageError(f"length mismatch: dst has {d.nbytes} bytes, src {s.nbytes}")
    _check_elements(d.nbytes, size, "dst")
    dtype = int(dtype)
    _run(d.nbytes, size, lambda a, b: _impl.reduce_into(d[a:b], s[a:b], op, dtype))


def reduce_from(dst: BufferLike, a: BufferLike, b: BufferLike, op: int, dtype: int) -> None:
    """``dst[i] = op(a[i], b[i])`` element-wise, the same bits as copying ``a`` into ``dst``
    and then :func:`reduce_into` (AVG adds). ``a`` or ``b`` may be ``dst`` itself (the same
    start and length); no other overlap."""
    d = _bytes(dst, "dst", True)
    x, y = _bytes(a, "a", False), _bytes(b, "b", False)
    size = _itemsize(dtype)
    op = _op(op)
    if not d.nbytes == x.nbytes == y.nbytes:
        raise InvalidUsageError(
            f"length mismatch: dst has {d.nbytes} bytes, a {x.nbytes}, b {y.nbytes}")
    _check_elements(d.nbytes, size, "dst")
    dtype = int(dtype)
    _run(d.nbytes, size,
         lambda lo, hi: _impl.reduce_from(d[lo:hi], x[lo:hi], y[lo:hi], op, dtype))


def divide(dst: BufferLike, divisor: int, dtype: int) -> None:
    """AVG finalisation ``dst[i] /= divisor``; integers truncate toward zero."""
    d = _bytes(dst, "dst", True)
    size = _itemsize(dtype)
    div = divisor if type(divisor) is int else as_index(divisor)
    if div is None or not 1 <= div <= _MAX_DIVISOR:
        raise InvalidUsageError(f"divisor must be an int in [1, 2**31 - 1], not {divisor!r}")
    _check_elements(d.nbytes, size, "dst")
    dtype = int(dtype)
    _run(d.nbytes, size, lambda a, b: _impl.divide(d[a:b], div, dtype))


def copy(dst: memoryview, src: memoryview) -> None:
    """``dst[:] = src`` for byte views of equal length; large copies use two threads."""
    if dst.nbytes != src.nbytes:
        raise InvalidUsageError(f"length mismatch: dst has {dst.nbytes} bytes, src {src.nbytes}")
    cut = _split(dst.nbytes, 1)
    if cut:  # the kernels' copy releases the GIL, unlike memoryview slice assignment
        _in_two(cut, lambda a, b: _impl.copy(dst[a:b], src[a:b]), dst.nbytes)
    else:
        dst[:] = src


def minmax(src: BufferLike, dtype: int) -> tuple[float, float]:
    """(min, max) of the finite elements of a float buffer, (0.0, 0.0) if none."""
    s = _bytes(src, "src", False)
    _check_elements(s.nbytes, _float_itemsize(dtype, "dtype"), "src")
    return _impl.minmax(s, int(dtype))


def quantize(dst_q: BufferLike, src: BufferLike, src_dtype: int, q_dtype: int, algo: int
             ) -> tuple[float, float]:
    """Quantize ``src`` into ``dst_q`` (one code per element; uint4: two per byte, element
    2i in the low nibble); return the metadata pair. A NaN, an infinity or a float64 value
    beyond 2**1000 poisons the block: codes 0, metadata ``(nan, nan)``, which decodes to NaN
    (``reference.py`` states the policy)."""
    d, s = _bytes(dst_q, "dst_q", True), _bytes(src, "src", False)
    n = _check_elements(s.nbytes, _float_itemsize(src_dtype, "src_dtype"), "src")
    algo = _algo(algo)
    need = _code_bytes(n, _q_bits(q_dtype, algo))
    if d.nbytes != need:
        raise InvalidUsageError(
            f"length mismatch: dst_q has {d.nbytes} bytes, {n} codes need {need}"
        )
    return _impl.quantize(d, s, int(src_dtype), int(q_dtype), algo)


def _check_dequantize(dst: BufferLike, src_q: BufferLike, p0: float, p1: float, dst_dtype: int,
                      q_dtype: int, algo: int) -> tuple[memoryview, memoryview]:
    d, s = _bytes(dst, "dst", True), _bytes(src_q, "src_q", False)
    n = _check_elements(d.nbytes, _float_itemsize(dst_dtype, "dst_dtype"), "dst")
    need = _code_bytes(n, _q_bits(q_dtype, _algo(algo)))
    _check_meta(p0, p1)
    if s.nbytes != need:
        raise InvalidUsageError(
            f"length mismatch: src_q has {s.nbytes} bytes, {n} elements need {need}"
        )
    return d, s


def dequantize(dst: BufferLike, src_q: BufferLike, p0: float, p1: float, dst_dtype: int,
               q_dtype: int, algo: int) -> None:
    """``dst[i] = D(q[i])`` with the metadata ``(p0, p1)`` returned by :func:`quantize`."""
    d, s = _check_dequantize(dst, src_q, p0, p1, dst_dtype, q_dtype, algo)
    _run_decoding(_impl.dequantize, d, s, int(dst_dtype), int(q_dtype),
                  (float(p0), float(p1), int(dst_dtype), int(q_dtype), int(algo)))


def dequantize_accumulate(dst: BufferLike, src_q: BufferLike, p0: float, p1: float, op: int,
                          dst_dtype: int, q_dtype: int, algo: int) -> None:
    """``dst[i] = op(dst[i], D(q[i]))`` in one pass (bit-identical to dequantize + reduce)."""
    d, s = _check_dequantize(dst, src_q, p0, p1, dst_dtype, q_dtype, algo)
    op = _op(op)
    _run_decoding(_impl.dequantize_accumulate, d, s, int(dst_dtype), int(q_dtype),
                  (float(p0), float(p1), op, int(dst_dtype), int(q_dtype), int(algo)))


def _run_decoding(kernel: Callable[..., None], d: memoryview, s: memoryview, dst_dtype: int,
                  q_dtype: int, args: tuple[Any, ...]) -> None:
    """Run a decoding kernel over (dst, codes), in two halves when the job is large (the
    cut falls on a multiple of 64 elements, so on a whole byte of 4-bit codes)."""
    size, bits = _ITEMSIZE[dst_dtype], _QBITS[q_dtype]
    _run(d.nbytes, size, lambda a, b: kernel(
        d[a:b], s[_code_bytes(a // size, bits) : _code_bytes(b // size, bits)], *args))
