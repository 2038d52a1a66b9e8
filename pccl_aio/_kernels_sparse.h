/* The AVX2 loops of the sparse compressor (_kernels_sparse.pxi): the error feedback with the
   chunk's largest magnitude, and the candidate gather; chosen at run time like those of
   _kernels_simd.h; the Cython loops do the tails and every CPU without AVX2. */
#ifndef PCCL_AIO_KERNELS_SPARSE_H
#define PCCL_AIO_KERNELS_SPARSE_H
#include <stdint.h>
#include "_kernels_simd.h"

#if PCCL_AVX2
/* The values (their bits, sign included) of raw[0:m] whose keys (|x| bits: raw &
   0x7FFFFFFF) are at or above est, to ck, and their indices, to ci, in index order, eight keys per compare; returns the elements done (a
   multiple of 8) and the keys found in *count. */
PCCL_AVX_FN pccl_avx2_gather(const uint32_t *raw, Py_ssize_t m, uint32_t est, uint32_t *ck,
                             uint32_t *ci, Py_ssize_t *count) {
    Py_ssize_t i = 0, c = 0;
    const __m256i low31 = _mm256_set1_epi32(0x7FFFFFFF);
    /* keys and est are below 2**31: a signed compare with est - 1 (-1 for 0) is key >= est */
    const __m256i below = _mm256_set1_epi32((int32_t)est - 1);
    for (; i + 8 <= m; i += 8) {
        __m256i k = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(raw + i)), low31);
        unsigned bits = (unsigned)_mm256_movemask_ps(
            _mm256_castsi256_ps(_mm256_cmpgt_epi32(k, below)));
        while (bits) {
            unsigned j = (unsigned)__builtin_ctz(bits);
            ck[c] = raw[i + j];
            ci[c] = (uint32_t)(i + j);
            c++;
            bits &= bits - 1;
        }
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
    unsigned bits;
    int j;
    if (est == 0) {
        for (; i + 8 <= m; i += 8)
            hi = _mm256_max_epu32(hi, _mm256_and_si256(pccl_feed8(p, src, err, d, i), low31));
    } else {
        for (; i + 8 <= m; i += 8) {
            __m256i v = pccl_feed8(p, src, err, d, i);
            __m256i k = _mm256_and_si256(v, low31);
            hi = _mm256_max_epu32(hi, k);
            bits = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(k, below)));
            if (bits) {
                _mm256_storeu_si256((__m256i *)lanes, v);
                do {
                    j = __builtin_ctz(bits);
                    ck[c] = lanes[j];
                    ci[c] = (uint32_t)(i + j);
                    c++;
                    bits &= bits - 1;
                } while (bits);
            }
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
