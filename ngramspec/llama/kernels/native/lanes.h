/* Shared by ngramspec's kernels (the C files beside it): the sum of 8 float lanes in one fixed
 * order (ggml's hsum_float_8: high half plus low half, then pairs, then the last two),
 * so that a value never depends on which kernel or loop produced its lanes. */
#ifndef NGS_LANES_H
#define NGS_LANES_H
#include <immintrin.h>
#include <stdint.h>

static inline float lanes_sum(__m256 x) {
    __m128 r = _mm256_extractf128_ps(x, 1);
    r = _mm_add_ps(r, _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

#ifdef __AVX512F__
/* The upper 256-bit half of a 512-bit register (the second column of a pair). */
static inline __m256 upper_half(__m512 x) {
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
}

/* A column pair's row r: out[col][r] = lanes_sum of acc's lower half and, where column
 * col + 1 < k exists (an odd last column pairs with zeros), out[col + 1][r] of its upper. */
static inline void store_pair_sums(float **out, int col, int k, int64_t r, __m512 acc) {
    out[col][r] = lanes_sum(_mm512_castps512_ps256(acc));
    if (col + 1 < k) out[col + 1][r] = lanes_sum(upper_half(acc));
}
#endif
#endif
