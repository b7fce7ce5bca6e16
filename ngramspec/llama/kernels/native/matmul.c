/* Matrix products of llama.cpp graphs with Q5_0 weights, computed outside llama.cpp
 * (ngramspec/kernels/matmul.py), every value bit for bit what ggml's CPU backend computes.
 *
 * ggml multiplies a Q5_0 matrix by a batch of columns with llamafile's tinyBLAS (2 or
 * more columns) or vec_dot_q5_0_q8_0 (one), both on the columns quantized to Q8_0, and
 * both reach ~17 GMAC/s a core on this kind of CPU at 16 columns: each 32-value weight
 * block is unpacked from 5 bits for every few columns it meets. A Q5_0 block holds
 * integers -16..15 and a fp16 scale, so it *is* a Q8_0 block once unpacked: here each
 * thread unpacks TR weight rows once into Q8_0 blocks and runs them against every column
 * with the Q8_0 kernel of q8_dot.h. Per (row, column) that is ggml's arithmetic: the
 * same int32 lane sums of the same integers, times the same float product of the two
 * scales, fused into 8 float lanes in block order, summed as hsum_float_8 does
 * (`ngs_mm_selftest` checks it against the vec_dot llama.cpp loaded).
 *
 * How a graph uses it: the eval callback (`ngs_mm_cb`) is asked about every node before
 * ggml computes it; a MUL_MAT node it supports becomes a GGML_OP_CUSTOM node of
 * `ngs_mm_node` (node.h), which ggml runs on its own threads in the graph's order. Each
 * thread quantizes every column itself (no barrier inside a node) and computes its share
 * of the weight rows. Other nodes go to a chained callback (attention.c's).
 */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kquant.h"
#include "node.h"
#include "q8_dot.h"

#define TR 16          /* weight rows unpacked at a time (in L1 with 8 columns) */
#define ALIGN 64

typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } __attribute__((packed)) block_q5_0;
typedef void (*vec_dot_t)(int n, float *s, size_t bs, const void *x, size_t bx,
                          const void *y, size_t by, int nrc);

/* What the callback shares with Python (own_matmul._MatmulHook mirrors it). */
typedef struct {
    node_offsets_t off;    /* of struct ggml_tensor */
    int64_t extra_off;
    int32_t op_mul_mat, op_custom, type_f32, type_q5_0;
    int32_t type_q4_k, type_q6_k;  /* -1: that type stays llama.cpp's */
    int32_t nth;
    int32_t enabled;
    int32_t oom;           /* a node's scratch could not be had: the graph computed nothing there */
    int32_t min_cols;      /* nodes with fewer columns stay llama.cpp's */
    int64_t n_done;        /* nodes computed here since the counter was reset */
    int64_t n_declined;    /* Q5_0 MUL_MAT nodes left to llama.cpp */
    eval_cb_t next;        /* a chained callback for every other node (or NULL) */
    void *next_user;
    from_float_t quantize; /* the CPU backend's Q8_0 quantizer (ggml's mul_mat uses it) */
    from_float_t quantize_k; /* its Q8_K quantizer (the K-quants' columns) */
    void *work;            /* nth scratch buffers of work_bytes each (node.h) */
    int64_t work_bytes;
} mm_hook_t;

/* The size of the struct above, compared with its ctypes mirror before the library is used. */
int64_t ngs_hook_size(void) { return (int64_t)sizeof(mm_hook_t); }

/* A Q5_0 block as the Q8_0 block of the same values: element j < 16 is the low nibble
 * of qs[j], element j + 16 its high nibble, each with bit j (j + 16) of qh as its fifth
 * bit, minus 16. */
static inline void unpack_q5_0(const block_q5_0 *x, block_q8 *out) {
    const __m128i q = _mm_loadu_si128((const __m128i *)x->qs);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4),
                                         _mm_and_si128(q, m4));
    uint32_t qh;
    memcpy(&qh, x->qh, sizeof qh);
    const __m256i spread = _mm256_shuffle_epi8(  /* byte i: byte i / 8 of qh */
        _mm256_set1_epi32((int)qh),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    const __m256i bit = _mm256_set1_epi64x((int64_t)0x8040201008040201ULL);
    const __m256i fifth = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                                           _mm256_set1_epi8(0x10));
    out->d = x->d;
    _mm256_storeu_si256((__m256i *)out->qs,
                        _mm256_sub_epi8(_mm256_or_si256(nib, fifth), _mm256_set1_epi8(16)));
}

static inline int64_t up(int64_t n) { return (n + ALIGN - 1) & ~(int64_t)(ALIGN - 1); }

/* Scratch bytes one thread needs for M columns of K values (kq: against a K-quant). */
static int64_t work_needed(int64_t K, int64_t M, bool kq) {
    if (kq)
        return up(M * (K / QK_K) * (int64_t)sizeof(block_q8_K)) + up(M * (int64_t)sizeof(float *))
               + up(kq_pairs_bytes((int)M, (int)(K / QK_K)));
    const int64_t nb = K / 32;
    return up(cols_bytes((int)M, (int)nb)) + up(TR * nb * (int64_t)sizeof(block_q8)) +
           up(M * (int64_t)sizeof(float *));
}

/* Thread ith of nth: rows [.., ..) of its share of dst[c][r] = row r of w (N rows of K
 * values, row_bytes apart) . column c of x (M columns of K floats, x_stride bytes apart),
 * dst columns dst_stride bytes apart. */
static void mm_compute(const char *w, size_t row_bytes, int64_t N, int64_t K, const char *x,
                       size_t x_stride, int64_t M, char *dst, size_t dst_stride,
                       from_float_t quantize, char *work, int ith, int nth) {
    const int nb = (int)(K / 32);
    const cols_t cols = cols_at(work, (int)M, nb);
    block_q8 *tile = (block_q8 *)(work + up(cols_bytes((int)M, nb)));
    float **out = (float **)((char *)tile + up(TR * nb * (int64_t)sizeof(block_q8)));
    const int64_t n_tiles = (N + TR - 1) / TR;
    const int64_t t0 = n_tiles * ith / nth, t1 = n_tiles * (ith + 1) / nth;
    if (t0 == t1) return;
    quantize_cols(quantize, x, (int64_t)x_stride, NULL, &cols);
    for (int64_t ti = t0; ti < t1; ++ti) {
        const int64_t r0 = ti * TR, r1 = r0 + TR < N ? r0 + TR : N;
        for (int64_t r = r0; r < r1; ++r) {
            const block_q5_0 *row = (const block_q5_0 *)(w + r * row_bytes);
            for (int b = 0; b < nb; ++b) unpack_q5_0(row + b, tile + (r - r0) * nb + b);
        }
        for (int64_t c = 0; c < M; ++c) out[c] = (float *)(dst + c * dst_stride) + r0;
        rows_x_all_cols(tile, 0, r1 - r0, &cols, out, NULL);
    }
}

/* mm_compute for a Q4_K (q6 = 0) or Q6_K (q6 = 1) matrix: each thread quantizes every
 * column to Q8_K itself and computes its share of the rows (kquant.h). */
static void kq_compute(int q6, const char *w, size_t row_bytes, int64_t N, int64_t K,
                       const char *x, size_t x_stride, int64_t M, char *dst, size_t dst_stride,
                       from_float_t quantize_k, char *work, int ith, int nth) {
    const int nb = (int)(K / QK_K);
    kcols_t cols = {(int)M, nb, (block_q8_K *)work, NULL};
    float **out = (float **)(work + up(M * nb * (int64_t)sizeof(block_q8_K)));
    if (kq_pairs_bytes((int)M, nb)) cols.pairs = (char *)out + up(M * (int64_t)sizeof(float *));
    const int64_t r0 = N * ith / nth, r1 = N * (ith + 1) / nth;
    if (r0 == r1) return;
    for (int64_t c = 0; c < M; ++c) {
        quantize_k((const float *)(x + c * x_stride), cols.y + c * nb, K);
        out[c] = (float *)(dst + c * dst_stride);
    }
    kq_prepare_pairs(&cols);
    kq_rows_x_all_cols(q6, w, row_bytes, r0, r1, &cols, out);
}

/* 1: the weight type is one this hook computes (Q5_0, and Q4_K / Q6_K when on). */
static bool ours(const mm_hook_t *u, int type) {
    return type == u->type_q5_0 || (type >= 0 && (type == u->type_q4_k || type == u->type_q6_k));
}

/* Bytes of one row of K values of `type` (0: not ours). */
static size_t row_size(const mm_hook_t *u, int type, int64_t K) {
    if (type == u->type_q5_0) return K % 32 ? 0 : (size_t)(K / 32) * sizeof(block_q5_0);
    if (K % QK_K) return 0;
    if (type == u->type_q4_k) return (size_t)(K / QK_K) * sizeof(block_q4_K);
    if (type == u->type_q6_k) return (size_t)(K / QK_K) * sizeof(block_q6_K);
    return 0;
}

void ngs_mm_node(void *t, int ith, int nth, void *user);

static bool supported(const mm_hook_t *u, const void *t) {
    const void *wt = src_of(&u->off, t, 0), *xt = src_of(&u->off, t, 1);
    if (!wt || !xt || src_of(&u->off, t, 2)) return false;
    const tview_t w = view_of(&u->off, wt), x = view_of(&u->off, xt), d = view_of(&u->off, t);
    if (!ours(u, w.type) || x.type != u->type_f32 || d.type != u->type_f32) return false;
    if (w.type != u->type_q5_0 && !u->quantize_k) return false;
    if (*(void *const *)((const char *)wt + u->extra_off) != NULL) return false;  /* repacked */
    const int64_t K = w.ne[0], N = w.ne[1], M = x.ne[1];
    const size_t rb = row_size(u, w.type, K);
    if (!rb || x.ne[0] != K || d.ne[0] != N || d.ne[1] != M || M < u->min_cols) return false;
    if (w.ne[2] * w.ne[3] * x.ne[2] * x.ne[3] * d.ne[2] * d.ne[3] != 1) return false;
    if (w.nb[1] != rb || (w.type == u->type_q5_0 && w.nb[0] != sizeof(block_q5_0))) return false;
    return x.nb[0] == 4 && d.nb[0] == 4 && w.data && x.data && d.data;
}

/* Scratch for node t, grown before the node is taken over (false: none to be had). */
static bool reserve(mm_hook_t *u, const void *t) {
    const tview_t w = view_of(&u->off, src_of(&u->off, t, 0)), x = view_of(&u->off, src_of(&u->off, t, 1));
    return grow_scratch(&u->work, &u->work_bytes,
                        work_needed(x.ne[0], x.ne[1], w.type != u->type_q5_0), 1, u->nth);
}

void ngs_mm_free(mm_hook_t *u) {
    drop_scratch(&u->work, &u->work_bytes);
}

void ngs_mm_node(void *t, int ith, int nth, void *user) {
    const mm_hook_t *u = (const mm_hook_t *)user;
    const int n = nth < u->nth ? nth : u->nth;  /* scratch for u->nth threads: more do nothing */
    if (u->oom || ith >= n) return;  /* oom: Python raises after the decode (Hook.check) */
    const tview_t w = view_of(&u->off, src_of(&u->off, t, 0));
    const tview_t x = view_of(&u->off, src_of(&u->off, t, 1)), d = view_of(&u->off, t);
    char *work = (char *)u->work + (int64_t)ith * u->work_bytes;
    if (w.type == u->type_q5_0)
        mm_compute(w.data, w.nb[1], w.ne[1], w.ne[0], x.data, x.nb[1], x.ne[1], d.data, d.nb[1],
                   u->quantize, work, ith, n);
    else
        kq_compute(w.type == u->type_q6_k, w.data, w.nb[1], w.ne[1], w.ne[0], x.data, x.nb[1],
                   x.ne[1], d.data, d.nb[1], u->quantize_k, work, ith, n);
}

/* llama.cpp's cb_eval. Asked about each node before it is computed: makes each MUL_MAT
 * node it supports a CUSTOM node of `ngs_mm_node` (a node made so in an earlier decode
 * of a reused graph stays so, while still supported), reserving its scratch first; with
 * `enabled` off, gives such nodes back to llama.cpp. Never wants a node itself. */
bool ngs_mm_cb(void *t, bool ask, void *user) {
    mm_hook_t *u = (mm_hook_t *)user;
    if (ask) {
        const bool mine = is_custom_of(&u->off, t, u->op_custom, ngs_mm_node, u);
        if (mine || *op_of(&u->off, t) == u->op_mul_mat) {
            if (u->enabled && supported(u, t)) {
                if (!reserve(u, t)) u->oom = 1;  /* taken all the same: never llama.cpp's */
                if (!mine) make_custom(&u->off, t, u->op_custom, ngs_mm_node, u->nth, u);
                u->n_done++;
            } else {
                if (mine) give_back(&u->off, t, u->op_mul_mat);
                const tview_t w = view_of(&u->off, src_of(&u->off, t, 0));
                u->n_declined += ours(u, w.type);
            }
        }
    }
    return u->next ? u->next(t, ask, u->next_user) : !ask;
}

/* ---------------------------------------------------------------- self-tests */

static inline uint32_t next_u32(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(*s >> 33);
}

/* A pseudo-random fp16 scale of 2^-12 .. 2^-3 (times `top` / 0.125). */
static inline uint16_t test_scale(uint64_t *s, float top) {
    return _cvtss_sh((float)(next_u32(s) % 1000 + 1) / 1000.0f * top, 0);
}

/* Weights of kind (-1: Q5_0, 0: Q4_K, 1: Q6_K) against M columns of K values (up to +-8,
 * one outlier a column, drawn from s), for 1, 2, 3, 5, 8, 11 of them: ours (mm_compute /
 * kq_compute, two threads) against ggml's `vec_dot` on the columns its `quantize` made.
 * How many values differ in any bit; -1 without memory. */
static int count_differences(int kind, const unsigned char *w, size_t row_bytes, int N, int K,
                             uint64_t *s, from_float_t quantize, vec_dot_t vec_dot) {
    enum { M = 11 };
    static const int widths[] = {1, 2, 3, 5, 8, 11};
    const bool kq = kind >= 0;
    float *x = malloc(sizeof(float) * M * K), *got = malloc(sizeof(float) * M * N);
    void *yq = malloc(kq ? sizeof(block_q8_K) * (K / QK_K) : sizeof(block_q8) * (K / 32));
    char *work = aligned_alloc(ALIGN, (size_t)up(work_needed(K, M, kq)));
    int bad = -1;
    if (!x || !got || !yq || !work) goto done;
    for (int i = 0; i < M * K; ++i) x[i] = ((float)(next_u32(s) % 16001) - 8000.0f) / 1000.0f;
    for (int c = 0; c < M; ++c) x[c * K + (c * 37) % K] = 200.0f + c;
    bad = 0;
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; ++wi) {
        const int m = widths[wi];
        memset(got, 0xFF, sizeof(float) * M * N);
        for (int ith = 0; ith < 2; ++ith) {
            if (kq)
                kq_compute(kind, (const char *)w, row_bytes, N, K, (const char *)x,
                           K * sizeof(float), m, (char *)got, N * sizeof(float), quantize, work,
                           ith, 2);
            else
                mm_compute((const char *)w, row_bytes, N, K, (const char *)x, K * sizeof(float),
                           m, (char *)got, N * sizeof(float), quantize, work, ith, 2);
        }
        for (int c = 0; c < m; ++c) {
            quantize(x + c * K, yq, K);
            for (int r = 0; r < N; ++r) {
                float ref;
                vec_dot(K, &ref, 0, w + (size_t)r * row_bytes, 0, yq, 0, 1);
                bad += memcmp(&ref, got + c * N + r, sizeof ref) != 0;
            }
        }
    }
done:
    free(x); free(got); free(yq); free(work);
    return bad;
}

/* ggml's vec_dot_q5_0_q8_0 (`vec_dot`, of the library llama.cpp loaded) against this
 * kernel on pseudo-random weights and columns: 40 rows of 640 values (scales 2^-12 ..
 * 2^-3) times 1, 2, 3, 5, 8, 11 columns (count_differences). Returns how many of the
 * values differ in any bit; -1 without memory. */
int ngs_mm_selftest(from_float_t quantize, vec_dot_t vec_dot) {
    enum { N = 40, K = 640, NB = K / 32 };
    block_q5_0 *w = malloc(sizeof(block_q5_0) * N * NB);
    if (!w) return -1;
    uint64_t s = 0x9E3779B97F4A7C15ULL;
    for (int i = 0; i < N * NB; ++i) {
        unsigned char *p = (unsigned char *)&w[i];
        for (size_t j = 0; j < sizeof(block_q5_0); ++j) p[j] = (unsigned char)next_u32(&s);
        w[i].d = test_scale(&s, 0.125f);
    }
    const int bad = count_differences(-1, (const unsigned char *)w, NB * sizeof(block_q5_0), N,
                                      K, &s, quantize, vec_dot);
    free(w);
    return bad;
}

/* The K-quant counterpart: ggml's vec_dot of Q6_K (q6) or Q4_K (`vec_dot` of the library
 * llama.cpp loaded, on columns its Q8_K `quantize` made) against kq_compute on
 * pseudo-random super-blocks: 24 rows of 512 values (count_differences). */
int ngs_mm_selftest_k(int q6, from_float_t quantize, vec_dot_t vec_dot) {
    enum { N = 24, K = 512, NB = K / QK_K };
    const size_t bsz = q6 ? sizeof(block_q6_K) : sizeof(block_q4_K);
    unsigned char *w = malloc(bsz * N * NB);
    if (!w) return -1;
    uint64_t s = 0xD1B54A32D192ED03ULL;
    for (size_t i = 0; i < bsz * N * NB; ++i) w[i] = (unsigned char)next_u32(&s);
    for (int i = 0; i < N * NB; ++i) {  /* sane fp16 scales: 2^-12 .. 2^-3 */
        const uint16_t d = test_scale(&s, 0.125f), dm = test_scale(&s, 0.0625f);
        if (q6) {
            memcpy(w + i * bsz + offsetof(block_q6_K, d), &d, 2);
        } else {
            memcpy(w + i * bsz + offsetof(block_q4_K, d), &d, 2);
            memcpy(w + i * bsz + offsetof(block_q4_K, dmin), &dm, 2);
        }
    }
    const int bad = count_differences(q6, w, NB * bsz, N, K, &s, quantize, vec_dot);
    free(w);
    return bad;
}
