/* Shared by ngramspec's matmul kernels (q8_head.c, matmul.c): weight rows of Q8_0 blocks
 * against Q8_0-quantized columns, each result bit for bit ggml's x86 AVX2
 * vec_dot_q8_0_q8_0 of the two: per 32-element block, the 8 int32 lane sums of the byte
 * products (exact integers, through the sign trick and maddubs/madd), converted to
 * float, times the float product of the two fp16 scales, fused-multiply-added into 8
 * float lanes in block order; then `lanes_sum`. A value never depends on how many
 * columns or rows are computed together: only the loops around a pair differ. */
#ifndef NGS_Q8_DOT_H
#define NGS_Q8_DOT_H
#include <immintrin.h>
#include <stdint.h>

#include "lanes.h"

typedef struct { uint16_t d; int8_t qs[32]; } __attribute__((packed)) block_q8;
typedef void (*from_float_t)(const float *, void *, int64_t);

/* Rows [r0, r1) of w (nb blocks a row) against columns c0 .. c0+nc-1 of y (nb blocks a
 * column; yd: their scales as floats), into out[c][r] (nc <= 8, a constant where
 * inlined). One row at a time: a row streams through once for its nc columns. */
static inline __attribute__((always_inline)) void rows_x_cols(
        const block_q8 *w, int64_t r0, int64_t r1, int nb, const block_q8 *y,
        const float *yd, int c0, int nc, float **out) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t r = r0; r < r1; ++r) {
        const block_q8 *x = w + r * nb;
        __m256 acc[8];
        for (int j = 0; j < nc; ++j) acc[j] = _mm256_setzero_ps();
        for (int b = 0; b < nb; ++b) {
            const __m256 dx = _mm256_set1_ps(_cvtsh_ss(x[b].d));
            const __m256i qx = _mm256_loadu_si256((const __m256i *)x[b].qs);
            const __m256i ax = _mm256_sign_epi8(qx, qx);
            for (int j = 0; j < nc; ++j) {
                const int64_t yb = (int64_t)(c0 + j) * nb + b;
                const __m256 d = _mm256_mul_ps(dx, _mm256_broadcast_ss(yd + yb));
                const __m256i qy = _mm256_loadu_si256((const __m256i *)y[yb].qs);
                const __m256i sy = _mm256_sign_epi8(qy, qx);
                const __m256i s32 = _mm256_madd_epi16(ones, _mm256_maddubs_epi16(ax, sy));
                acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s32), acc[j]);
            }
        }
        for (int j = 0; j < nc; ++j)
            out[c0 + j][r] = lanes_sum(acc[j]);
    }
}

/* Rows [r0, r1) against all k columns: 8 at a time from L1, then 4, then the rest.
 * (Tiles of 3 rows x 4 columns measured slower here: 2.23 against 2.07 cycles a pair
 * from L1, and half the speed where rows stream from memory.) */
static inline void rows_x_all_cols(const block_q8 *w, int64_t r0, int64_t r1, int nb,
                                   const block_q8 *y, const float *yd, int k, float **out) {
    for (int c0 = 0, n = 0; c0 < k; c0 += n) {
        n = k - c0 >= 8 ? 8 : k - c0 >= 4 ? 4 : k - c0;
        switch (n) {
        case 8: rows_x_cols(w, r0, r1, nb, y, yd, c0, 8, out); break;
        case 4: rows_x_cols(w, r0, r1, nb, y, yd, c0, 4, out); break;
        case 3: rows_x_cols(w, r0, r1, nb, y, yd, c0, 3, out); break;
        case 2: rows_x_cols(w, r0, r1, nb, y, yd, c0, 2, out); break;
        default: rows_x_cols(w, r0, r1, nb, y, yd, c0, 1, out); break;
        }
    }
}

/* The k float columns x + which[c] * stride bytes (which NULL: c) of n values, quantized
 * as ggml's mul_mat quantizes them (the CPU backend's own Q8_0 `from_float`), with their
 * scales as floats. */
static inline void quantize_cols(from_float_t from_float, const char *x, int64_t stride,
                                 const int32_t *which, int k, int64_t n, block_q8 *y, float *yd) {
    const int nb = (int)(n / 32);
    for (int c = 0; c < k; ++c) {
        const int64_t at = which ? which[c] : c;
        from_float((const float *)(x + at * stride), y + (int64_t)c * nb, n);
        for (int b = 0; b < nb; ++b) yd[(int64_t)c * nb + b] = _cvtsh_ss(y[(int64_t)c * nb + b].d);
    }
}
#endif
