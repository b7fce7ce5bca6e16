/* Q4_K and Q6_K weight rows against Q8_K columns (matmul.c), every value bit for bit
 * ggml's x86 AVX2 vec_dot_q4_K_q8_K / vec_dot_q6_K_q8_K (the path llama.cpp compiles
 * wherever AVX2 is, AVX-512 machines included).
 *
 * ggml's one-column dot unpacks each 256-value super-block (4- or 6-bit values, 6- or
 * 8-bit scales) again for every column it meets. Here a row's super-block is unpacked
 * once (`q4k_unpack`, `q6k_unpack`: exactly the vectors ggml derives from the weights
 * alone) and then met by up to 8 columns, each with ggml's own per-column operations in
 * ggml's order: the same maddubs/madd int32 lane sums (integers, exact), the same float
 * scale products, fused into 8 float lanes (Q4_K: also the 4 lanes of the minimums) in
 * super-block order, then summed as hsum_float_8. A value never depends on how many
 * columns or rows are computed together. */
#ifndef NGS_KQUANT_H
#define NGS_KQUANT_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "lanes.h"

#define QK_K 256

typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; } block_q4_K;
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16];
                 uint16_t d; } __attribute__((packed)) block_q6_K;

/* ggml's byte shuffles picking a sub-block's scale (Q4_K: a 16-bit pair, Q6_K: a byte). */
static inline __m256i k4_shuffle(int i) {
    return _mm256_set1_epi16((short)((2 * i) | ((2 * i + 1) << 8)));
}
static inline __m128i k6_shuffle(int i) {
    return _mm_set_epi64x(0x0101010101010101LL * (2 * i + 1), 0x0101010101010101LL * (2 * i));
}

/* ---------------------------------------------------------------- Q4_K */

typedef struct {
    __m256i q[8];    /* per 64 values j: low nibbles (q[2j]), high nibbles (q[2j + 1]) */
    __m256i sc[8];   /* their scales as ggml shuffles them (scale_l, scale_h) */
    __m128i mins;    /* the 8 minimums (16-bit) */
    float d, dmin;
} q4k_unpacked;

static inline void q4k_unpack(const block_q4_K *x, q4k_unpacked *u) {
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    uint32_t utmp[4];
    memcpy(utmp, x->scales, 12);
    utmp[3] = ((utmp[2] >> 4) & kmask2) | (((utmp[1] >> 6) & kmask3) << 4);
    const uint32_t uaux = utmp[1] & kmask1;
    utmp[1] = (utmp[2] & kmask2) | (((utmp[0] >> 6) & kmask3) << 4);
    utmp[2] = uaux;
    utmp[0] &= kmask1;
    const __m256i ms = _mm256_cvtepu8_epi16(_mm_set_epi32((int)utmp[3], (int)utmp[2],
                                                          (int)utmp[1], (int)utmp[0]));
    u->mins = _mm256_extracti128_si256(ms, 1);
    const __m128i sc128 = _mm256_extracti128_si256(ms, 0);
    const __m256i scales = _mm256_set_m128i(sc128, sc128);
    const __m256i m4 = _mm256_set1_epi8(0xF);
    for (int j = 0; j < QK_K / 64; ++j) {
        u->sc[2 * j] = _mm256_shuffle_epi8(scales, k4_shuffle(2 * j));
        u->sc[2 * j + 1] = _mm256_shuffle_epi8(scales, k4_shuffle(2 * j + 1));
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * j));
        u->q[2 * j] = _mm256_and_si256(bits, m4);
        u->q[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
    }
    u->d = _cvtsh_ss(x->d);
    u->dmin = _cvtsh_ss(x->dmin);
}

/* One super-block of one column into (acc, acc_m), as ggml's loop body. */
static inline __attribute__((always_inline)) void q4k_dot(const q4k_unpacked *u,
                                                          const block_q8_K *y, __m256 *acc,
                                                          __m128 *acc_m) {
    const float d = y->d * u->d;
    const float dmin = -y->d * u->dmin;
    const __m256i q8sums = _mm256_loadu_si256((const __m256i *)y->bsums);
    const __m128i q8s = _mm_hadd_epi16(_mm256_extracti128_si256(q8sums, 0),
                                       _mm256_extracti128_si256(q8sums, 1));
    const __m128i prod = _mm_madd_epi16(u->mins, q8s);
    *acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), *acc_m);
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < QK_K / 64; ++j) {
        const __m256i q8l = _mm256_loadu_si256((const __m256i *)(y->qs + 64 * j));
        const __m256i q8h = _mm256_loadu_si256((const __m256i *)(y->qs + 64 * j + 32));
        const __m256i p16l = _mm256_madd_epi16(u->sc[2 * j], _mm256_maddubs_epi16(u->q[2 * j], q8l));
        const __m256i p16h = _mm256_madd_epi16(u->sc[2 * j + 1],
                                               _mm256_maddubs_epi16(u->q[2 * j + 1], q8h));
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16l, p16h));
    }
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), *acc);
}

static inline float q4k_result(__m256 acc, __m128 acc_m) {
    acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
    return lanes_sum(acc) + _mm_cvtss_f32(acc_m);
}

/* Rows [r0, r1) (row_bytes apart, nb super-blocks each) against columns c0 .. c0+nc-1
 * of y (nb blocks a column) into out[c][r] (nc <= 8, a constant where inlined). */
static inline __attribute__((always_inline)) void q4k_rows_x_cols(
        const char *w, size_t row_bytes, int64_t r0, int64_t r1, int nb, const block_q8_K *y,
        int c0, int nc, float **out) {
    for (int64_t r = r0; r < r1; ++r) {
        const block_q4_K *x = (const block_q4_K *)(w + r * row_bytes);
        __m256 acc[8];
        __m128 acc_m[8];
        for (int j = 0; j < nc; ++j) { acc[j] = _mm256_setzero_ps(); acc_m[j] = _mm_setzero_ps(); }
        for (int b = 0; b < nb; ++b) {
            q4k_unpacked u;
            q4k_unpack(x + b, &u);
            for (int j = 0; j < nc; ++j)
                q4k_dot(&u, y + (int64_t)(c0 + j) * nb + b, &acc[j], &acc_m[j]);
        }
        for (int j = 0; j < nc; ++j) out[c0 + j][r] = q4k_result(acc[j], acc_m[j]);
    }
}

/* ---------------------------------------------------------------- Q6_K */

typedef struct {
    __m256i q[8];      /* the 6-bit values (0..63) of each 32 */
    __m256i sc[8];     /* their scales as ggml shuffles and widens them */
    __m256i scales16;  /* the 16 scales, 16-bit (the -32 offset's correction) */
    float d;
} q6k_unpacked;

static inline void q6k_unpack(const block_q6_K *x, q6k_unpacked *u) {
    const __m256i m3 = _mm256_set1_epi8(3), m15 = _mm256_set1_epi8(15);
    const uint8_t *q4 = x->ql, *qh = x->qh;
    for (int j = 0; j < QK_K / 128; ++j) {
        const __m256i q4bits1 = _mm256_loadu_si256((const __m256i *)q4); q4 += 32;
        const __m256i q4bits2 = _mm256_loadu_si256((const __m256i *)q4); q4 += 32;
        const __m256i q4bitsH = _mm256_loadu_si256((const __m256i *)qh); qh += 32;
        const __m256i q4h_0 = _mm256_slli_epi16(_mm256_and_si256(q4bitsH, m3), 4);
        const __m256i q4h_1 = _mm256_slli_epi16(_mm256_and_si256(q4bitsH, _mm256_set1_epi8(12)), 2);
        const __m256i q4h_2 = _mm256_and_si256(q4bitsH, _mm256_set1_epi8(48));
        const __m256i q4h_3 = _mm256_srli_epi16(_mm256_and_si256(q4bitsH, _mm256_set1_epi8(-64)), 2);
        u->q[4 * j + 0] = _mm256_or_si256(_mm256_and_si256(q4bits1, m15), q4h_0);
        u->q[4 * j + 1] = _mm256_or_si256(_mm256_and_si256(q4bits2, m15), q4h_1);
        u->q[4 * j + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits1, 4), m15), q4h_2);
        u->q[4 * j + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits2, 4), m15), q4h_3);
    }
    const __m128i scales = _mm_loadu_si128((const __m128i *)x->scales);
    for (int k = 0; k < 8; ++k)
        u->sc[k] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, k6_shuffle(k)));
    u->scales16 = _mm256_cvtepi8_epi16(scales);
    u->d = _cvtsh_ss(x->d);
}

static inline __attribute__((always_inline)) void q6k_dot(const q6k_unpacked *u,
                                                          const block_q8_K *y, __m256 *acc) {
    const float d = y->d * u->d;
    const __m256i q8sums = _mm256_loadu_si256((const __m256i *)y->bsums);
    const __m256i q8sclsub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, u->scales16), 5);
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < QK_K / 128; ++j) {
        __m256i p[4];
        for (int k = 0; k < 4; ++k)
            p[k] = _mm256_madd_epi16(u->sc[4 * j + k], _mm256_maddubs_epi16(
                u->q[4 * j + k], _mm256_loadu_si256((const __m256i *)(y->qs + 128 * j + 32 * k))));
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[0], p[1]));
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[2], p[3]));
    }
    sumi = _mm256_sub_epi32(sumi, q8sclsub);
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), *acc);
}

static inline __attribute__((always_inline)) void q6k_rows_x_cols(
        const char *w, size_t row_bytes, int64_t r0, int64_t r1, int nb, const block_q8_K *y,
        int c0, int nc, float **out) {
    for (int64_t r = r0; r < r1; ++r) {
        const block_q6_K *x = (const block_q6_K *)(w + r * row_bytes);
        __m256 acc[8];
        for (int j = 0; j < nc; ++j) acc[j] = _mm256_setzero_ps();
        for (int b = 0; b < nb; ++b) {
            q6k_unpacked u;
            q6k_unpack(x + b, &u);
            for (int j = 0; j < nc; ++j) q6k_dot(&u, y + (int64_t)(c0 + j) * nb + b, &acc[j]);
        }
        for (int j = 0; j < nc; ++j) out[c0 + j][r] = lanes_sum(acc[j]);
    }
}

/* Column memory: the k quantized columns (nb blocks each), and in the AVX-512 variant
 * their pairs (below). */
typedef struct {
    int k, nb;
    block_q8_K *y;  /* column c's blocks at y + c * nb */
    char *pairs;    /* NULL in the AVX2 variant */
} kcols_t;

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
/* The AVX-512 variant: a 512-bit register holds two columns' accumulators, one a half,
 * each taking exactly the AVX2 operations above in the same order (maddubs, madd, the
 * int32 adds, cvt, the float products and fused adds work within their lanes), so every
 * value is the same. Columns are prepared in pairs, per super-block KPAIR_BYTES: the two
 * columns' bytes interleaved by 32 (8 x 64), their bsums (64), their Q4_K bsum pair sums
 * (32), their scales 8 times each (64) and minus their scales 4 times each (32, negated
 * by the sign bit: exactly -y.d). An odd last column pairs with zeros, dropped. */
#define KPAIR_BYTES 768
#define KP_QS 0
#define KP_BSUMS 512
#define KP_Q8S 576
#define KP_D 608
#define KP_NEGD 672

static inline int64_t kq_pairs_bytes(int k, int nb) { return (int64_t)((k + 1) / 2) * nb * KPAIR_BYTES; }

static inline void kq_prepare_pairs(const kcols_t *c) {
    static const block_q8_K zero_block;
    for (int p = 0; p < (c->k + 1) / 2; ++p)
        for (int b = 0; b < c->nb; ++b) {
            const block_q8_K *ya = c->y + (int64_t)(2 * p) * c->nb + b;
            const block_q8_K *yb = 2 * p + 1 < c->k ? c->y + (int64_t)(2 * p + 1) * c->nb + b
                                                    : &zero_block;
            char *at = c->pairs + ((int64_t)p * c->nb + b) * KPAIR_BYTES;
            for (int k = 0; k < 8; ++k) {
                memcpy(at + KP_QS + 64 * k, ya->qs + 32 * k, 32);
                memcpy(at + KP_QS + 64 * k + 32, yb->qs + 32 * k, 32);
            }
            memcpy(at + KP_BSUMS, ya->bsums, 32);
            memcpy(at + KP_BSUMS + 32, yb->bsums, 32);
            const __m256i sa = _mm256_loadu_si256((const __m256i *)ya->bsums);
            const __m256i sb = _mm256_loadu_si256((const __m256i *)yb->bsums);
            _mm256_storeu_si256((__m256i *)(at + KP_Q8S), _mm256_hadd_epi16(
                _mm256_permute2x128_si256(sa, sb, 0x20), _mm256_permute2x128_si256(sa, sb, 0x31)));
            _mm256_storeu_ps((float *)(at + KP_D), _mm256_set1_ps(ya->d));
            _mm256_storeu_ps((float *)(at + KP_D + 32), _mm256_set1_ps(yb->d));
            const __m256i sign = _mm256_set1_epi32((int)0x80000000u);
            const __m256 dd = _mm256_setr_m128(_mm_set1_ps(ya->d), _mm_set1_ps(yb->d));
            _mm256_storeu_si256((__m256i *)(at + KP_NEGD),
                                _mm256_xor_si256(_mm256_castps_si256(dd), sign));
        }
}

static inline __m512i both(__m256i v) { return _mm512_broadcast_i64x4(v); }

static inline __attribute__((always_inline)) void q4k_rows_x_pairs(
        const char *w, size_t row_bytes, int64_t r0, int64_t r1, const kcols_t *c, int p0,
        int np, float **out) {
    const int nb = c->nb;
    for (int64_t r = r0; r < r1; ++r) {
        const block_q4_K *x = (const block_q4_K *)(w + r * row_bytes);
        __m512 acc[8];
        __m256 acc_m[8];
        for (int j = 0; j < np; ++j) { acc[j] = _mm512_setzero_ps(); acc_m[j] = _mm256_setzero_ps(); }
        for (int b = 0; b < nb; ++b) {
            q4k_unpacked u;
            q4k_unpack(x + b, &u);
            __m512i q2[8], sc2[8];
            for (int i = 0; i < 8; ++i) { q2[i] = both(u.q[i]); sc2[i] = both(u.sc[i]); }
            const __m256i mins2 = _mm256_set_m128i(u.mins, u.mins);
            const __m512 xd = _mm512_set1_ps(u.d);
            const __m256 xdmin = _mm256_set1_ps(u.dmin);
            for (int j = 0; j < np; ++j) {
                const char *at = c->pairs + ((int64_t)(p0 + j) * nb + b) * KPAIR_BYTES;
                const __m512 d = _mm512_mul_ps(_mm512_loadu_ps((const float *)(at + KP_D)), xd);
                const __m256 dmin = _mm256_mul_ps(_mm256_loadu_ps((const float *)(at + KP_NEGD)), xdmin);
                const __m256i prod = _mm256_madd_epi16(mins2, _mm256_loadu_si256((const __m256i *)(at + KP_Q8S)));
                acc_m[j] = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(prod), acc_m[j]);
                __m512i sumi = _mm512_setzero_si512();
                for (int i = 0; i < 4; ++i) {
                    const __m512i l = _mm512_madd_epi16(sc2[2 * i], _mm512_maddubs_epi16(
                        q2[2 * i], _mm512_loadu_si512(at + KP_QS + 128 * i)));
                    const __m512i h = _mm512_madd_epi16(sc2[2 * i + 1], _mm512_maddubs_epi16(
                        q2[2 * i + 1], _mm512_loadu_si512(at + KP_QS + 128 * i + 64)));
                    sumi = _mm512_add_epi32(sumi, _mm512_add_epi32(l, h));
                }
                acc[j] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc[j]);
            }
        }
        for (int j = 0; j < np; ++j) {
            const int col = 2 * (p0 + j);
            out[col][r] = q4k_result(_mm512_castps512_ps256(acc[j]), _mm256_castps256_ps128(acc_m[j]));
            if (col + 1 < c->k)
                out[col + 1][r] = q4k_result(upper_half(acc[j]), _mm256_extractf128_ps(acc_m[j], 1));
        }
    }
}

static inline __attribute__((always_inline)) void q6k_rows_x_pairs(
        const char *w, size_t row_bytes, int64_t r0, int64_t r1, const kcols_t *c, int p0,
        int np, float **out) {
    const int nb = c->nb;
    for (int64_t r = r0; r < r1; ++r) {
        const block_q6_K *x = (const block_q6_K *)(w + r * row_bytes);
        __m512 acc[8];
        for (int j = 0; j < np; ++j) acc[j] = _mm512_setzero_ps();
        for (int b = 0; b < nb; ++b) {
            q6k_unpacked u;
            q6k_unpack(x + b, &u);
            __m512i q2[8], sc2[8];
            for (int i = 0; i < 8; ++i) { q2[i] = both(u.q[i]); sc2[i] = both(u.sc[i]); }
            const __m512i scales16 = both(u.scales16);
            const __m512 xd = _mm512_set1_ps(u.d);
            for (int j = 0; j < np; ++j) {
                const char *at = c->pairs + ((int64_t)(p0 + j) * nb + b) * KPAIR_BYTES;
                const __m512 d = _mm512_mul_ps(_mm512_loadu_ps((const float *)(at + KP_D)), xd);
                const __m512i q8sclsub = _mm512_slli_epi32(_mm512_madd_epi16(
                    _mm512_loadu_si512(at + KP_BSUMS), scales16), 5);
                __m512i sumi = _mm512_setzero_si512();
                for (int h = 0; h < 2; ++h) {
                    __m512i p[4];
                    for (int k = 0; k < 4; ++k)
                        p[k] = _mm512_madd_epi16(sc2[4 * h + k], _mm512_maddubs_epi16(
                            q2[4 * h + k], _mm512_loadu_si512(at + KP_QS + 64 * (4 * h + k))));
                    sumi = _mm512_add_epi32(sumi, _mm512_add_epi32(p[0], p[1]));
                    sumi = _mm512_add_epi32(sumi, _mm512_add_epi32(p[2], p[3]));
                }
                sumi = _mm512_sub_epi32(sumi, q8sclsub);
                acc[j] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc[j]);
            }
        }
        for (int j = 0; j < np; ++j) store_pair_sums(out, NULL, 2 * (p0 + j), c->k, r, acc[j]);
    }
}

/* A chunk of n (a constant in each case, so each is its own inlined copy) pairs. */
#define NGS_KQ_CHUNKS(F) \
    switch (n) { \
    case 8: F(w, row_bytes, r0, r1, c, p0, 8, out); break; \
    case 4: F(w, row_bytes, r0, r1, c, p0, 4, out); break; \
    case 2: F(w, row_bytes, r0, r1, c, p0, 2, out); break; \
    default: F(w, row_bytes, r0, r1, c, p0, 1, out); break; \
    }
/* Rows [r0, r1) of a Q4_K (q6 = 0) or Q6_K (q6 = 1) matrix against all k columns: 8
 * pairs at a time, then 4, 2, 1. */
static inline void kq_rows_x_all_cols(int q6, const char *w, size_t row_bytes, int64_t r0,
                                      int64_t r1, const kcols_t *c, float **out) {
    const int n_pairs = (c->k + 1) / 2;
    for (int p0 = 0, n = 0; p0 < n_pairs; p0 += n) {
        n = n_pairs - p0 >= 8 ? 8 : n_pairs - p0 >= 4 ? 4 : n_pairs - p0 >= 2 ? 2 : 1;
        if (q6) { NGS_KQ_CHUNKS(q6k_rows_x_pairs) } else { NGS_KQ_CHUNKS(q4k_rows_x_pairs) }
    }
}
#else
static inline int64_t kq_pairs_bytes(int k, int nb) { (void)k; (void)nb; return 0; }
static inline void kq_prepare_pairs(const kcols_t *c) { (void)c; }

/* A chunk of n (a constant in each case, so each is its own inlined copy) columns. */
#define NGS_KQ_CHUNKS(F) \
    switch (n) { \
    case 8: F(w, row_bytes, r0, r1, c->nb, c->y, c0, 8, out); break; \
    case 4: F(w, row_bytes, r0, r1, c->nb, c->y, c0, 4, out); break; \
    case 3: F(w, row_bytes, r0, r1, c->nb, c->y, c0, 3, out); break; \
    case 2: F(w, row_bytes, r0, r1, c->nb, c->y, c0, 2, out); break; \
    default: F(w, row_bytes, r0, r1, c->nb, c->y, c0, 1, out); break; \
    }
/* Rows [r0, r1) of a Q4_K (q6 = 0) or Q6_K (q6 = 1) matrix against all k columns: 8 at
 * a time (their blocks stay in L1 while the rows stream), then 4, then the rest. */
static inline void kq_rows_x_all_cols(int q6, const char *w, size_t row_bytes, int64_t r0,
                                      int64_t r1, const kcols_t *c, float **out) {
    const int k = c->k;
    for (int c0 = 0, n = 0; c0 < k; c0 += n) {
        n = k - c0 >= 8 ? 8 : k - c0 >= 4 ? 4 : k - c0;
        if (q6) { NGS_KQ_CHUNKS(q6k_rows_x_cols) } else { NGS_KQ_CHUNKS(q4k_rows_x_cols) }
    }
}
#endif
#undef NGS_KQ_CHUNKS
#endif
