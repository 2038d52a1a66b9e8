# Part of _kernels.pyx (textually included): the min/max scan, quantize and dequantize
# loops behind the Python entry points. Split off to keep the module readable.

# ---- minmax and quantize --------------------------------------------------------------

cdef inline void _mm_update(float* mn, float* mx, int* bad, float v) noexcept nogil:
    if v - v == 0:  # finite (inf - inf and NaN - NaN are NaN)
        mn[0] = v if v < mn[0] else mn[0]
        mx[0] = v if v > mx[0] else mx[0]
    else:
        bad[0] = 1

cdef int _minmax(const unsigned char* p, Py_ssize_t n, int dtype, double* out) noexcept nogil:
    """out = (min, max) of the finite values, (0, 0) if none; +0.0 for a zero. Returns 1
    if a value is not finite, else 0. (The AVX2 loop keeps infinities in its min and max and
    flags NaN: one pass when every value is finite; else the finite ones are scanned again.)"""
    cdef Py_ssize_t i, i0 = 0
    cdef float fmn = INFINITY, fmx = -INFINITY
    cdef double v, mn = INFINITY, mx = -INFINITY
    cdef const double* x64
    cdef int bad = 0
    if dtype == F64:
        x64 = <const double*>p
        for i in range(n):
            v = x64[i]
            if v - v == 0:
                mn = v if v < mn else mn
                mx = v if v > mx else mx
            else:
                bad = 1
    else:
        i0 = pccl_simd_minmax(p, n, dtype, &fmn, &fmx, &bad)
        if fmn == -INFINITY or fmx == INFINITY:
            bad = 1
        if bad:  # the finite values again, without the AVX2 loop's infinities
            i0 = 0
            fmn = INFINITY
            fmx = -INFINITY
        if dtype == F32:
            for i in range(i0, n):
                _mm_update(&fmn, &fmx, &bad, (<const float*>p)[i])
        elif dtype == BF16:
            for i in range(i0, n):
                _mm_update(&fmn, &fmx, &bad, bf16_to_f32((<const uint16_t*>p)[i]))
        else:
            for i in range(i0, n):
                _mm_update(&fmn, &fmx, &bad, f16_to_f32((<const uint16_t*>p)[i]))
        mn = fmn
        mx = fmx
    if mn > mx:
        mn = 0.0
        mx = 0.0
    out[0] = mn + 0.0
    out[1] = mx + 0.0
    return bad

cdef inline double _code(double t, double lo, double hi) noexcept nogil:
    """rint(clamp(t, lo, hi)) with NaN -> lo; lo and hi are integers, |t| <= 2**51 after."""
    t = t if t > lo else lo
    t = t if t < hi else hi
    return (t + RINT_MAGIC) - RINT_MAGIC

cdef inline double _load(const unsigned char* p, Py_ssize_t i, int dtype) noexcept nogil:
    if dtype == F32:
        return (<const float*>p)[i]
    if dtype == F64:
        return (<const double*>p)[i]
    if dtype == BF16:
        return bf16_to_f32((<const uint16_t*>p)[i])
    return f16_to_f32((<const uint16_t*>p)[i])

cdef inline void _quantize_loop(code_t* q, const unsigned char* x, Py_ssize_t i0,
                                Py_ssize_t n, int dtype, double a, double inv, double lo,
                                double hi, double zp) noexcept nogil:
    """q = code((x - a) * inv, lo, hi) + zp (MIN_MAX: a = lo, zp = 0; ZPS: a = 0, and
    x - 0.0 == x bit for bit, so this is the reference's x * inv)."""
    cdef Py_ssize_t i
    for i in range(i0, n):
        q[i] = <code_t>(_code((_load(x, i, dtype) - a) * inv, lo, hi) + zp)

cdef void _quantize(code_t* q, const unsigned char* x, Py_ssize_t n, int dtype, double a,
                    double inv, double lo, double hi, double zp) noexcept nogil:
    cdef Py_ssize_t i0 = pccl_simd_quantize(q, 0 if code_t is uint8_t else 2, x, dtype, n,
                                            a, inv, lo, hi, zp)
    # one call per source dtype, so that _load's branch folds away after inlining
    if dtype == F32:
        _quantize_loop(q, x, i0, n, F32, a, inv, lo, hi, zp)
    elif dtype == F64:
        _quantize_loop(q, x, i0, n, F64, a, inv, lo, hi, zp)
    elif dtype == BF16:
        _quantize_loop(q, x, i0, n, BF16, a, inv, lo, hi, zp)
    else:
        _quantize_loop(q, x, i0, n, F16, a, inv, lo, hi, zp)


cdef void _quantize4(uint8_t* q, const unsigned char* x, Py_ssize_t n, int dtype, double a,
                     double inv, double lo, double hi, double zp) noexcept nogil:
    """4-bit codes packed two per byte (element 2i low nibble, 2i+1 high; an odd last
    element leaves the high nibble 0). The AVX2 loop packs whole groups of 16; the rest
    is coded by the 8-bit loops into a block on the stack, then packed while in L1."""
    cdef uint8_t tmp[BLOCK_BYTES]
    cdef Py_ssize_t size = ITEMSIZE[dtype], m, j, h
    cdef Py_ssize_t off = pccl_simd_quantize(q, Q4, x, dtype, n, a, inv, lo, hi, zp)
    while off < n:  # off stays even: 16 and BLOCK_BYTES are
        m = BLOCK_BYTES if n - off > BLOCK_BYTES else n - off
        _quantize(tmp, &x[off * size], m, dtype, a, inv, lo, hi, zp)
        h = m >> 1
        for j in range(h):
            q[(off >> 1) + j] = tmp[2 * j] | (tmp[2 * j + 1] << 4)
        if m & 1:
            q[(off >> 1) + h] = tmp[m - 1]
        off += m


cdef bint _finite_in(double v, int dtype) noexcept nogil:
    """Is v, rounded as dequantize rounds into dtype (through float32), finite?"""
    cdef float f
    if dtype == F64:
        return v - v == 0
    f = <float>v
    if dtype == F32:
        return f - f == 0
    if dtype == BF16:
        return (f32_to_bf16(f) & 0x7FFF) < 0x7F80
    return (f32_to_f16(f) & 0x7FFF) < 0x7C00


# ---- dequantize -----------------------------------------------------------------------

cdef inline double _dq(double q, int algo, double p0, double p1, double step,
                       double qmax) noexcept nogil:
    """D(q) in float64: MIN_MAX p0 + q * step; ZPS ((q - zp) * span) / qmax."""
    if algo == MIN_MAX:
        return p0 + q * step
    return ((q - p1) * p0) / qmax

cdef struct Dequant:
    int dtype
    int q_dtype
    int algo
    int poisoned  # p0 is NaN: every value is the canonical NaN
    double p0
    double p1
    double step
    double qmax
    double tab64[256]  # for 8- and 4-bit codes: D(q) in float64, float32 and 16 bits
    float tab32[256]
    uint16_t tab16[256]

cdef void _dq_init(Dequant* t, int dtype, int q_dtype, int algo, double p0,
                   double p1) noexcept nogil:
    cdef int i
    t.dtype = dtype
    t.q_dtype = q_dtype
    t.algo = algo
    t.p0 = p0
    t.p1 = p1
    t.qmax = 255.0 if q_dtype == 0 else 15.0 if q_dtype == Q4 else 65535.0
    t.step = (p1 - p0) / t.qmax
    t.poisoned = p0 != p0
    if (q_dtype == 0 or q_dtype == Q4) and not t.poisoned:
        for i in range(256 if q_dtype == 0 else 16):
            t.tab64[i] = _dq(i, algo, p0, p1, t.step, t.qmax)
            t.tab32[i] = <float>t.tab64[i]
            t.tab16[i] = f32_to_bf16(t.tab32[i]) if dtype == BF16 else f32_to_f16(t.tab32[i])

cdef inline void _dq_direct(const Dequant* t, real* d, const uint16_t* q,
                            Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        d[i] = <real>_dq(q[i], t.algo, t.p0, t.p1, t.step, t.qmax)

cdef void _dq_run4(const Dequant* t, unsigned char* d, const uint8_t* q,
                   Py_ssize_t n) noexcept nogil:
    """d[0:n] = D(q) for 4-bit codes (two per byte), looked up in the tables."""
    cdef Py_ssize_t j, h = n >> 1
    cdef uint8_t c
    cdef double* d64 = <double*>d
    cdef float* d32 = <float*>d
    cdef uint16_t* d16 = <uint16_t*>d
    if t.dtype == F64:
        for j in range(h):
            c = q[j]
            d64[2 * j] = t.tab64[c & 15]
            d64[2 * j + 1] = t.tab64[c >> 4]
        if n & 1:
            d64[n - 1] = t.tab64[q[h] & 15]
    elif t.dtype == F32:
        for j in range(h):
            c = q[j]
            d32[2 * j] = t.tab32[c & 15]
            d32[2 * j + 1] = t.tab32[c >> 4]
        if n & 1:
            d32[n - 1] = t.tab32[q[h] & 15]
    else:
        for j in range(h):
            c = q[j]
            d16[2 * j] = t.tab16[c & 15]
            d16[2 * j + 1] = t.tab16[c >> 4]
        if n & 1:
            d16[n - 1] = t.tab16[q[h] & 15]

cdef void _nan_fill(unsigned char* d, Py_ssize_t n, int dtype) noexcept nogil:
    """d[0:n] = the canonical quiet NaN of dtype (a float one)."""
    cdef Py_ssize_t i
    if dtype == F64:
        for i in range(n):
            (<uint64_t*>d)[i] = 0x7FF8000000000000
    elif dtype == F32:
        for i in range(n):
            (<uint32_t*>d)[i] = 0x7FC00000
    else:
        for i in range(n):
            (<uint16_t*>d)[i] = 0x7FC0 if dtype == BF16 else 0x7E00

cdef void _dq_run(const Dequant* t, unsigned char* d, const unsigned char* qp,
                  Py_ssize_t n) noexcept nogil:
    """d[0:n] = D(q) cast to t.dtype; 8- and 4-bit codes are looked up in the tables; a
    poisoned block: the canonical NaN."""
    cdef Py_ssize_t i
    cdef const uint8_t* q8 = <const uint8_t*>qp
    cdef const uint16_t* q16 = <const uint16_t*>qp
    cdef uint16_t* h = <uint16_t*>d
    cdef Py_ssize_t i0 = 0
    if t.poisoned:
        _nan_fill(d, n, t.dtype)
        return
    if t.q_dtype == Q4:  # the AVX2 loop does whole words of 8 codes (i0 is even)
        if t.dtype == F32:
            i0 = pccl_simd_dequant_f32(<float*>d, qp, Q4, n, t.algo, t.p0, t.p1, t.step,
                                       t.qmax, False)
        _dq_run4(t, d + i0 * 4, <const uint8_t*>qp + (i0 >> 1), n - i0)
        return
    if t.dtype == F32:
        i0 = pccl_simd_dequant_f32(<float*>d, qp, t.q_dtype, n, t.algo, t.p0, t.p1, t.step,
                                   t.qmax, False)
    if t.q_dtype == 0:
        if t.dtype == F64:
            for i in range(n):
                (<double*>d)[i] = t.tab64[q8[i]]
        elif t.dtype == F32:
            for i in range(i0, n):
                (<float*>d)[i] = t.tab32[q8[i]]
        else:
            for i in range(n):
                h[i] = t.tab16[q8[i]]
    elif t.dtype == F64:
        _dq_direct(t, <double*>d, q16, n)
    elif t.dtype == F32:
        _dq_direct(t, <float*>d + i0, q16 + i0, n - i0)
    elif t.dtype == BF16:
        for i in range(n):
            h[i] = f32_to_bf16(<float>_dq(q16[i], t.algo, t.p0, t.p1, t.step, t.qmax))
    else:
        for i in range(n):
            h[i] = f32_to_f16(<float>_dq(q16[i], t.algo, t.p0, t.p1, t.step, t.qmax))
