/* The AVX2 loops of the sparse compressor (_kernels_sparse.pxi): the error feedback with the
   chunk's largest magnitude, and the candidate gather; chosen at run time like those of
   _kernels_simd.h; the Cython loops do the tails and every CPU without AVX2. */
#ifndef PCCL_AIO_KERNELS_SPARSE_H
#define PCCL_AIO_KERNELS_SPARSE_H
#include <stdint.h>
#include "_kernels_simd.h"

#if PCCL_AVX2
/* The left-pack table: entry b holds, byte by byte, the lanes of the set bits of b in order
   (filled once, at the first use: every writer writes the same bytes). */
static uint64_t pccl_pack_lut[256];
static int pccl_pack_ready = 0;
static void pccl_pack_init(void) {
    for (int b = 0; b < 256; b++) {
        uint64_t e = 0;
        int n = 0;
        for (int j = 0; j < 8; j++)
            if (b & (1 << j))
                e |= (uint64_t)j << (8 * n++);
        pccl_pack_lut[b] = e;
    }
    pccl_pack_ready = 1;
}

/* The lanes of v (values' bits) and of their indices i..i+7 selected by bits, packed to
   ck[c...] and ci[c...] in lane order, without a branch: eight lanes are stored whatever the
   count (the callers' c <= i keeps them inside the chunk's arrays); returns the new count. */
PCCL_AVX Py_ssize_t pccl_pack8(__m256i v, unsigned bits, Py_ssize_t i, uint32_t *ck,
                               uint32_t *ci, Py_ssize_t c) {
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i perm = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)&pccl_pack_lut[bits]));
    __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int32_t)i), iota);
    _mm256_storeu_si256((__m256i *)(ck + c), _mm256_permutevar8x32_epi32(v, perm));
    _mm256_storeu_si256((__m256i *)(ci + c), _mm256_permutevar8x32_epi32(idx, perm));
    return c + __builtin_popcount(bits);
}

/* The values (their bits, sign included) of raw[0:m] whose keys (|x| bits: raw &
   0x7FFFFFFF) are at or above est, to ck, and their indices, to ci, in index order, eight
   keys per compare; returns the elements done (a multiple of 8) and the keys found in
   *count. */
PCCL_AVX_FN pccl_avx2_gather(const uint32_t *raw, Py_ssize_t m, uint32_t est, uint32_t *ck,
                             uint32_t *ci, Py_ssize_t *count) {
    Py_ssize_t i = 0, c = 0;
    const __m256i low31 = _mm256_set1_epi32(0x7FFFFFFF);
    /* keys and est are below 2**31: a signed compare with est - 1 (-1 for 0) is key >= est */
    const __m256i below = _mm256_set1_epi32((int32_t)est - 1);
    if (!pccl_pack_ready)
        pccl_pack_init();
    for (; i + 8 <= m; i += 8) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(raw + i));
        __m256i k = _mm256_and_si256(v, low31);
        unsigned bits = (unsigned)_mm256_movemask_ps(
            _mm256_castsi256_ps(_mm256_cmpgt_epi32(k, below)));
        c = pccl_pack8(v, bits, i, ck, ci, c);
    }
    *count = c;
    return i;
}
#define pccl_simd_gather(raw, m, est, ck, ci, count) \
    (pccl_simd ? pccl_avx2_gather(raw, m, est, ck, ci, count) : 0)

/* With src: p[0:m] = err * decay + src (each product rounded, then the sum: numpy's order,
   no FMA), eight at a time; without (src NULL): p as it is. The largest key (|x| bits) of
   p[0:done] to *top; with est > 0 also the values (bits, sign included) whose keys are at or
   above est, to ck, and their indices, to ci, in index order (their number to *count): one pass for the error feedback, the
   largest magnitude and the candidates. Returns the elements done (a multiple of 8). */
PCCL_AVX __m256i pccl_feed8(float *p, const float *src, const float *err, __m256 d,
                            Py_ssize_t i) {
    __m256 v;
    if (src) {
        v = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(err + i), d), _mm256_loadu_ps(src + i));
        _mm256_storeu_ps(p + i, v);
    } else {
        v = _mm256_loadu_ps(p + i);
    }
    return _mm256_castps_si256(v);
}
PCCL_AVX_FN pccl_avx2_feed_top(float *p, const float *src, const float *err, float decay,
                               Py_ssize_t m, uint32_t est, uint32_t *ck, uint32_t *ci,
                               Py_ssize_t *count, uint32_t *top) {
    Py_ssize_t i = 0, c = 0;
    const __m256 d = _mm256_set1_ps(decay);
    const __m256i low31 = _mm256_set1_epi32(0x7FFFFFFF);
    /* keys and est are below 2**31: a signed compare with est - 1 is key >= est */
    const __m256i below = _mm256_set1_epi32((int32_t)est - 1);
    __m256i hi = _mm256_setzero_si256();
    uint32_t lanes[8], h = 0;
    int j;
    if (est == 0) {
        for (; i + 8 <= m; i += 8)
            hi = _mm256_max_epu32(hi, _mm256_and_si256(pccl_feed8(p, src, err, d, i), low31));
    } else {
        if (!pccl_pack_ready)
            pccl_pack_init();
        for (; i + 8 <= m; i += 8) {
            __m256i v = pccl_feed8(p, src, err, d, i);
            __m256i k = _mm256_and_si256(v, low31);
            hi = _mm256_max_epu32(hi, k);
            c = pccl_pack8(v, (unsigned)_mm256_movemask_ps(
                _mm256_castsi256_ps(_mm256_cmpgt_epi32(k, below))), i, ck, ci, c);
        }
    }
    _mm256_storeu_si256((__m256i *)lanes, hi);
    for (j = 0; j < 8; j++)
        h = lanes[j] > h ? lanes[j] : h;
    *top = h;
    *count = c;
    return i;
}
#define pccl_simd_feed_top(p, src, err, decay, m, est, ck, ci, count, top) \
    (pccl_simd ? pccl_avx2_feed_top(p, src, err, decay, m, est, ck, ci, count, top) \
     : (*(top) = 0, *(count) = 0, (Py_ssize_t)0))
#else
#define pccl_simd_gather(raw, m, est, ck, ci, count) (*(count) = 0, (Py_ssize_t)0)
#define pccl_simd_feed_top(p, src, err, decay, m, est, ck, ci, count, top) \
    (*(top) = 0, *(count) = 0, (Py_ssize_t)0)
#endif

#endif /* PCCL_AIO_KERNELS_SPARSE_H */
