/* AVX2 + F16C fast paths of _kernels.pyx (included by the generated C file). */
#ifndef PCCL_AIO_KERNELS_SIMD_H
#define PCCL_AIO_KERNELS_SIMD_H

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
/* d[i] = op(x[i], s[i]); d may be x or s itself (each element is read before it is
   written), which is how reduce_into (x = d) and reduce_from share one loop */
PCCL_AVX Py_ssize_t pccl_f32_loop(float *d, const float *x, const float *s, Py_ssize_t n,
                                  int prod) {
    Py_ssize_t i = 0, j, end;
    for (; i + 16 <= n; i = end) {
        __m256 nan = _mm256_setzero_ps();
        end = i + PCCL_BLOCK <= n ? i + PCCL_BLOCK : n & ~(Py_ssize_t)15;
        for (j = i; j < end; j += 16) {
            __m256 a = pccl_op(_mm256_loadu_ps(x + j), _mm256_loadu_ps(s + j), prod);
            __m256 b = pccl_op(_mm256_loadu_ps(x + j + 8), _mm256_loadu_ps(s + j + 8), prod);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));  /* a or b NaN */
            _mm256_storeu_ps(d + j, a);
            _mm256_storeu_ps(d + j + 8, b);
        }
        PCCL_FIX_NAN(d[j] != d[j], __builtin_nanf(""))
    }
    return i;
}
PCCL_AVX_FN pccl_avx2_f32(float *d, const float *x, const float *s, Py_ssize_t n,
                          int prod) {
    return prod ? pccl_f32_loop(d, x, s, n, 1) : pccl_f32_loop(d, x, s, n, 0);
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
/* min/max of the values but NaN (min/max_ps return their second operand, the accumulator,
   when the first is NaN), infinities included; *bad is set when a value is NaN. The caller
   reads an infinity from the min or max. */
PCCL_AVX void pccl_mm8(__m256 v, __m256 *mn, __m256 *mx, __m256 *bad) {
    *bad = _mm256_or_ps(*bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    *mn = _mm256_min_ps(v, *mn);
    *mx = _mm256_max_ps(v, *mx);
}
PCCL_AVX Py_ssize_t pccl_mm_loop(const void *p, Py_ssize_t n, int dtype, float *mn,
                                 float *mx, int *bad) {  /* 8 float16, 9 bfloat16, 10 float32 */
    Py_ssize_t i = 0;
    float lo[8], hi[8];
    __m256 vmn = _mm256_set1_ps(*mn), vmx = _mm256_set1_ps(*mx), vbad = _mm256_setzero_ps();
    const __m256i himask = _mm256_set1_epi32((int)0xffff0000u);
    for (; i + 16 <= n; i += 16) {
        if (dtype == 8) {
            const __m128i *h = (const __m128i *)((const uint16_t *)p + i);
            pccl_mm8(_mm256_cvtph_ps(_mm_loadu_si128(h)), &vmn, &vmx, &vbad);
            pccl_mm8(_mm256_cvtph_ps(_mm_loadu_si128(h + 1)), &vmn, &vmx, &vbad);
        } else if (dtype == 9) {
            __m256i v = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
            pccl_mm8(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), &vmn, &vmx, &vbad);
            pccl_mm8(_mm256_castsi256_ps(_mm256_and_si256(v, himask)), &vmn, &vmx, &vbad);
        } else {
            pccl_mm8(_mm256_loadu_ps((const float *)p + i), &vmn, &vmx, &vbad);
            pccl_mm8(_mm256_loadu_ps((const float *)p + i + 8), &vmn, &vmx, &vbad);
        }
    }
    _mm256_storeu_ps(lo, vmn);
    _mm256_storeu_ps(hi, vmx);
    for (int k = 0; k < 8; k++) {
        *mn = lo[k] < *mn ? lo[k] : *mn;
        *mx = hi[k] > *mx ? hi[k] : *mx;
    }
    if (_mm256_movemask_ps(vbad))
        *bad = 1;
    return i;
}
PCCL_AVX_FN pccl_avx2_minmax(const void *p, Py_ssize_t n, int dtype, float *mn,
                             float *mx, int *bad) {
    return dtype == 8 ? pccl_mm_loop(p, n, 8, mn, mx, bad)
        : dtype == 9 ? pccl_mm_loop(p, n, 9, mn, mx, bad)
        : pccl_mm_loop(p, n, 10, mn, mx, bad);
}
/* quantize: codes = rint(clamp((x - a) * inv, lo, hi)) + zp for dtype 8 float16,
   9 bfloat16, 10 float32 or 11 float64; q_dtype 0 uint8, 2 uint16, 12 uint4 (two per
   byte, element 2i in the low nibble; q points at element 0's byte) */
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
        } else if (q_dtype == 12) {  /* codes 0..15: 16-bit lane e + 256 o -> e | o << 4 */
            __m128i b = _mm_packus_epi16(_mm_packs_epi32(c0, c1), _mm_packs_epi32(c2, c3));
            b = _mm_or_si128(_mm_and_si128(b, _mm_set1_epi16(0xff)), _mm_srli_epi16(b, 4));
            _mm_storel_epi64((__m128i *)((uint8_t *)q + i / 2), _mm_packus_epi16(b, b));
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
    if (q_dtype == 12)
        return dtype == 10 ? PCCL_Q(12, 10) : dtype == 9 ? PCCL_Q(12, 9)
            : dtype == 8 ? PCCL_Q(12, 8) : PCCL_Q(12, 11);
    return dtype == 10 ? PCCL_Q(2, 10) : dtype == 9 ? PCCL_Q(2, 9)
        : dtype == 8 ? PCCL_Q(2, 8) : PCCL_Q(2, 11);
    #undef PCCL_Q
}
/* float32 destination: d = D(q), or d = d + D(q) (acc); D(q) in float64 as the
   reference: algo 1 p0 + q * step, algo 2 ((q - p1) * p0) / qmax; q_dtype 0 uint8,
   2 uint16, 12 uint4 (two per byte, q points at element 0's byte) */
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
    const __m256i nib = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    for (; i + 8 <= n; i = end) {
        __m256 nan = _mm256_setzero_ps();
        end = i + PCCL_BLOCK <= n ? i + PCCL_BLOCK : n & ~(Py_ssize_t)7;
        for (j = i; j < end; j += 8) {
            __m256i c;
            if (q_dtype == 12) {  /* 8 nibbles of one 32-bit word: element k at bit 4k */
                int w;
                memcpy(&w, (const uint8_t *)q + j / 2, 4);
                c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w), nib),
                                     _mm256_set1_epi32(15));
            } else {
                c = q_dtype == 0
                ? _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)((const uint8_t *)q + j)))
                : _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)q + j)));
            }
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
    if (q_dtype == 12 && algo == 1) return acc ? PCCL_DQ(12, 1, 1) : PCCL_DQ(12, 1, 0);
    if (q_dtype == 12) return acc ? PCCL_DQ(12, 2, 1) : PCCL_DQ(12, 2, 0);
    if (q_dtype == 0 && algo == 1) return acc ? PCCL_DQ(0, 1, 1) : PCCL_DQ(0, 1, 0);
    if (q_dtype == 0) return acc ? PCCL_DQ(0, 2, 1) : PCCL_DQ(0, 2, 0);
    if (algo == 1) return acc ? PCCL_DQ(2, 1, 1) : PCCL_DQ(2, 1, 0);
    return acc ? PCCL_DQ(2, 2, 1) : PCCL_DQ(2, 2, 0);
    #undef PCCL_DQ
}
/* copy with streaming stores, for a copy kept aside (the in-place backup): the stores
   skip the cache, so they neither read the destination's lines first nor evict the
   working set; returns the bytes done, the caller copies the rest */
PCCL_AVX_FN pccl_avx2_stream_copy(void *d, const void *s, Py_ssize_t n) {
    char *dc = (char *)d;
    const char *sc = (const char *)s;
    Py_ssize_t i = (Py_ssize_t)((32 - ((uintptr_t)dc & 31)) & 31);
    if (n < 256) return 0;
    memcpy(dc, sc, (size_t)i);
    for (; i + 128 <= n; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(sc + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(sc + i + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(sc + i + 64));
        __m256i e = _mm256_loadu_si256((const __m256i *)(sc + i + 96));
        _mm256_stream_si256((__m256i *)(dc + i), a);
        _mm256_stream_si256((__m256i *)(dc + i + 32), b);
        _mm256_stream_si256((__m256i *)(dc + i + 64), c);
        _mm256_stream_si256((__m256i *)(dc + i + 96), e);
    }
    _mm_sfence();
    return i;
}
#define PCCL_SIMD(call) (pccl_simd ? pccl_avx2_##call : 0)
#else
#define PCCL_SIMD(call) 0
#endif
#define pccl_simd_f32(d, x, s, n, prod) PCCL_SIMD(f32(d, x, s, n, prod))
#define pccl_simd_bf16(d, s, n, prod) PCCL_SIMD(bf16(d, s, n, prod))
#define pccl_simd_f16(d, s, n, prod) PCCL_SIMD(f16(d, s, n, prod))
#define pccl_simd_minmax(p, n, dt, mn, mx, bad) PCCL_SIMD(minmax(p, n, dt, mn, mx, bad))
#define pccl_simd_stream_copy(d, s, n) PCCL_SIMD(stream_copy(d, s, n))
#define pccl_simd_quantize(q, qd, x, dt, n, a, inv, lo, hi, zp) \
    PCCL_SIMD(quantize(q, qd, x, dt, n, a, inv, lo, hi, zp))
#define pccl_simd_dequant_f32(d, q, qd, n, al, p0, p1, st, qm, acc) \
    PCCL_SIMD(dequant_f32(d, q, qd, n, al, p0, p1, st, qm, acc))

#endif /* PCCL_AIO_KERNELS_SIMD_H */
