# 16-bit floats (float16, bfloat16) <-> float32, bit-exact as numpy; included by _kernels.pyx.

# ---- 16-bit floats --------------------------------------------------------------------

cdef inline uint32_t f32_bits(float f) noexcept nogil:
    cdef uint32_t u
    memcpy(&u, &f, 4)
    return u

cdef inline float bits_f32(uint32_t u) noexcept nogil:
    cdef float f
    memcpy(&f, &u, 4)
    return f

cdef inline float f16_to_f32(uint16_t h) noexcept nogil:
    """Exact, as numpy's npy_halfbits_to_floatbits (a NaN keeps its payload bits)."""
    cdef uint32_t u = (<uint32_t>(h & 0x7FFF)) << 13
    cdef uint32_t e = u & 0x0F800000
    u += 0x38000000  # rebias the exponent: (127 - 15) << 23
    if e == 0x0F800000:  # inf / NaN: exponent all ones
        u += 0x38000000
    elif e == 0:  # zero / subnormal: renormalise through an exact float subtraction
        u = f32_bits(bits_f32(u + 0x00800000) - bits_f32(0x38800000))
    return bits_f32(u | ((<uint32_t>(h & 0x8000)) << 16))

cdef inline uint16_t f32_to_f16(float f) noexcept nogil:
    """Round to nearest-even, as numpy's npy_floatbits_to_halfbits (NaN payload included)."""
    cdef uint32_t x = f32_bits(f)
    cdef uint32_t sign = (x >> 16) & 0x8000
    cdef uint32_t o
    x &= 0x7FFFFFFF
    if x >= 0x47800000:  # |f| >= 65536, inf or NaN
        o = 0x7C00
        if x > 0x7F800000:  # NaN: top payload bits, but never inf
            o = 0x7C00 + ((x & 0x007FFFFF) >> 13)
            if o == 0x7C00:
                o = 0x7C01
    elif x < 0x38800000:  # below 2**-14: subnormal or zero, let the FPU round (ulp 2**-24)
        o = f32_bits(bits_f32(x) + <float>0.5) - 0x3F000000
    else:  # normal: rebias and round the 13 dropped bits half to even
        o = (x - 0x38000000 + 0x0FFF + ((x >> 13) & 1)) >> 13
    return <uint16_t>(o | sign)

cdef inline float bf16_to_f32(uint16_t h) noexcept nogil:
    return bits_f32((<uint32_t>h) << 16)

cdef inline uint16_t f32_to_bf16(float f) noexcept nogil:
    cdef uint32_t u = f32_bits(f)
    if f != f:
        return <uint16_t>((u >> 16) | 0x0040)
    return <uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16)

cdef inline float widen(uint16_t h, bint bf) noexcept nogil:
    return bf16_to_f32(h) if bf else f16_to_f32(h)

cdef inline uint16_t narrow(float f, bint bf) noexcept nogil:
    """float32 -> 16 bits; a NaN becomes the canonical NaN (SUM/PROD/divide semantics)."""
    if f != f:
        return 0x7FC0 if bf else 0x7E00
    return f32_to_bf16(f) if bf else f32_to_f16(f)
