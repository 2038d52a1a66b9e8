/* The AVX2 loop of the sparse compressor's candidate gather (_kernels_sparse.pxi), chosen at
   run time like those of _kernels_simd.h; the Cython loop does the tail and every CPU
   without AVX2. */
#ifndef PCCL_AIO_KERNELS_SPARSE_H
#define PCCL_AIO_KERNELS_SPARSE_H
#include <stdint.h>
#include "_kernels_simd.h"

#if PCCL_AVX2
/* The keys (|x| bits: raw & 0x7FFFFFFF) of raw[0:m] at or above est, to ck, and their
   indices, to ci, in index order, eight keys per compare; returns the elements done (a
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
            ck[c] = raw[i + j] & 0x7FFFFFFFu;
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
#else
#define pccl_simd_gather(raw, m, est, ck, ci, count) (*(count) = 0, (Py_ssize_t)0)
#endif

#endif /* PCCL_AIO_KERNELS_SPARSE_H */
