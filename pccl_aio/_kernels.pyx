# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Cython kernels, byte-identical to the numpy reference ``_compute/reference.py`` (the specification).

Seams, in file order: the AVX2+F16C loops of the hot paths (C, chosen at run time, in
``_kernels_simd.h``); 16-bit float conversions; reduce loops (integers, f32/f64,
f16/bf16) and divide (``_kernels_reduce.pxi``); minmax, quantize and dequantize
(``_kernels_quant.pxi``); sparse compression (``_kernels_sparse.pxi``, its own entry points,
specified by ``_compute/sparse_reference.py``); the Python entry points.
The portable Cython loops do everything the AVX2 loops do not (tails, other dtypes and
ops, CPUs without AVX2, non-x86 builds). Arguments are validated by ``_compute/ops.py``; the entry
points only keep wrong direct calls in bounds. The loops run without the GIL and never
allocate (``dequantize_accumulate`` goes through a 16 KiB stack block when it is not
fused). All arithmetic is IEEE in the reference's order: setup.py disables FMA
contraction and no FMA target is enabled.
"""

from libc.math cimport INFINITY, NAN
from libc.stdint cimport (int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t,
                          uint64_t)
from libc.string cimport memcpy, memmove, memset

cdef extern from "_kernels_simd.h" nogil:
    int pccl_simd
    int pccl_simd_max()
    Py_ssize_t pccl_simd_f32(float* d, const float* x, const float* s, Py_ssize_t n,
                             int prod)
    Py_ssize_t pccl_simd_bf16(uint16_t* d, const uint16_t* s, Py_ssize_t n, int prod)
    Py_ssize_t pccl_simd_f16(uint16_t* d, const uint16_t* s, Py_ssize_t n, int prod)
    Py_ssize_t pccl_simd_stream_copy(void* d, const void* s, Py_ssize_t n)
    Py_ssize_t pccl_simd_minmax(const void* p, Py_ssize_t n, int dtype, float* mn, float* mx,
                                int* bad)
    Py_ssize_t pccl_simd_quantize(void* q, int q_dtype, const void* x, int dtype, Py_ssize_t n,
                                  double a, double inv, double lo, double hi, double zp)
    Py_ssize_t pccl_simd_dequant_f32(float* d, const void* q, int q_dtype, Py_ssize_t n,
                                     int algo, double p0, double p1, double step, double qmax,
                                     int acc)

cdef enum:
    SUM = 0
    AVG = 1
    PROD = 2
    MAX = 3
    MIN = 4
    MIN_MAX = 1
    ZERO_POINT_SCALE = 2
    F16 = 8
    BF16 = 9
    F32 = 10
    F64 = 11
    Q4 = 12  # uint4 codes, two per byte (element 2i in the low nibble)
    BLOCK_BYTES = 16384
    SAVE_BLOCK_BYTES = 65536
    BLOCK_DOUBLES = 2048  # BLOCK_BYTES // 8

cdef double QUANT_LIMIT = 2.0 ** 1000
cdef double QUANT_MIN_SPAN = 2.0 ** -1000  # narrower ranges quantize to a constant
# (t + 1.5 * 2**52) - 1.5 * 2**52 == rint(t) (round half to even) for |t| <= 2**51.
cdef double RINT_MAGIC = 6755399441055744.0
cdef int ITEMSIZE[12]


def _load_table():
    """Fill ITEMSIZE from the dtype table of ``_types`` and check the C constants against
    its enums (they are compile-time constants here)."""
    from pccl_aio._types import DTYPE_ITEMSIZE, DataType, QuantAlgo, ReduceOp

    for dt, size in DTYPE_ITEMSIZE.items():
        ITEMSIZE[dt] = size
    mine = (SUM, AVG, PROD, MAX, MIN, MIN_MAX, ZERO_POINT_SCALE, F16, BF16, F32, F64, Q4)
    theirs = (*ReduceOp, QuantAlgo.MIN_MAX, QuantAlgo.ZERO_POINT_SCALE, DataType.FLOAT16,
              DataType.BFLOAT16, DataType.FLOAT32, DataType.FLOAT64, DataType.UINT4)
    if len(DTYPE_ITEMSIZE) != 12 or mine != tuple(int(v) for v in theirs):
        raise ImportError("pccl_aio._kernels disagrees with pccl_aio._types; rebuild")


_load_table()

ctypedef fused uint_t:
    uint8_t
    uint16_t
    uint32_t
    uint64_t

ctypedef fused int_t:
    uint8_t
    int8_t
    uint16_t
    int16_t
    uint32_t
    int32_t
    uint64_t
    int64_t

ctypedef fused real:
    float
    double

ctypedef fused code_t:
    uint8_t
    uint16_t


include "_kernels_half.pxi"
include "_kernels_reduce.pxi"
include "_kernels_quant.pxi"
include "_kernels_sparse.pxi"


# ---- Python entry points (see reference.py for the contract) --------------------------
# ops validates arguments with proper messages; the O(1) checks here only keep a wrong
# direct call from reading or writing out of bounds (bounds checking is off).

cdef Py_ssize_t _count(Py_ssize_t nbytes, int dtype, bint floats) except -1:
    if not (F16 if floats else 0) <= dtype <= F64:
        raise ValueError(f"bad dtype {dtype}")
    return nbytes // ITEMSIZE[dtype]

cdef int _check_codes(Py_ssize_t n, Py_ssize_t qbytes, int q_dtype) except -1:
    if q_dtype == Q4:
        if qbytes < (n + 1) // 2:
            raise ValueError("bad quantized buffer")
        return 0
    if q_dtype != 0 and q_dtype != 2 or qbytes < n * (1 + (q_dtype == 2)):
        raise ValueError("bad quantized buffer")
    return 0


def reduce_into(unsigned char[::1] dst, const unsigned char[::1] src, int op, int dtype):
    cdef Py_ssize_t n = _count(dst.shape[0], dtype, False)
    if src.shape[0] < dst.shape[0]:
        raise ValueError("src is shorter than dst")
    if n == 0:
        return
    with nogil:
        _reduce(&dst[0], &src[0], n, op, dtype)


cdef void _reduce_from(unsigned char* d, const unsigned char* x, const unsigned char* y,
                       Py_ssize_t n, int op, int dtype) noexcept nogil:
    cdef Py_ssize_t size = ITEMSIZE[dtype], step = BLOCK_BYTES // size, off = 0, m
    cdef const unsigned char* bsrc
    cdef unsigned char tmp[BLOCK_BYTES]
    if dtype == F32 and (op == SUM or op == AVG or op == PROD):  # one pass, 3 operands
        off = pccl_simd_f32(<float*>d, <const float*>x, <const float*>y, n, op == PROD)
    while off < n:  # the rest through 16 KiB blocks: dst = a, then reduce while in L1
        m = step if n - off > step else n - off
        bsrc = &y[off * size]
        if d == y:  # dst is b: keep b's block aside first
            memcpy(tmp, bsrc, m * size)
            bsrc = tmp
        if d != x:
            memcpy(&d[off * size], &x[off * size], m * size)
        _reduce(&d[off * size], bsrc, m, op, dtype)
        off += m


cdef inline void _stream_copy(unsigned char* d, const unsigned char* s,
                              Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t done = pccl_simd_stream_copy(d, s, n)
    memcpy(&d[done], &s[done], n - done)


def reduce_from(unsigned char[::1] dst, const unsigned char[::1] a,
                const unsigned char[::1] b, int op, int dtype, unsigned char[::1] save=None):
    cdef Py_ssize_t n = _count(dst.shape[0], dtype, False)
    cdef Py_ssize_t size, step, off, m
    cdef unsigned char* d
    cdef unsigned char* sv
    cdef const unsigned char* x
    cdef const unsigned char* y
    if a.shape[0] < dst.shape[0] or b.shape[0] < dst.shape[0]:
        raise ValueError("an operand is shorter than dst")
    if save is not None and save.shape[0] < dst.shape[0]:
        raise ValueError("save is shorter than dst")
    if n == 0:
        return
    d = &dst[0]
    x = &a[0]
    y = &b[0]
    with nogil:
        if save is None:
            _reduce_from(d, x, y, n, op, dtype)
        else:  # per 64 KiB block: a streamed into save, then reduced while still in cache
            sv = &save[0]
            size = ITEMSIZE[dtype]
            step = SAVE_BLOCK_BYTES // size
            off = 0
            while off < n:
                m = step if n - off > step else n - off
                _stream_copy(&sv[off * size], &x[off * size], m * size)
                _reduce_from(&d[off * size], &x[off * size], &y[off * size], m, op, dtype)
                off += m


cdef Py_ssize_t _copy_len(unsigned char[::1] dst, const unsigned char[::1] src) except -1:
    """Bytes a copy moves (``len(dst)``); ValueError if ``src`` is shorter."""
    if src.shape[0] < dst.shape[0]:
        raise ValueError("src is shorter than dst")
    return dst.shape[0]


def copy(unsigned char[::1] dst, const unsigned char[::1] src):
    """``dst[:] = src[:len(dst)]``, a memmove without the GIL."""
    cdef Py_ssize_t n = _copy_len(dst, src)
    if n:
        with nogil:
            memmove(&dst[0], &src[0], n)


def stream_copy(unsigned char[::1] dst, const unsigned char[::1] src):
    """``dst[:] = src[:len(dst)]`` with streaming stores (the backup: not read back soon)."""
    cdef Py_ssize_t n = _copy_len(dst, src)
    if n:
        with nogil:
            _stream_copy(&dst[0], &src[0], n)


def divide(unsigned char[::1] dst, int64_t divisor, int dtype):
    cdef Py_ssize_t n = _count(dst.shape[0], dtype, False)
    cdef unsigned char* d
    if divisor < 1:
        raise ValueError("divisor must be >= 1")
    if n == 0:
        return
    d = &dst[0]
    with nogil:
        if dtype == 0: _int_divide(<uint8_t*>d, n, divisor)
        elif dtype == 1: _int_divide(<int8_t*>d, n, divisor)
        elif dtype == 2: _int_divide(<uint16_t*>d, n, divisor)
        elif dtype == 3: _int_divide(<int16_t*>d, n, divisor)
        elif dtype == 4: _int_divide(<uint32_t*>d, n, divisor)
        elif dtype == 5: _int_divide(<int32_t*>d, n, divisor)
        elif dtype == 6: _int_divide(<uint64_t*>d, n, divisor)
        elif dtype == 7: _int_divide(<int64_t*>d, n, divisor)
        elif dtype == F16: _half_divide(<uint16_t*>d, n, <float>divisor, False)
        elif dtype == BF16: _half_divide(<uint16_t*>d, n, <float>divisor, True)
        elif dtype == F32: _real_divide(<float*>d, n, <float>divisor)
        else: _real_divide(<double*>d, n, <double>divisor)


def minmax(const unsigned char[::1] src, int dtype):
    cdef double out[2]
    cdef Py_ssize_t n = _count(src.shape[0], dtype, True)
    out[0] = out[1] = 0.0
    if n:
        with nogil:
            _minmax(&src[0], n, dtype, out)
    return out[0], out[1]


def quantize(unsigned char[::1] dst_q, const unsigned char[::1] src, int src_dtype,
             int q_dtype, int algo):
    cdef Py_ssize_t n = _count(src.shape[0], src_dtype, True)
    cdef double mm[2]
    cdef double qmax = 255.0 if q_dtype == 0 else 15.0 if q_dtype == Q4 else 65535.0
    cdef double lo, hi, a, inv = 0.0, zp = 0.0, first = 0.0, last = qmax
    cdef bint poisoned
    _check_codes(n, dst_q.shape[0], q_dtype)
    if n == 0:
        return 0.0, 0.0
    with nogil:
        # a NaN, an infinity or a value beyond QUANT_LIMIT poisons the block (reference.py)
        poisoned = (_minmax(&src[0], n, src_dtype, mm) or mm[0] < -QUANT_LIMIT
                    or mm[1] > QUANT_LIMIT)
        if poisoned:
            memset(&dst_q[0], 0, (n + 1) // 2 if q_dtype == Q4 else n * (1 + (q_dtype == 2)))
        else:
            if algo == MIN_MAX:  # (x - lo) * inv
                lo = mm[0]
                hi = mm[1]
                a = lo
            else:  # x * inv, zero point zp
                lo = min(mm[0], 0.0)
                hi = max(mm[1], 0.0)
                a = 0.0
            if hi - lo >= QUANT_MIN_SPAN:  # else inv == 0 and every code is 0, as in numpy
                inv = qmax / (hi - lo)
                if algo != MIN_MAX:
                    zp = ((-lo * inv + RINT_MAGIC) - RINT_MAGIC) + 0.0
                # the end codes, unless one would decode to an infinity
                if algo == MIN_MAX:
                    first = 0.0 if _finite_in(_dq(0.0, algo, lo, hi, (hi - lo) / qmax, qmax),
                                              src_dtype) else 1.0
                    last = qmax if _finite_in(_dq(qmax, algo, lo, hi, (hi - lo) / qmax, qmax),
                                              src_dtype) else qmax - 1.0
                else:
                    first = 0.0 if _finite_in(_dq(0.0, algo, hi - lo, zp, 0.0, qmax),
                                              src_dtype) else 1.0
                    last = qmax if _finite_in(_dq(qmax, algo, hi - lo, zp, 0.0, qmax),
                                              src_dtype) else qmax - 1.0
            if q_dtype == 0:
                _quantize(<uint8_t*>&dst_q[0], &src[0], n, src_dtype, a, inv, first - zp,
                          last - zp, zp)
            elif q_dtype == Q4:
                _quantize4(<uint8_t*>&dst_q[0], &src[0], n, src_dtype, a, inv, first - zp,
                           last - zp, zp)
            else:
                _quantize(<uint16_t*>&dst_q[0], &src[0], n, src_dtype, a, inv, first - zp,
                          last - zp, zp)
    if poisoned:
        return NAN, NAN
    if algo == MIN_MAX:
        return lo, hi
    return hi - lo, zp


def dequantize(unsigned char[::1] dst, const unsigned char[::1] src_q, double p0, double p1,
               int dst_dtype, int q_dtype, int algo):
    cdef Py_ssize_t n = _count(dst.shape[0], dst_dtype, True)
    _check_codes(n, src_q.shape[0], q_dtype)
    if n == 0:
        return
    cdef Dequant t
    with nogil:
        _dq_init(&t, dst_dtype, q_dtype, algo, p0, p1)
        _dq_run(&t, &dst[0], &src_q[0], n)


def dequantize_accumulate(unsigned char[::1] dst, const unsigned char[::1] src_q, double p0,
                          double p1, int op, int dst_dtype, int q_dtype, int algo):
    cdef Py_ssize_t n = _count(dst.shape[0], dst_dtype, True)
    cdef Py_ssize_t size = ITEMSIZE[dst_dtype]
    cdef Py_ssize_t qsize = 1 if q_dtype == 0 else 2  # Q4: start >> 1 (starts are even)
    cdef Py_ssize_t block = BLOCK_BYTES // size
    cdef Py_ssize_t start, m
    cdef double buf[BLOCK_DOUBLES]  # 8-byte aligned scratch block on the stack
    cdef unsigned char* tmp = <unsigned char*>buf
    cdef Dequant t
    _check_codes(n, src_q.shape[0], q_dtype)
    if n == 0:
        return
    with nogil:
        _dq_init(&t, dst_dtype, q_dtype, algo, p0, p1)
        start = 0
        if dst_dtype == F32 and (op == SUM or op == AVG) and not t.poisoned:  # fused AVX2
            start = pccl_simd_dequant_f32(<float*>&dst[0], &src_q[0], q_dtype, n, algo, p0, p1,
                                          t.step, t.qmax, True)
        while start < n:
            m = min(block, n - start)
            _dq_run(&t, tmp, &src_q[start >> 1 if q_dtype == Q4 else start * qsize], m)
            _reduce(&dst[start * size], tmp, m, op, dst_dtype)
            start += m


pccl_simd = pccl_simd_max()


def _set_simd(int level):
    """Select the loops: 0 portable Cython loops, 1 AVX2 where available (the default).

    For the tests, which compare both with the reference; returns the previous level.
    """
    global pccl_simd
    old = pccl_simd
    pccl_simd = max(0, min(level, pccl_simd_max()))
    return old


def _f32_to_f16(uint16_t[::1] dst, const float[::1] src):
    """The float32 -> float16 rounding used by the kernels (tests compare it with numpy)."""
    cdef Py_ssize_t i
    for i in range(min(src.shape[0], dst.shape[0])):
        dst[i] = f32_to_f16(src[i])


def _f16_to_f32(float[::1] dst, const uint16_t[::1] src):
    """The float16 -> float32 widening used by the kernels."""
    cdef Py_ssize_t i
    for i in range(min(src.shape[0], dst.shape[0])):
        dst[i] = f16_to_f32(src[i])
