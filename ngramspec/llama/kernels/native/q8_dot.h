/* Shared by ngramspec's matmul kernels (q8_head.c, matmul.c): weight rows of Q8_0 blocks
 * against Q8_0-quantized columns, each result bit for bit ggml's x86 AVX2
 * vec_dot_q8_0_q8_0 of the two (compiled as two variants, AVX2 and AVX-512 VNNI, the
 * second below; kernels/build.py): per 32-element block, the 8 int32 lane sums of the byte
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
 * column; yd: their scales as floats), into out[c][r] and best (`put`; nc <= 8, a
 * constant where inlined). One row at a time: a row streams through once for its nc
 * columns. */
static inline __attribute__((always_inline)) void rows_x_cols(
        const block_q8 *w, int64_t r0, int64_t r1, int nb, const block_q8 *y,
        const float *yd, int c0, int nc, float **out, best_t *best) {
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
            put(out, best, c0 + j, r, lanes_sum(acc[j]));
    }
}

/* The columns a product runs against: k columns of nb Q8_0 blocks (quantize_cols), in
 * memory of cols_bytes(k, nb) bytes (64-byte aligned) laid out by cols_at. */
typedef struct {
    int k, nb;
    block_q8 *y;   /* column c's blocks at y + c * nb */
    float *yd;     /* their scales as floats */
    char *pairs;   /* the 512-bit variant's column pairs (below); NULL in the AVX2 variant */
} cols_t;

static inline int64_t round64(int64_t n) { return (n + 63) & ~(int64_t)63; }

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
/* The AVX-512 VNNI variant. A 512-bit register holds two (row, column) accumulators, one
 * a half, each taking exactly the AVX2 path's operations in the same order, so every
 * value is the same: per block the 8 int32 lane sums of the byte products, converted to
 * float, times the float product of the two scales, fused-multiply-added in block order.
 * The lane sums come from one dpbusd (unsigned x signed bytes): the weight bytes offset
 * by 128 (w ^ 0x80 = w + 128 in 0..255) times the column's bytes, started from minus 128
 * times the column's 4-byte sums, which is sum(w * y) exactly (no term leaves int32).
 * Columns are prepared in pairs, per block PAIR_BYTES: the two columns' 32 bytes, the two
 * corrections (8 int32 each), the two scales (8 floats each). An odd last column pairs
 * with zeros, whose results are dropped. */
#define NGS_VARIANT "avx512vnni"
#define PAIR_BYTES 192
#define PAIR_COLS 16   /* columns a row runs against at a time: 8 accumulators */

static inline int64_t pairs_bytes(int k, int nb) { return (int64_t)((k + 1) / 2) * nb * PAIR_BYTES; }

static inline void prepare_pairs(const cols_t *c) {
    const __m256i k80 = _mm256_set1_epi8((char)0x80), zero = _mm256_setzero_si256();
    for (int col = 0; col < (c->k + 1) / 2 * 2; ++col)
        for (int b = 0; b < c->nb; ++b) {
            char *at = c->pairs + ((int64_t)(col / 2) * c->nb + b) * PAIR_BYTES + 32 * (col % 2);
            __m256i qy = zero, neg = zero;
            __m256 d = _mm256_setzero_ps();
            if (col < c->k) {
                const int64_t yb = (int64_t)col * c->nb + b;
                qy = _mm256_loadu_si256((const __m256i *)c->y[yb].qs);
                neg = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, k80, qy));
                d = _mm256_set1_ps(c->yd[yb]);
            }
            _mm256_storeu_si256((__m256i *)at, qy);
            _mm256_storeu_si256((__m256i *)(at + 64), neg);
            _mm256_storeu_ps((float *)(at + 128), d);
        }
}

/* Rows [r0, r1) of w against the column pairs p0 .. p0+np-1 (np <= 8, a constant where
 * inlined), into out[c][r] and best (`put`; an odd last column's zero partner is
 * dropped). */
static inline __attribute__((always_inline)) void rows_x_pairs(
        const block_q8 *w, int64_t r0, int64_t r1, const cols_t *c, int p0, int np, float **out,
        best_t *best) {
    const __m256i k80 = _mm256_set1_epi8((char)0x80);
    const int nb = c->nb;
    for (int64_t r = r0; r < r1; ++r) {
        const block_q8 *x = w + r * nb;
        __m512 acc[8];
        for (int j = 0; j < np; ++j) acc[j] = _mm512_setzero_ps();
        for (int b = 0; b < nb; ++b) {
            const __m512 dx = _mm512_set1_ps(_cvtsh_ss(x[b].d));
            const __m512i wx = _mm512_broadcast_i64x4(
                _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)x[b].qs), k80));
            for (int j = 0; j < np; ++j) {
                const char *at = c->pairs + ((int64_t)(p0 + j) * nb + b) * PAIR_BYTES;
                const __m512i s = _mm512_dpbusd_epi32(_mm512_loadu_si512(at + 64), wx,
                                                      _mm512_loadu_si512(at));
                const __m512 d = _mm512_mul_ps(dx, _mm512_loadu_ps((const float *)(at + 128)));
                acc[j] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), acc[j]);
            }
        }
        for (int j = 0; j < np; ++j) store_pair_sums(out, best, 2 * (p0 + j), c->k, r, acc[j]);
    }
}

/* Rows [r0, r1) against all k columns: 16 at a time from L1, then the rest by pairs;
 * into out and best (`put`; best NULL: no argmax). */
static inline void rows_x_all_cols(const block_q8 *w, int64_t r0, int64_t r1, const cols_t *c,
                                   float **out, best_t *best) {
    const int n_pairs = (c->k + 1) / 2;
    for (int p0 = 0, n = 0; p0 < n_pairs; p0 += n) {
        n = n_pairs - p0 >= 8 ? 8 : n_pairs - p0 >= 4 ? 4 : n_pairs - p0 >= 2 ? 2 : 1;
        switch (n) {
        case 8: rows_x_pairs(w, r0, r1, c, p0, 8, out, best); break;
        case 4: rows_x_pairs(w, r0, r1, c, p0, 4, out, best); break;
        case 2: rows_x_pairs(w, r0, r1, c, p0, 2, out, best); break;
        default: rows_x_pairs(w, r0, r1, c, p0, 1, out, best); break;
        }
    }
}
#else
#define NGS_VARIANT "avx2"
static inline int64_t pairs_bytes(int k, int nb) { (void)k; (void)nb; return 0; }
static inline void prepare_pairs(const cols_t *c) { (void)c; }

/* Rows [r0, r1) against all k columns: 8 at a time from L1, then 4, then the rest;
 * into out and best (`put`; best NULL: no argmax). (Tiles of 3 rows x 4 columns
 * measured slower here: 2.23 against 2.07 cycles a pair from L1, and half the speed
 * where rows stream from memory.) */
static inline void rows_x_all_cols(const block_q8 *w, int64_t r0, int64_t r1, const cols_t *c,
                                   float **out, best_t *best) {
    const int k = c->k, nb = c->nb;
    const block_q8 *y = c->y;
    const float *yd = c->yd;
    for (int c0 = 0, n = 0; c0 < k; c0 += n) {
        n = k - c0 >= 8 ? 8 : k - c0 >= 4 ? 4 : k - c0;
        switch (n) {
        case 8: rows_x_cols(w, r0, r1, nb, y, yd, c0, 8, out, best); break;
        case 4: rows_x_cols(w, r0, r1, nb, y, yd, c0, 4, out, best); break;
        case 3: rows_x_cols(w, r0, r1, nb, y, yd, c0, 3, out, best); break;
        case 2: rows_x_cols(w, r0, r1, nb, y, yd, c0, 2, out, best); break;
        default: rows_x_cols(w, r0, r1, nb, y, yd, c0, 1, out, best); break;
        }
    }
}
#endif

/* Bytes of the columns' memory (cols_at). */
static inline int64_t cols_bytes(int k, int nb) {
    return round64((int64_t)k * nb * (int64_t)sizeof(block_q8)) + round64((int64_t)k * nb * 4) +
           pairs_bytes(k, nb);
}

static inline cols_t cols_at(char *mem, int k, int nb) {
    cols_t c = {k, nb, (block_q8 *)mem, NULL, NULL};
    c.yd = (float *)(mem + round64((int64_t)k * nb * (int64_t)sizeof(block_q8)));
    c.pairs = pairs_bytes(k, nb) ? (char *)c.yd + round64((int64_t)k * nb * 4) : NULL;
    return c;
}

/* The k float columns x + which[c] * stride bytes (which NULL: c) of c->nb * 32 values,
 * quantized as ggml's mul_mat quantizes them (the CPU backend's own Q8_0 `from_float`),
 * with their scales as floats (and the variant's pairs). */
static inline void quantize_cols(from_float_t from_float, const char *x, int64_t stride,
                                 const int32_t *which, const cols_t *c) {
    const int nb = c->nb;
    for (int col = 0; col < c->k; ++col) {
        const int64_t at = which ? which[col] : col;
        from_float((const float *)(x + at * stride), c->y + (int64_t)col * nb, (int64_t)nb * 32);
        for (int b = 0; b < nb; ++b)
            c->yd[(int64_t)col * nb + b] = _cvtsh_ss(c->y[(int64_t)col * nb + b].d);
    }
    prepare_pairs(c);
}

/* The instruction-set variant this library was compiled as (kernels/build.py VARIANTS). */
const char *ngs_variant(void) { return NGS_VARIANT; }
#endif
