/* Shared by ngramspec's kernels (the C files beside it): the sum of 8 float lanes in one fixed
 * order (ggml's hsum_float_8: high half plus low half, then pairs, then the last two),
 * so that a value never depends on which kernel or loop produced its lanes. */
#ifndef NGS_LANES_H
#define NGS_LANES_H
#include <immintrin.h>

static inline float lanes_sum(__m256 x) {
    __m128 r = _mm256_extractf128_ps(x, 1);
    r = _mm_add_ps(r, _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}
#endif
