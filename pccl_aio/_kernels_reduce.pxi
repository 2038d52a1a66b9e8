# Reduce and divide loops of _kernels.pyx (included there; it holds the cimports, enums,
# fused types and 16-bit conversions these use). Every loop runs without the GIL.

# ---- reduce ---------------------------------------------------------------------------

cdef void _wrap_sum(uint_t* d, const uint_t* s, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        d[i] = <uint_t>(d[i] + s[i])

cdef void _wrap_prod(uint_t* d, const uint_t* s, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        if uint_t is uint16_t:  # uint16 * uint16 would overflow a (signed) C int
            d[i] = <uint16_t>((<uint32_t>d[i]) * (<uint32_t>s[i]))
        else:
            d[i] = <uint_t>(d[i] * s[i])

cdef void _int_minmax(int_t* d, const int_t* s, Py_ssize_t n, int op) noexcept nogil:
    cdef Py_ssize_t i
    if op == MIN:
        for i in range(n):
            d[i] = s[i] if s[i] < d[i] else d[i]
    else:
        for i in range(n):
            d[i] = s[i] if s[i] > d[i] else d[i]

cdef void _int_reduce(unsigned char* d, const unsigned char* s, Py_ssize_t n, int op,
                      int dtype) noexcept nogil:
    if op == PROD:  # wrap-around, so signed and unsigned give the same bits
        if dtype <= 1:
            _wrap_prod(<uint8_t*>d, <const uint8_t*>s, n)
        elif dtype <= 3:
            _wrap_prod(<uint16_t*>d, <const uint16_t*>s, n)
        elif dtype <= 5:
            _wrap_prod(<uint32_t*>d, <const uint32_t*>s, n)
        else:
            _wrap_prod(<uint64_t*>d, <const uint64_t*>s, n)
    elif op == SUM or op == AVG:
        if dtype <= 1:
            _wrap_sum(<uint8_t*>d, <const uint8_t*>s, n)
        elif dtype <= 3:
            _wrap_sum(<uint16_t*>d, <const uint16_t*>s, n)
        elif dtype <= 5:
            _wrap_sum(<uint32_t*>d, <const uint32_t*>s, n)
        else:
            _wrap_sum(<uint64_t*>d, <const uint64_t*>s, n)
    elif dtype == 0:
        _int_minmax(<uint8_t*>d, <const uint8_t*>s, n, op)
    elif dtype == 1:
        _int_minmax(<int8_t*>d, <const int8_t*>s, n, op)
    elif dtype == 2:
        _int_minmax(<uint16_t*>d, <const uint16_t*>s, n, op)
    elif dtype == 3:
        _int_minmax(<int16_t*>d, <const int16_t*>s, n, op)
    elif dtype == 4:
        _int_minmax(<uint32_t*>d, <const uint32_t*>s, n, op)
    elif dtype == 5:
        _int_minmax(<int32_t*>d, <const int32_t*>s, n, op)
    elif dtype == 6:
        _int_minmax(<uint64_t*>d, <const uint64_t*>s, n, op)
    else:
        _int_minmax(<int64_t*>d, <const int64_t*>s, n, op)

cdef void _real_reduce(real* d, const real* s, Py_ssize_t n, int op) noexcept nogil:
    cdef Py_ssize_t i, i0 = 0
    cdef real a, b, r
    if real is float and op != MIN and op != MAX:
        i0 = pccl_simd_f32(d, d, s, n, op == PROD)
    if op == SUM or op == AVG:
        for i in range(i0, n):
            r = d[i] + s[i]
            d[i] = r if r == r else <real>NAN
    elif op == PROD:
        for i in range(i0, n):
            r = d[i] * s[i]
            d[i] = r if r == r else <real>NAN
    elif op == MIN:
        for i in range(n):
            a = d[i]
            b = s[i]
            d[i] = a if (a != a) | (a < b) else b
    else:
        for i in range(n):
            a = d[i]
            b = s[i]
            d[i] = a if (a != a) | (a > b) else b

cdef inline void _half_reduce(uint16_t* d, const uint16_t* s, Py_ssize_t n, int op,
                              bint bf) noexcept nogil:
    cdef Py_ssize_t i, i0 = 0
    cdef float a, b
    if op != MIN and op != MAX:
        i0 = pccl_simd_bf16(d, s, n, op == PROD) if bf else pccl_simd_f16(d, s, n, op == PROD)
    if op == SUM or op == AVG:
        for i in range(i0, n):
            d[i] = narrow(widen(d[i], bf) + widen(s[i], bf), bf)
    elif op == PROD:
        for i in range(i0, n):
            d[i] = narrow(widen(d[i], bf) * widen(s[i], bf), bf)
    elif op == MIN:
        for i in range(n):
            a = widen(d[i], bf)
            b = widen(s[i], bf)
            d[i] = d[i] if (a != a) | (a < b) else s[i]
    else:
        for i in range(n):
            a = widen(d[i], bf)
            b = widen(s[i], bf)
            d[i] = d[i] if (a != a) | (a > b) else s[i]

cdef void _reduce(unsigned char* d, const unsigned char* s, Py_ssize_t n, int op,
                  int dtype) noexcept nogil:
    """Dispatch ``reduce_into`` over n elements of dtype."""
    if dtype < F16:
        _int_reduce(d, s, n, op, dtype)
    elif dtype == F32:
        _real_reduce(<float*>d, <const float*>s, n, op)
    elif dtype == F64:
        _real_reduce(<double*>d, <const double*>s, n, op)
    elif dtype == BF16:
        _half_reduce(<uint16_t*>d, <const uint16_t*>s, n, op, True)
    else:
        _half_reduce(<uint16_t*>d, <const uint16_t*>s, n, op, False)


# ---- divide ---------------------------------------------------------------------------

cdef void _int_divide(int_t* d, Py_ssize_t n, int64_t divisor) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):  # C division truncates toward zero
        if int_t is uint64_t:
            d[i] = d[i] / <uint64_t>divisor
        else:
            d[i] = <int_t>((<int64_t>d[i]) / divisor)

cdef void _real_divide(real* d, Py_ssize_t n, real divisor) noexcept nogil:
    cdef Py_ssize_t i
    cdef real r
    for i in range(n):
        r = d[i] / divisor
        d[i] = r if r == r else <real>NAN

cdef inline void _half_divide(uint16_t* d, Py_ssize_t n, float divisor, bint bf) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        d[i] = narrow(widen(d[i], bf) / divisor, bf)
