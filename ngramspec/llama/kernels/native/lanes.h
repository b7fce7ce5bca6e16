/* Shared by ngramspec's kernels (the C files beside it): the sum of 8 float lanes in one fixed
 * order (ggml's hsum_float_8: high half plus low half, then pairs, then the last two),
 * so that a value never depends on which kernel or loop produced its lanes; and where a
 * matmul's results go (`put`). */
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

/* A column's argmax being found over rows seen in increasing order: numpy's argmax, the
 * first greatest value, or the first NaN if there is one (i < 0: no row seen yet). */
typedef struct { float v; int64_t i; } best_t;

static inline void best_take(best_t *b, float v, int64_t i) {
    if (b->i < 0 || v > b->v || (v != v && b->v == b->v)) { b->v = v; b->i = i; }
}

/* Row r's value v of column c: into out[c][r] where column c's values are kept (out[c]
 * not NULL), and seen by column c's argmax where one is found (best not NULL). */
static inline __attribute__((always_inline)) void put(float **out, best_t *best, int c,
                                                     int64_t r, float v) {
    if (out[c]) out[c][r] = v;
    if (best) best_take(best + c, v, r);
}

#ifdef __AVX512F__
/* The upper 256-bit half of a 512-bit register (the second column of a pair). */
static inline __m256 upper_half(__m512 x) {
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
}

/* A column pair's row r: column col's value is lanes_sum of acc's lower half and, where
 * column col + 1 < k exists (an odd last column pairs with zeros), column col + 1's of its
 * upper half; each goes to out and best (`put`). */
static inline __attribute__((always_inline)) void store_pair_sums(
        float **out, best_t *best, int col, int k, int64_t r, __m512 acc) {
    put(out, best, col, r, lanes_sum(_mm512_castps512_ps256(acc)));
    if (col + 1 < k) put(out, best, col + 1, r, lanes_sum(upper_half(acc)));
}
#endif
#endif
