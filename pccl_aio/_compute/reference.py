"""Numpy reference kernels: the specification of pccl_aio's element-wise arithmetic.

``pccl_aio/_kernels.pyx`` implements the same functions and must produce byte-identical results;
``ops.py`` validates arguments and then calls one of the two. These functions do not check
their arguments. Buffers are C-contiguous byte buffers that hold elements of ``dtype`` (an
int ``DataType`` value); bfloat16 elements are raw ``uint16`` words. A ``dst`` may be the
same buffer as its ``src`` but must not partially overlap it.

Semantics (the contract the Cython kernels match):

* Integers wrap on overflow (two's complement). ``divide`` truncates toward zero (C).
* float32/float64 compute in their own type. float16 and bfloat16 are widened to float32
  (exactly), computed in float32 and rounded back to nearest-even: float16 exactly as
  numpy's ``float32 -> float16`` cast, bfloat16 with :func:`f32_to_bf16`.
* NaN: SUM, PROD and ``divide`` write the canonical quiet NaN (``0x7e00`` f16, ``0x7fc0``
  bf16, ``0x7fc00000`` f32, ``0x7ff8000000000000`` f64) for every NaN result, so the
  payload never depends on the CPU or on operand order. MIN and MAX return one operand's
  bits unchanged: ``dst`` if it is NaN, else ``src`` if it is NaN, else the smaller
  (larger) one; on a tie (``-0.0`` vs ``0.0``) the result is ``src``.
* Quantization (``MIN_MAX`` and ``ZERO_POINT_SCALE``, to ``uint8``/``uint16`` codes with
  ``qmax`` = 255/65535; ``MIN_MAX`` also to ``uint4``, ``qmax`` = 15) computes in float64,
  rounds half to even (``np.rint``) and is described at :func:`quantize` /
  :func:`dequantize`. uint4 codes are packed two per byte: element ``2i`` in the low nibble
  of byte ``i``, ``2i + 1`` in its high nibble; after an odd count the last byte's high
  nibble is 0 (and is ignored when decoding).
* Non-finite values never become finite ones. A buffer quantized at once (a *block*: the
  ring's segment) that holds a NaN, an infinity or (float64) a value beyond
  ``QUANT_LIMIT`` is *poisoned*: its codes are all 0 and its metadata ``(NaN, NaN)``;
  decoding a NaN ``p0`` gives the canonical NaN in every element (the accumulate reduces
  with it: NaN for SUM/AVG/PROD, a NaN ``dst`` kept by MIN/MAX). The codes are limited so
  that every one decodes to a finite value of the source dtype (a zero point's half step
  beyond a range at the dtype's largest value would round to infinity).
  :func:`minmax` (the finite elements) does not change.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np
from numpy.typing import NDArray

from .._types import NUMPY_STORAGE, DataType, QuantAlgo, ReduceOp

#: What the kernels accept: C-contiguous buffers (``ops`` passes byte memoryviews).
Buffer: TypeAlias = "bytes | bytearray | memoryview | NDArray[Any]"

__all__ = [
    "QUANT_LIMIT",
    "QUANT_MIN_SPAN",
    "copy",
    "dequantize",
    "dequantize_accumulate",
    "divide",
    "f32_to_bf16",
    "minmax",
    "quantize",
    "reduce_into",
]

# The int values of DataType, ReduceOp and QuantAlgo used by the arithmetic below.
F16, BF16, F32, F64 = (int(d) for d in (DataType.FLOAT16, DataType.BFLOAT16, DataType.FLOAT32,
                                        DataType.FLOAT64))
U8, U16, U64 = int(DataType.UINT8), int(DataType.UINT16), int(DataType.UINT64)
U4 = int(DataType.UINT4)
SUM, AVG, PROD, MAX, MIN = (int(op) for op in ReduceOp)
MIN_MAX, ZERO_POINT_SCALE = int(QuantAlgo.MIN_MAX), int(QuantAlgo.ZERO_POINT_SCALE)

#: Element type of each DataType value as numpy sees it (bfloat16 as its raw bits).
NP_DTYPES: dict[int, type[np.generic]] = {
    int(dt): np.dtype(name).type for dt, name in NUMPY_STORAGE.items()}
#: Canonical quiet NaN written by SUM, PROD and divide.
CANONICAL_NAN_BITS = {F16: 0x7E00, BF16: 0x7FC0, F32: 0x7FC00000, F64: 0x7FF8000000000000}
#: Quantization ranges stay within [-QUANT_LIMIT, QUANT_LIMIT] so that no intermediate
#: overflows; only float64 data can exceed it, and such a value poisons its block.
QUANT_LIMIT = 2.0**1000
#: A range narrower than this quantizes to a constant (all codes 0): ``qmax / span`` would
#: overflow float64. The values then differ by less than 2**-1000.
QUANT_MIN_SPAN = 2.0**-1000
QMAX = {U8: 255, U16: 65535, U4: 15}


def pack4(q: NDArray[Any]) -> NDArray[np.uint8]:
    """Codes 0..15 -> bytes, two per byte: ``q[2i] | q[2i + 1] << 4`` (0 after an odd end)."""
    c = q.astype(np.uint8)
    if c.size % 2:
        c = np.append(c, np.uint8(0))
    packed: NDArray[np.uint8] = c[0::2] | (c[1::2] << np.uint8(4))
    return packed


def unpack4(raw: Buffer, n: int) -> NDArray[np.uint8]:
    """The first ``n`` 4-bit codes of the packed bytes ``raw`` (inverse of :func:`pack4`)."""
    b = np.frombuffer(raw, np.uint8)
    c = np.empty(2 * b.size, np.uint8)
    c[0::2] = b & np.uint8(15)
    c[1::2] = b >> np.uint8(4)
    return c[:n]


def _view(buf: Buffer, dtype: int) -> NDArray[Any]:
    view: NDArray[Any] = np.frombuffer(buf, dtype=NP_DTYPES[dtype])
    return view


def _widen(a: NDArray[Any], dtype: int) -> NDArray[Any]:
    """float16/bfloat16 -> float32 exactly (bf16 bits become the top half); others as is."""
    if dtype == F16:
        return a.astype(np.float32)
    if dtype == BF16:
        return (a.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return a


def f32_to_bf16(x: NDArray[np.float32]) -> NDArray[np.uint16]:
    """float32 -> bfloat16 bits, round to nearest-even; a NaN keeps its top bits, quieted."""
    bits = x.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    quieted = (bits >> np.uint32(16)) | np.uint32(0x0040)
    return np.where(np.isnan(x), quieted, rounded).astype(np.uint16)


def _narrow(r: NDArray[Any], dtype: int) -> NDArray[Any]:
    """Inverse of _widen: float32 -> float16 (numpy's cast) or bfloat16 (f32_to_bf16)."""
    if dtype == F16:
        return r.astype(np.float16)
    if dtype == BF16:
        return f32_to_bf16(r)
    return r


def _canonical_nan(r: NDArray[Any]) -> NDArray[Any]:
    """Replace every NaN with the canonical quiet NaN of r's type (positive, payload 0)."""
    return np.where(np.isnan(r), r.dtype.type(np.nan), r)


def reduce_into(dst: Buffer, src: Buffer, op: int, dtype: int) -> None:
    """``dst[i] = op(dst[i], src[i])``; AVG adds (its division is :func:`divide`)."""
    d, s = _view(dst, dtype), _view(src, dtype)
    if dtype < F16:
        if op in (SUM, AVG):
            np.add(d, s, out=d)
        elif op == PROD:
            np.multiply(d, s, out=d)
        elif op == MAX:
            np.maximum(d, s, out=d)
        elif op == MIN:
            np.minimum(d, s, out=d)
        else:
            raise ValueError(f"unknown op {op}")
        return
    a, b = _widen(d, dtype), _widen(s, dtype)
    with np.errstate(all="ignore"):
        if op in (MIN, MAX):
            better = a < b if op == MIN else a > b
            d[...] = np.where(np.isnan(a) | better, d, s)  # bits of one operand, unchanged
            return
        if op in (SUM, AVG):
            r = a + b
        elif op == PROD:
            r = a * b
        else:
            raise ValueError(f"unknown op {op}")
        d[...] = _narrow(_canonical_nan(r), dtype)


def reduce_from(dst: Buffer, a: Buffer, b: Buffer, op: int, dtype: int,
                save: Buffer | None = None) -> None:
    """``dst[i] = op(a[i], b[i])``: :func:`reduce_into` on a copy of ``a``, bit for bit.
    ``dst`` may be ``a`` or ``b`` itself (the whole buffer, not a partial overlap). With
    ``save``, ``a``'s bytes are first copied there (an in-place backup, read in the same
    pass; Cython streams them past the cache)."""
    d = np.frombuffer(dst, np.uint8)
    av = np.frombuffer(a, np.uint8)[: d.size]
    if save is not None:
        np.frombuffer(save, np.uint8)[: d.size] = av
    bv = np.frombuffer(b, np.uint8)[: d.size]
    if d.ctypes.data == bv.ctypes.data and d.size:
        bv = bv.copy()
    if d.ctypes.data != av.ctypes.data:
        d[...] = av
    reduce_into(dst, bv, op, dtype)


def copy(dst: Buffer, src: Buffer) -> None:
    """``dst[:] = src[:len(dst)]`` (Cython: a memmove without the GIL)."""
    d = np.frombuffer(dst, np.uint8)
    np.copyto(d, np.frombuffer(src, np.uint8)[: d.size])


def stream_copy(dst: Buffer, src: Buffer) -> None:
    """``dst[:] = src[:len(dst)]`` (Cython: with stores that bypass the cache)."""
    d = np.frombuffer(dst, np.uint8)
    d[...] = np.frombuffer(src, np.uint8)[: d.size]


def divide(dst: Buffer, divisor: int, dtype: int) -> None:
    """AVG finalisation ``dst[i] /= divisor`` (divisor >= 1); integers truncate toward zero."""
    d = _view(dst, dtype)
    if dtype < F16:
        wide = np.uint64 if dtype == U64 else np.int64
        w = d.astype(wide)
        div = wide(divisor)
        q = w // div  # floor; the remainder w - q * div lies in [0, div)
        if dtype % 2:  # signed: a negative value with a remainder rounds up
            q += ((w - q * div) != 0) & (w < 0)
        d[...] = q.astype(d.dtype)
        return
    a = _widen(d, dtype)
    with np.errstate(all="ignore"):
        r = a / a.dtype.type(divisor)
    d[...] = _narrow(_canonical_nan(r), dtype)


def _as_f64(src: Buffer, dtype: int) -> NDArray[np.float64]:
    with np.errstate(invalid="ignore"):  # signalling NaNs
        return _widen(_view(src, dtype), dtype).astype(np.float64)


def minmax(src: Buffer, dtype: int) -> tuple[float, float]:
    """(min, max) of the finite elements of a float buffer; ``(0.0, 0.0)`` if there are none.

    A zero result is always ``+0.0``.
    """
    x = _as_f64(src, dtype)
    finite = x[np.isfinite(x)]
    if finite.size == 0:
        return 0.0, 0.0
    return float(finite.min()) + 0.0, float(finite.max()) + 0.0


def _clamp(t: NDArray[np.float64], lo: float, hi: float) -> NDArray[np.float64]:
    """Clamp to [lo, hi]; NaN becomes lo (written so that it reads like the C code)."""
    t = np.where(t > lo, t, lo)
    return np.where(t < hi, t, hi)


def quantize(dst_q: Buffer, src: Buffer, src_dtype: int, q_dtype: int, algo: int
             ) -> tuple[float, float]:
    """Quantize the float buffer ``src`` into codes in ``dst_q``; return the metadata.

    ``mn, mx = minmax(src)`` clamped to [-QUANT_LIMIT, QUANT_LIMIT]; all in float64:

    * MIN_MAX: ``lo, hi = mn, mx``; ``inv = qmax / (hi - lo)``;
      ``q = rint(clamp((x - lo) * inv, 0, qmax))``, or 0 everywhere when
      ``hi - lo < QUANT_MIN_SPAN`` (a constant, or a range too narrow to scale).
      Returns ``(lo, hi)``.
    * ZERO_POINT_SCALE: ``lo, hi = min(mn, 0), max(mx, 0)``; ``span = hi - lo``;
      ``inv = qmax / span``; ``zp = rint(-lo * inv)``;
      ``q = rint(clamp(x * inv, -zp, qmax - zp)) + zp`` (all 0, zp 0, when
      ``span < QUANT_MIN_SPAN``).
      Returns ``(span, zp)``; the span (not ``span / qmax``) is sent so that constants
      survive exactly (see :func:`dequantize`).

    A code whose value (:func:`dequantize` into ``src_dtype``) would be infinite is not
    used: the clamp's end moves in by one (``clamp(.., 1, qmax)`` or ``clamp(.., -zp + 1,
    ..)``), a whole step from a value at that end instead of half of one.

    A poisoned ``src`` (a NaN, an infinity, a value beyond QUANT_LIMIT) gets codes 0 and
    ``(nan, nan)``.
    """
    x = _as_f64(src, src_dtype)
    qmax = float(QMAX[q_dtype])
    with np.errstate(invalid="ignore"):
        poisoned = not (np.abs(x) <= QUANT_LIMIT).all()  # (NaN compares False)
    if poisoned:
        q, meta = np.zeros_like(x), (float("nan"), float("nan"))
    else:
        q, meta = _codes(x, src_dtype, q_dtype, algo, qmax)
    if q_dtype == U4:
        np.frombuffer(dst_q, np.uint8)[...] = pack4(q)
    else:
        _view(dst_q, q_dtype)[...] = q.astype(NP_DTYPES[q_dtype])
    return meta


def _codes(x: NDArray[np.float64], dtype: int, q_dtype: int, algo: int, qmax: float
           ) -> tuple[NDArray[np.float64], tuple[float, float]]:
    """The codes (as float64) and metadata of a block that is not poisoned."""
    mn, mx = (min(max(v, -QUANT_LIMIT), QUANT_LIMIT) for v in minmax(x, F64))
    with np.errstate(all="ignore"):
        if algo == MIN_MAX:
            lo, hi = mn, mx
            meta = (lo, hi)
            if hi - lo < QUANT_MIN_SPAN:
                return np.zeros_like(x), meta
            first, last = _usable(meta, dtype, q_dtype, algo)
            return np.rint(_clamp((x - lo) * (qmax / (hi - lo)), first, last)), meta
        if algo != ZERO_POINT_SCALE:
            raise ValueError(f"unknown quantization algorithm {algo}")
        lo, hi = min(mn, 0.0), max(mx, 0.0)
        span = hi - lo
        if span < QUANT_MIN_SPAN:
            return np.zeros_like(x), (span, 0.0)
        inv = qmax / span
        zp = float(np.rint(-lo * inv)) + 0.0
        first, last = _usable((span, zp), dtype, q_dtype, algo)
        return np.rint(_clamp(x * inv, first - zp, last - zp)) + zp, (span, zp)


def _usable(meta: tuple[float, float], dtype: int, q_dtype: int, algo: int
            ) -> tuple[float, float]:
    """The first and last codes that decode to finite values of ``dtype`` (0 and qmax,
    unless one of them would round to infinity)."""
    qmax = float(QMAX[q_dtype])
    ends = _decode(np.array([0.0, qmax]), meta[0], meta[1], dtype, algo, qmax)
    wide = _widen(ends, dtype) if dtype != F64 else ends
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(wide.astype(np.float64))
    return (0.0 if finite[0] else 1.0), (qmax if finite[1] else qmax - 1.0)


def _decode(q: NDArray[np.float64], p0: float, p1: float, dst_dtype: int, algo: int,
            qmax: float) -> NDArray[Any]:
    """D(q) of float64 codes in the dst dtype (bfloat16 as bits)."""
    if algo == MIN_MAX:
        y = p0 + q * ((p1 - p0) / qmax)
    elif algo == ZERO_POINT_SCALE:
        y = ((q - p1) * p0) / qmax
    else:
        raise ValueError(f"unknown quantization algorithm {algo}")
    if dst_dtype == F64:
        return y
    with np.errstate(over="ignore"):
        return _narrow(y.astype(np.float32), dst_dtype)


def _dequantized(src_q: Buffer, p0: float, p1: float, dst_dtype: int, q_dtype: int,
                 algo: int, n: int) -> NDArray[Any]:
    """The ``n`` values D(q) in the dst dtype (bfloat16 as bits); a NaN ``p0`` (a
    poisoned block): the canonical NaN in each."""
    if p0 != p0:
        bits = {F64: np.uint64, F32: np.uint32}.get(dst_dtype, np.uint16)
        nan: NDArray[Any] = np.full(n, CANONICAL_NAN_BITS[dst_dtype], bits)
        return nan.view(NP_DTYPES[dst_dtype])
    codes = unpack4(src_q, n) if q_dtype == U4 else _view(src_q, q_dtype)
    return _decode(codes.astype(np.float64), p0, p1, dst_dtype, algo, float(QMAX[q_dtype]))


def dequantize(dst: Buffer, src_q: Buffer, p0: float, p1: float, dst_dtype: int,
               q_dtype: int, algo: int) -> None:
    """``dst[i] = D(q[i])``: computed in float64, rounded to float32, then to 16 bits.

    * MIN_MAX with meta ``(lo, hi)``: ``D(q) = lo + q * ((hi - lo) / qmax)``.
    * ZERO_POINT_SCALE with meta ``(span, zp)``: ``D(q) = ((q - zp) * span) / qmax``; a
      constant c (>= 0 or <= 0) has ``q - zp == +/-qmax``, so D gives back c exactly.
    The rounding of float16/bfloat16 destinations goes through float32 (two roundings).
    A NaN ``p0`` (a poisoned block) gives the canonical NaN everywhere.
    """
    d = _view(dst, dst_dtype)
    d[...] = _dequantized(src_q, p0, p1, dst_dtype, q_dtype, algo, d.size)


def dequantize_accumulate(dst: Buffer, src_q: Buffer, p0: float, p1: float, op: int,
                          dst_dtype: int, q_dtype: int, algo: int) -> None:
    """``dst[i] = op(dst[i], D(q[i]))``, D as in :func:`dequantize` (cast to dst's dtype).

    Defined as ``reduce_into(dst, dequantize(...))``; the Cython kernel fuses the two.
    """
    tmp = _dequantized(src_q, p0, p1, dst_dtype, q_dtype, algo, _view(dst, dst_dtype).size)
    reduce_into(dst, tmp, op, dst_dtype)
