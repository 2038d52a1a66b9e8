# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Cython kernels, byte-identical to the numpy reference ``_kernels_py`` (the specification).

Seams, in file order: the AVX2+F16C loops of the hot paths (C, chosen at run time; the
seam to split off into a header); 16-bit float conversions; reduce loops (integers,
f32/f64, f16/bf16); divide; minmax and quantize; dequantize; the Python entry points.
The portable Cython loops do everything the AVX2 loops do not (tails, other dtypes and
ops, CPUs without AVX2, non-x86 builds). Arguments are validated by ``_ops``; the entry
points only keep wrong direct calls in bounds. The loops run without the GIL and never
allocate (``dequantize_accumulate`` goes through a 16 KiB stack block when it is not
fused). All arithmetic is IEEE in the reference's order: setup.py disables FMA
contraction and no FMA target is enabled.
"""

from libc.math cimport INFINITY, NAN
from libc.stdint cimport (int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t,
                          uint64_t)
from libc.string cimport memcpy

cdef extern from * nogil:
    """
    /* AVX2 (+F16C) loops for the hot paths, chosen at run time (GCC/Clang on x86; else, and
       on CPUs without AVX2, the portable Cython loops below do all the work, vectorized by
       the compiler for the baseline ISA). Each returns how many leading elements it did;
       Cython finishes the tail. The arithmetic is the reference's, operation by operation
       and without FMA: max/min_pd(t, b) is exactly "t > b ? t : b" / "t < b ? t : b" (NaN
       -> b), cvtpd_epi32 rounds half to even like np.rint. NaN results of SUM/PROD are
       flagged per block of 1024 and canonicalised afterwards (cheaper than a blend). */
    #if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
    #include <immintrin.h>
    #include <cpuid.h>
    #define PCCL_AVX2 1
    #define PCCL_AVX static inline __attribute__((target("avx2,f16c"), always_inline))
    #define PCCL_AVX_FN static __attribute__((target("avx2,f16c"))) Py_ssize_t
    static int pccl_simd_max(void) {  /* AVX2 (with the OS's YMM support) and F16C */
        unsigned a, b, c = 0, d;
        __builtin_cpu_init();
        __get_cpuid(1, &a, &b, &c, &d);
        return __builtin_cpu_supports("avx2") && (c & (1u << 29)) ? 1 : 0;
    }
    #else
    #define PCCL_AVX2 0
    static int pccl_simd_max(void) { return 0; }
    #endif
    static int pccl_simd = 0;  /* 1: use the AVX2 loops; set at import, tests switch it */
    #if PCCL_AVX2
    #define PCCL_BLOCK 1024
    #define PCCL_FIX_NAN(cond, value)                                  \
        if (_mm256_movemask_epi8(_mm256_castps_si256(nan)))            \
            for (j = i; j < end; j++) if (cond) d[j] = value;
    PCCL_AVX __m256 pccl_op(__m256 a, __m256 b, int prod) {
        return prod ? _mm256_mul_ps(a, b) : _mm256_add_ps(a, b);
    }
    PCCL_AVX Py_ssize_t pccl_f32_loop(float *d, const float *s, Py_ssize_t n, int prod) {
        Py_ssize_t i = 0, j, end;
        for (; i + 16 <= n; i = end) {
            __m256 nan = _mm256_setzero_ps();
            end = i + PCCL_BLOCK <= n ? i + PCCL_BLOCK : n & ~(Py_ssize_t)15;
            for (j = i; j < end; j += 16) {
                __m256 a = pccl_op(_mm256_loadu_ps(d + j), _mm256_loadu_ps(s + j), prod);
                __m256 b = pccl_op(_mm256_loadu_ps(d + j + 8), _mm256_loadu_ps(s + j + 8), prod);
                nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));  /* a or b NaN */
                _mm256_storeu_ps(d + j, a);
                _mm256_storeu_ps(d + j + 8, b);
            }
            PCCL_FIX_NAN(d[j] != d[j], __builtin_nanf(""))
        }
        return i;
    }
    PCCL_AVX_FN pccl_avx2_f32(float *d, const float *s, Py_ssize_t n, int prod) {
        return prod ? pccl_f32_loop(d, s, n, 1) : pccl_f32_loop(d, s, n, 0);
    }
    /* bfloat16 in pairs: even elements are the low halves of 32-bit lanes, odd the high
       ones. A NaN result of two widened bfloat16 has zero low 16 bits (its payload comes
       from an operand, or it is the default NaN), so rounding keeps it a NaN. */
    PCCL_AVX __m256i pccl_bf16_round(__m256 r) {  /* RNE into the top 16 bits */
        __m256i u = _mm256_castps_si256(r);
        __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        return _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
    }
    PCCL_AVX Py_ssize_t pccl_bf16_loop(uint16_t *d, const uint16_t *s, Py_ssize_t n,
                                       int prod) {
        Py_ssize_t i = 0, j, end;
        const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
        const __m256i abs = _mm256_set1_epi16(0x7fff), inf = _mm256_set1_epi16(0x7f80);
        for (; i + 16 <= n; i = end) {
            __m256 nan = _mm256_setzero_ps();
            end = i + PCCL_BLOCK <= n ? i + PCCL_BLOCK : n & ~(Py_ssize_t)15;
            for (j = i; j < end; j += 16) {
                __m256i a = _mm256_loadu_si256((const __m256i *)(d + j));
                __m256i b = _mm256_loadu_si256((const __m256i *)(s + j));
                __m256 even = pccl_op(_mm256_castsi256_ps(_mm256_slli_epi32(a, 16)),
                                      _mm256_castsi256_ps(_mm256_slli_epi32(b, 16)), prod);
                __m256 odd = pccl_op(_mm256_castsi256_ps(_mm256_and_si256(a, hi)),
                                     _mm256_castsi256_ps(_mm256_and_si256(b, hi)), prod);
                __m256i r = _mm256_or_si256(_mm256_srli_epi32(pccl_bf16_round(even), 16),
                                            _mm256_and_si256(pccl_bf16_round(odd), hi));
                nan = _mm256_or_ps(nan, _mm256_castsi256_ps(
                    _mm256_cmpgt_epi16(_mm256_and_si256(r, abs), inf)));
                _mm256_storeu_si256((__m256i *)(d + j), r);
            }
            PCCL_FIX_NAN((d[j] & 0x7fff) > 0x7f80, 0x7fc0)
        }
        return i;
    }
    PCCL_AVX_FN pccl_avx2_bf16(uint16_t *d, const uint16_t *s, Py_ssize_t n, int prod) {
        return prod ? pccl_bf16_loop(d, s, n, 1) : pccl_bf16_loop(d, s, n, 0);
    }
    /* float16 through F16C: the conversions are exact / round half to even like numpy's
       (a NaN result converts to some NaN and is canonicalised to 0x7e00 afterwards) */
    PCCL_AVX Py_ssize_t pccl_f16_loop(uint16_t *d, const uint16_t *s, Py_ssize_t n,
                                      int prod) {
        Py_ssize_t i = 0, j, end;
        const __m128i abs = _mm_set1_epi16(0x7fff), inf = _mm_set1_epi16(0x7c00);
        for (; i + 8 <= n; i = end) {
            __m128i nan = _mm_setzero_si128();
            end = i + PCCL_BLOCK <= n ? i + PCCL_BLOCK : n & ~(Py_ssize_t)7;
            for (j = i; j < end; j += 8) {
                __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + j)));
                __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + j)));
                __m128i r = _mm256_cvtps_ph(pccl_op(a, b, prod), _MM_FROUND_TO_NEAREST_INT);
                nan = _mm_or_si128(nan, _mm_cmpgt_epi16(_mm_and_si128(r, abs), inf));
                _mm_storeu_si128((__m128i *)(d + j), r);
            }
            if (_mm_movemask_epi8(nan))
                for (j = i; j < end; j++)
                    if ((d[j] & 0x7fff) > 0x7c00) d[j] = 0x7e00;
        }
        return i;
    }
    PCCL_AVX_FN pccl_avx2_f16(uint16_t *d, const uint16_t *s, Py_ssize_t n, int prod) {
        return prod ? pccl_f16_loop(d, s, n, 1) : pccl_f16_loop(d, s, n, 0);
    }
    /* min/max of the finite values: v + v * 0 is NaN for +-inf and NaN, and min/max_ps
       return their second operand (the accumulator) when the first is NaN */
    PCCL_AVX void pccl_mm8(__m256 v, __m256 *mn, __m256 *mx) {
        v = _mm256_add_ps(v, _mm256_mul_ps(v, _mm256_setzero_ps()));
        *mn = _mm256_min_ps(v, *mn);
        *mx = _mm256_max_ps(v, *mx);
    }
    PCCL_AVX Py_ssize_t pccl_mm_loop(const void *p, Py_ssize_t n, int dtype, float *mn,
                                     float *mx) {  /* dtype 8 float16, 9 bfloat16, 10 float32 */
        Py_ssize_t i = 0;
        float lo[8], hi[8];
        __m256 vmn = _mm256_set1_ps(*mn), vmx = _mm256_set1_ps(*mx);
        const __m256i himask = _mm256_set1_epi32((int)0xffff0000u);
        for (; i + 16 <= n; i += 16) {
            if (dtype == 8) {
                const __m128i *h = (const __m128i *)((const uint16_t *)p + i);
                pccl_mm8(_mm256_cvtph_ps(_mm_loadu_si128(h)), &vmn, &vmx);
                pccl_mm8(_mm256_cvtph_ps(_mm_loadu_si128(h + 1)), &vmn, &vmx);
            } else if (dtype == 9) {
                __m256i v = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
                pccl_mm8(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), &vmn, &vmx);
                pccl_mm8(_mm256_castsi256_ps(_mm256_and_si256(v, himask)), &vmn, &vmx);
            } else {
                pccl_mm8(_mm256_loadu_ps((const float *)p + i), &vmn, &vmx);
                pccl_mm8(_mm256_loadu_ps((const float *)p + i + 8), &vmn, &vmx);
            }
        }
        _mm256_storeu_ps(lo, vmn);
        _mm256_storeu_ps(hi, vmx);
        for (int k = 0; k < 8; k++) {
            *mn = lo[k] < *mn ? lo[k] : *mn;
            *mx = hi[k] > *mx ? hi[k] : *mx;
        }
        return i;
    }
    PCCL_AVX_FN pccl_avx2_minmax(const void *p, Py_ssize_t n, int dtype, float *mn,
                                 float *mx) {
        return dtype == 8 ? pccl_mm_loop(p, n, 8, mn, mx)
            : dtype == 9 ? pccl_mm_loop(p, n, 9, mn, mx) : pccl_mm_loop(p, n, 10, mn, mx);
    }
    /* quantize: codes = rint(clamp((x - a) * inv, lo, hi)) + zp for dtype 8 float16,
       9 bfloat16, 10 float32 or 11 float64; q_dtype 0 uint8, 2 uint16 */
    PCCL_AVX __m128i pccl_codes(const void *x, Py_ssize_t i, int dtype, __m256d a,
                                __m256d inv, __m256d lo, __m256d hi, __m128i zp) {
        __m256d t;
        if (dtype == 11) {
            t = _mm256_loadu_pd((const double *)x + i);
        } else if (dtype == 10) {
            t = _mm256_cvtps_pd(_mm_loadu_ps((const float *)x + i));
        } else if (dtype == 8) {
            __m128i h = _mm_loadl_epi64((const __m128i *)((const uint16_t *)x + i));
            t = _mm256_cvtps_pd(_mm_cvtph_ps(h));
        } else {
            __m128i h = _mm_loadl_epi64((const __m128i *)((const uint16_t *)x + i));
            t = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h)));
        }
        t = _mm256_min_pd(_mm256_max_pd(_mm256_mul_pd(_mm256_sub_pd(t, a), inv), lo), hi);
        return _mm_add_epi32(_mm256_cvtpd_epi32(t), zp);
    }
    PCCL_AVX Py_ssize_t pccl_q_loop(void *q, int q_dtype, const void *x, int dtype,
                                    Py_ssize_t n, double a, double inv, double lo, double hi,
                                    double zp) {
        Py_ssize_t i = 0;
        const __m256d va = _mm256_set1_pd(a), vi = _mm256_set1_pd(inv);
        const __m256d vl = _mm256_set1_pd(lo), vh = _mm256_set1_pd(hi);
        const __m128i z = _mm_set1_epi32((int)zp);
        for (; i + 16 <= n; i += 16) {
            __m128i c0 = pccl_codes(x, i, dtype, va, vi, vl, vh, z);
            __m128i c1 = pccl_codes(x, i + 4, dtype, va, vi, vl, vh, z);
            __m128i c2 = pccl_codes(x, i + 8, dtype, va, vi, vl, vh, z);
            __m128i c3 = pccl_codes(x, i + 12, dtype, va, vi, vl, vh, z);
            if (q_dtype == 0) {
                _mm_storeu_si128((__m128i *)((uint8_t *)q + i), _mm_packus_epi16(
                    _mm_packs_epi32(c0, c1), _mm_packs_epi32(c2, c3)));
            } else {
                _mm_storeu_si128((__m128i *)((uint16_t *)q + i), _mm_packus_epi32(c0, c1));
                _mm_storeu_si128((__m128i *)((uint16_t *)q + i + 8), _mm_packus_epi32(c2, c3));
            }
        }
        return i;
    }
    PCCL_AVX_FN pccl_avx2_quantize(void *q, int q_dtype, const void *x, int dtype,
                                   Py_ssize_t n, double a, double inv, double lo, double hi,
                                   double zp) {
        #define PCCL_Q(qd, dt) pccl_q_loop(q, qd, x, dt, n, a, inv, lo, hi, zp)
        if (q_dtype == 0)
            return dtype == 10 ? PCCL_Q(0, 10) : dtype == 9 ? PCCL_Q(0, 9)
                : dtype == 8 ? PCCL_Q(0, 8) : PCCL_Q(0, 11);
        return dtype == 10 ? PCCL_Q(2, 10) : dtype == 9 ? PCCL_Q(2, 9)
            : dtype == 8 ? PCCL_Q(2, 8) : PCCL_Q(2, 11);
        #undef PCCL_Q
    }
    /* float32 destination: d = D(q), or d = d + D(q) (acc); D(q) in float64 as the
       reference: algo 1 p0 + q * step, algo 2 ((q - p1) * p0) / qmax */
    PCCL_AVX __m256 pccl_dq(__m256i q, int algo, __m256d p0, __m256d p1, __m256d step,
                            __m256d qmax) {
        __m256d q0 = _mm256_cvtepi32_pd(_mm256_castsi256_si128(q));
        __m256d q1 = _mm256_cvtepi32_pd(_mm256_extracti128_si256(q, 1));
        if (algo == 1) {
            q0 = _mm256_add_pd(p0, _mm256_mul_pd(q0, step));
            q1 = _mm256_add_pd(p0, _mm256_mul_pd(q1, step));
        } else {
            q0 = _mm256_div_pd(_mm256_mul_pd(_mm256_sub_pd(q0, p1), p0), qmax);
            q1 = _mm256_div_pd(_mm256_mul_pd(_mm256_sub_pd(q1, p1), p0), qmax);
        }
        return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm256_cvtpd_ps(q0)),
                                    _mm256_cvtpd_ps(q1), 1);
    }
    PCCL_AVX Py_ssize_t pccl_dq_loop(float *d, const void *q, int q_dtype, Py_ssize_t n,
                                     int algo, double p0, double p1, double step,
                                     double qmax, int acc) {
        Py_ssize_t i = 0, j, end;
        const __m256d v0 = _mm256_set1_pd(p0), v1 = _mm256_set1_pd(p1);
        const __m256d vs = _mm256_set1_pd(step), vq = _mm256_set1_pd(qmax);
        for (; i + 8 <= n; i = end) {
            __m256 nan = _mm256_setzero_ps();
            end = i + PCCL_BLOCK <= n ? i + PCCL_BLOCK : n & ~(Py_ssize_t)7;
            for (j = i; j < end; j += 8) {
                __m256i c = q_dtype == 0
                    ? _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)((const uint8_t *)q + j)))
                    : _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)q + j)));
                __m256 y = pccl_dq(c, algo, v0, v1, vs, vq);
                if (acc) {
                    y = _mm256_add_ps(_mm256_loadu_ps(d + j), y);
                    nan = _mm256_or_ps(nan, _mm256_cmp_ps(y, y, _CMP_UNORD_Q));
                }
                _mm256_storeu_ps(d + j, y);
            }
            PCCL_FIX_NAN(d[j] != d[j], __builtin_nanf(""))
        }
        return i;
    }
    PCCL_AVX_FN pccl_avx2_dequant_f32(float *d, const void *q, int q_dtype, Py_ssize_t n,
                                      int algo, double p0, double p1, double step,
                                      double qmax, int acc) {
        #define PCCL_DQ(qd, al, ac) pccl_dq_loop(d, q, qd, n, al, p0, p1, step, qmax, ac)
        if (q_dtype == 0 && algo == 1) return acc ? PCCL_DQ(0, 1, 1) : PCCL_DQ(0, 1, 0);
        if (q_dtype == 0) return acc ? PCCL_DQ(0, 2, 1) : PCCL_DQ(0, 2, 0);
        if (algo == 1) return acc ? PCCL_DQ(2, 1, 1) : PCCL_DQ(2, 1, 0);
        return acc ? PCCL_DQ(2, 2, 1) : PCCL_DQ(2, 2, 0);
        #undef PCCL_DQ
    }
    #define PCCL_SIMD(call) (pccl_simd ? pccl_avx2_##call : 0)
    #else
    #define PCCL_SIMD(call) 0
    #endif
    #define pccl_simd_f32(d, s, n, prod) PCCL_SIMD(f32(d, s, n, prod))
    #define pccl_simd_bf16(d, s, n, prod) PCCL_SIMD(bf16(d, s, n, prod))
    #define pccl_simd_f16(d, s, n, prod) PCCL_SIMD(f16(d, s, n, prod))
    #define pccl_simd_minmax(p, n, dt, mn, mx) PCCL_SIMD(minmax(p, n, dt, mn, mx))
    #define pccl_simd_quantize(q, qd, x, dt, n, a, inv, lo, hi, zp) \\
        PCCL_SIMD(quantize(q, qd, x, dt, n, a, inv, lo, hi, zp))
    #define pccl_simd_dequant_f32(d, q, qd, n, al, p0, p1, st, qm, acc) \\
        PCCL_SIMD(dequant_f32(d, q, qd, n, al, p0, p1, st, qm, acc))
    """
    int pccl_simd
    int pccl_simd_max()
    Py_ssize_t pccl_simd_f32(float* d, const float* s, Py_ssize_t n, int prod)
    Py_ssize_t pccl_simd_bf16(uint16_t* d, const uint16_t* s, Py_ssize_t n, int prod)
    Py_ssize_t pccl_simd_f16(uint16_t* d, const uint16_t* s, Py_ssize_t n, int prod)
    Py_ssize_t pccl_simd_minmax(const void* p, Py_ssize_t n, int dtype, float* mn, float* mx)
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
    BLOCK_BYTES = 16384
    BLOCK_DOUBLES = 2048  # BLOCK_BYTES // 8

cdef double QUANT_LIMIT = 2.0 ** 1000
cdef double QUANT_MIN_SPAN = 2.0 ** -1000  # narrower ranges quantize to a constant
# (t + 1.5 * 2**52) - 1.5 * 2**52 == rint(t) (round half to even) for |t| <= 2**51.
cdef double RINT_MAGIC = 6755399441055744.0
cdef int ITEMSIZE[12]
ITEMSIZE[:] = [1, 1, 2, 2, 4, 4, 8, 8, 2, 2, 4, 8]

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
        i0 = pccl_simd_f32(d, s, n, op == PROD)
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


# ---- minmax and quantize --------------------------------------------------------------

cdef inline void _mm_update(float* mn, float* mx, float v) noexcept nogil:
    if v - v == 0:  # finite (inf - inf and NaN - NaN are NaN)
        mn[0] = v if v < mn[0] else mn[0]
        mx[0] = v if v > mx[0] else mx[0]

cdef void _minmax(const unsigned char* p, Py_ssize_t n, int dtype, double* out) noexcept nogil:
    """out = (min, max) of the finite values, (0, 0) if none; +0.0 for a zero."""
    cdef Py_ssize_t i, i0 = 0
    cdef float fmn = INFINITY, fmx = -INFINITY
    cdef double v, mn = INFINITY, mx = -INFINITY
    cdef const double* x64
    if dtype == F64:
        x64 = <const double*>p
        for i in range(n):
            v = x64[i]
            if v - v == 0:
                mn = v if v < mn else mn
                mx = v if v > mx else mx
    else:
        i0 = pccl_simd_minmax(p, n, dtype, &fmn, &fmx)
        if dtype == F32:
            for i in range(i0, n):
                _mm_update(&fmn, &fmx, (<const float*>p)[i])
        elif dtype == BF16:
            for i in range(i0, n):
                _mm_update(&fmn, &fmx, bf16_to_f32((<const uint16_t*>p)[i]))
        else:
            for i in range(i0, n):
                _mm_update(&fmn, &fmx, f16_to_f32((<const uint16_t*>p)[i]))
        mn = fmn
        mx = fmx
    if mn > mx:
        mn = 0.0
        mx = 0.0
    out[0] = mn + 0.0
    out[1] = mx + 0.0

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
    double p0
    double p1
    double step
    double qmax
    double tab64[256]  # for 8-bit codes: D(q) in float64, float32 and 16 bits
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
    t.qmax = 255.0 if q_dtype == 0 else 65535.0
    t.step = (p1 - p0) / t.qmax
    if q_dtype == 0:
        for i in range(256):
            t.tab64[i] = _dq(i, algo, p0, p1, t.step, t.qmax)
            t.tab32[i] = <float>t.tab64[i]
            t.tab16[i] = f32_to_bf16(t.tab32[i]) if dtype == BF16 else f32_to_f16(t.tab32[i])

cdef inline void _dq_direct(const Dequant* t, real* d, const uint16_t* q,
                            Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        d[i] = <real>_dq(q[i], t.algo, t.p0, t.p1, t.step, t.qmax)

cdef void _dq_run(const Dequant* t, unsigned char* d, const unsigned char* qp,
                  Py_ssize_t n) noexcept nogil:
    """d[0:n] = D(q) cast to t.dtype; 8-bit codes are looked up in the tables."""
    cdef Py_ssize_t i
    cdef const uint8_t* q8 = <const uint8_t*>qp
    cdef const uint16_t* q16 = <const uint16_t*>qp
    cdef uint16_t* h = <uint16_t*>d
    cdef Py_ssize_t i0 = 0
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


# ---- Python entry points (see _kernels_py for the contract) ---------------------------
# _ops validates arguments with proper messages; the O(1) checks here only keep a wrong
# direct call from reading or writing out of bounds (bounds checking is off).

cdef Py_ssize_t _count(Py_ssize_t nbytes, int dtype, bint floats) except -1:
    if not (F16 if floats else 0) <= dtype <= F64:
        raise ValueError(f"bad dtype {dtype}")
    return nbytes // ITEMSIZE[dtype]

cdef int _check_codes(Py_ssize_t n, Py_ssize_t qbytes, int q_dtype) except -1:
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
    cdef double qmax = 255.0 if q_dtype == 0 else 65535.0
    cdef double lo, hi, a, inv = 0.0, zp = 0.0
    _check_codes(n, dst_q.shape[0], q_dtype)
    if n == 0:
        return 0.0, 0.0
    with nogil:
        _minmax(&src[0], n, src_dtype, mm)
        mm[0] = min(max(mm[0], -QUANT_LIMIT), QUANT_LIMIT)
        mm[1] = min(max(mm[1], -QUANT_LIMIT), QUANT_LIMIT)
        if algo == MIN_MAX:  # (x - lo) * inv
            lo = mm[0]
            hi = mm[1]
            a = lo
        else:  # x * inv, zero point zp
            lo = min(mm[0], 0.0)
            hi = max(mm[1], 0.0)
            a = 0.0
        if hi - lo >= QUANT_MIN_SPAN:  # else inv == 0 and every code is 0, as in the reference
            inv = qmax / (hi - lo)
            if algo != MIN_MAX:
                zp = ((-lo * inv + RINT_MAGIC) - RINT_MAGIC) + 0.0
        if q_dtype == 0:
            _quantize(<uint8_t*>&dst_q[0], &src[0], n, src_dtype, a, inv, -zp, qmax - zp, zp)
        else:
            _quantize(<uint16_t*>&dst_q[0], &src[0], n, src_dtype, a, inv, -zp, qmax - zp, zp)
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
    cdef Py_ssize_t qsize = 1 if q_dtype == 0 else 2
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
        if dst_dtype == F32 and (op == SUM or op == AVG):  # the fused AVX2 loop
            start = pccl_simd_dequant_f32(<float*>&dst[0], &src_q[0], q_dtype, n, algo, p0, p1,
                                          t.step, t.qmax, True)
        while start < n:
            m = min(block, n - start)
            _dq_run(&t, tmp, &src_q[start * qsize], m)
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
