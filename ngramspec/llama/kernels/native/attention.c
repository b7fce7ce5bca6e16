/* Flash attention of llama.cpp graphs computed outside llama.cpp, with a result per
 * query row that does not depend on what else the batch holds (ngramspec/own_attention.py).
 *
 * llama.cpp's CPU flash attention has three paths (one row at a time, split-KV for a lone
 * row, tiles of 64 rows), each with its own summation order, and converts K from F16 to
 * F32 once per head and per 64-row tile. Here every (query row, head) is computed the
 * same way whatever the batch: its scores are dot products over the head dimension in
 * 8 float lanes, summed in a fixed order; its softmax uses the exact maximum of its
 * visible scores (two passes, no running rescale); the denominator and each output
 * element are sums over the visible cells in ascending cell order. Rows and cells are
 * only *grouped* differently (several rows and heads share one F16->F32 conversion of
 * a K or V tile), which changes no value. A masked cell (-inf) adds an exact zero; the
 * only effect an added zero can have (a -0 turning +0) is removed by adding +0 to every
 * output element, so a row sees exactly the sequence of its visible cells, as
 * llama.cpp's one-row kernel does (rule W keeps those in position order).
 *
 * How a graph uses it: the eval callback (`ngs_attn_cb`) is asked about every node of
 * a graph before ggml computes it; a FLASH_ATTN_EXT node it supports becomes a
 * GGML_OP_CUSTOM node whose function is `ngs_attn_node` (the node's own parameters kept
 * further on in op_params), which ggml then runs on its own threads in the graph's
 * order, no split in the graph. Other nodes are passed to a chained callback (the output
 * layer, own_head.py) when one is set. Whether a node is taken depends on its types and
 * head sizes only (`supported`), never on the batch.
 */
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lanes.h"
#include "node.h"

#define CT 32          /* cells per K/V tile */
#define RB 8           /* query rows per work item */
#define MAX_D 512
#define FEW 4          /* at most this many queries in an item read K and V as F16 directly */
#define F16_NEG_INF 0xFC00

/* What the callback shares with Python (own_attention._AttnHook mirrors it). */
typedef struct {
    node_offsets_t off;    /* of struct ggml_tensor */
    int32_t op_fa, op_custom, type_f32, type_f16;
    int32_t nth;
    int32_t enabled;
    int32_t oom;           /* a node's scratch could not be had: the graph stopped there */
    int64_t n_done;        /* nodes computed here since the counter was reset */
    int64_t n_declined;    /* FLASH_ATTN_EXT nodes left to llama.cpp */
    eval_cb_t next;        /* a chained callback for every other node (or NULL) */
    void *next_user;
    void *work;            /* nth scratch buffers of work_floats floats each (node.h) */
    int64_t work_floats;
} attn_hook_t;

/* The size of the struct above, compared with its ctypes mirror before the library is used. */
int64_t ngs_hook_size(void) { return (int64_t)sizeof(attn_hook_t); }

/* e^x for 8 lanes (x <= 0 here; below -87.3 gives 0): Cody-Waite reduction, degree-6
 * polynomial, |relative error| < 2e-7. A fixed function of x: the same lanes give the
 * same values wherever they sit. */
static inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 r2 = _mm256_mul_ps(r, r);
    p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}

static inline void f16_to_f32(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
}

/* One work item: rows [r0, r1) of stream s, heads [h0, h1) (all of KV head g). */
typedef struct {
    const tview_t *q, *k, *v, *m;
    float scale;
    int64_t s, g, r0, r1, h0, h1;
    char *dst; size_t dst_nb1; int64_t n_head, n_rows;
} item_t;

static const uint16_t *mask_row(const item_t *it, int64_t r, int64_t h) {
    const tview_t *m = it->m;
    return (const uint16_t *)(m->data + r * m->nb[1] + (h % m->ne[2]) * m->nb[2]
                              + (it->s % m->ne[3]) * m->nb[3]);
}

/* One score: the dot product of query x and cell k in 8 lanes (FMAs in dimension
 * order, then the lanes summed), times the scale. scores_tile computes exactly this
 * for every (query, cell), several at a time. */
static inline float score1(const float *x, const float *k, int64_t D, float scale) {
    __m256 a = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(x + d), _mm256_loadu_ps(k + d), a);
    return lanes_sum(a) * scale;
}

/* Scores of nq queries against the nc (<= CT) cells of the tile kf (F32, a row per
 * cell), into sc[q * stride + c]: two queries by four cells at a time (each pair's
 * own accumulator, so every score is score1's), the rest one by one. */
static void scores_tile(const float *const *qp, int nq, const float *kf, int nc, int64_t D,
                        float scale, float *sc, int64_t stride) {
    int q = 0;
    for (; q + 2 <= nq; q += 2) {
        const float *x = qp[q], *y = qp[q + 1];
        int c = 0;
        for (; c + 4 <= nc; c += 4) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
            const float *k0 = kf + (int64_t)c * D, *k1 = k0 + D, *k2 = k1 + D, *k3 = k2 + D;
            for (int64_t d = 0; d < D; d += 8) {
                const __m256 xv = _mm256_loadu_ps(x + d), yv = _mm256_loadu_ps(y + d);
                __m256 kv = _mm256_loadu_ps(k0 + d);
                a0 = _mm256_fmadd_ps(xv, kv, a0); b0 = _mm256_fmadd_ps(yv, kv, b0);
                kv = _mm256_loadu_ps(k1 + d);
                a1 = _mm256_fmadd_ps(xv, kv, a1); b1 = _mm256_fmadd_ps(yv, kv, b1);
                kv = _mm256_loadu_ps(k2 + d);
                a2 = _mm256_fmadd_ps(xv, kv, a2); b2 = _mm256_fmadd_ps(yv, kv, b2);
                kv = _mm256_loadu_ps(k3 + d);
                a3 = _mm256_fmadd_ps(xv, kv, a3); b3 = _mm256_fmadd_ps(yv, kv, b3);
            }
            float *o = sc + (int64_t)q * stride + c, *p = o + stride;
            o[0] = lanes_sum(a0) * scale; o[1] = lanes_sum(a1) * scale;
            o[2] = lanes_sum(a2) * scale; o[3] = lanes_sum(a3) * scale;
            p[0] = lanes_sum(b0) * scale; p[1] = lanes_sum(b1) * scale;
            p[2] = lanes_sum(b2) * scale; p[3] = lanes_sum(b3) * scale;
        }
        for (; c < nc; ++c) {
            sc[(int64_t)q * stride + c] = score1(x, kf + (int64_t)c * D, D, scale);
            sc[(int64_t)(q + 1) * stride + c] = score1(y, kf + (int64_t)c * D, D, scale);
        }
    }
    for (; q < nq; ++q)
        for (int c = 0; c < nc; ++c)
            sc[(int64_t)q * stride + c] = score1(qp[q], kf + (int64_t)c * D, D, scale);
}

/* acc[q][0..D) += sum over the tile's cells c (ascending) of p[q][c] * vf[c][0..D). */
static void pv_tile(const float *p, int64_t stride, int nq, const float *vf, int nc, int64_t D,
                    float *acc) {
    int q = 0;
    for (; q + 2 <= nq; q += 2) {
        float *o0 = acc + (int64_t)q * D, *o1 = o0 + D;
        const float *p0 = p + (int64_t)q * stride, *p1 = p0 + stride;
        for (int64_t d = 0; d < D; d += 32) {
            __m256 x0 = _mm256_loadu_ps(o0 + d), x1 = _mm256_loadu_ps(o0 + d + 8);
            __m256 x2 = _mm256_loadu_ps(o0 + d + 16), x3 = _mm256_loadu_ps(o0 + d + 24);
            __m256 y0 = _mm256_loadu_ps(o1 + d), y1 = _mm256_loadu_ps(o1 + d + 8);
            __m256 y2 = _mm256_loadu_ps(o1 + d + 16), y3 = _mm256_loadu_ps(o1 + d + 24);
            for (int c = 0; c < nc; ++c) {
                const float *vc = vf + (int64_t)c * D + d;
                const __m256 v0 = _mm256_loadu_ps(vc), v1 = _mm256_loadu_ps(vc + 8);
                const __m256 v2 = _mm256_loadu_ps(vc + 16), v3 = _mm256_loadu_ps(vc + 24);
                const __m256 b0 = _mm256_broadcast_ss(p0 + c), b1 = _mm256_broadcast_ss(p1 + c);
                x0 = _mm256_fmadd_ps(b0, v0, x0); x1 = _mm256_fmadd_ps(b0, v1, x1);
                x2 = _mm256_fmadd_ps(b0, v2, x2); x3 = _mm256_fmadd_ps(b0, v3, x3);
                y0 = _mm256_fmadd_ps(b1, v0, y0); y1 = _mm256_fmadd_ps(b1, v1, y1);
                y2 = _mm256_fmadd_ps(b1, v2, y2); y3 = _mm256_fmadd_ps(b1, v3, y3);
            }
            _mm256_storeu_ps(o0 + d, x0); _mm256_storeu_ps(o0 + d + 8, x1);
            _mm256_storeu_ps(o0 + d + 16, x2); _mm256_storeu_ps(o0 + d + 24, x3);
            _mm256_storeu_ps(o1 + d, y0); _mm256_storeu_ps(o1 + d + 8, y1);
            _mm256_storeu_ps(o1 + d + 16, y2); _mm256_storeu_ps(o1 + d + 24, y3);
        }
    }
    for (; q < nq; ++q) {
        float *o0 = acc + (int64_t)q * D;
        const float *p0 = p + (int64_t)q * stride;
        for (int64_t d = 0; d < D; d += 32) {
            __m256 x0 = _mm256_loadu_ps(o0 + d), x1 = _mm256_loadu_ps(o0 + d + 8);
            __m256 x2 = _mm256_loadu_ps(o0 + d + 16), x3 = _mm256_loadu_ps(o0 + d + 24);
            for (int c = 0; c < nc; ++c) {
                const float *vc = vf + (int64_t)c * D + d;
                const __m256 b0 = _mm256_broadcast_ss(p0 + c);
                x0 = _mm256_fmadd_ps(b0, _mm256_loadu_ps(vc), x0);
                x1 = _mm256_fmadd_ps(b0, _mm256_loadu_ps(vc + 8), x1);
                x2 = _mm256_fmadd_ps(b0, _mm256_loadu_ps(vc + 16), x2);
                x3 = _mm256_fmadd_ps(b0, _mm256_loadu_ps(vc + 24), x3);
            }
            _mm256_storeu_ps(o0 + d, x0); _mm256_storeu_ps(o0 + d + 8, x1);
            _mm256_storeu_ps(o0 + d + 16, x2); _mm256_storeu_ps(o0 + d + 24, x3);
        }
    }
}

static void run_item(const item_t *it, float *work) {
    const tview_t *q = it->q, *k = it->k, *v = it->v;
    const int64_t D = k->ne[0], DV = v->ne[0], n_kv = k->ne[1];
    const int nq = (int)((it->r1 - it->r0) * (it->h1 - it->h0));
    const int64_t kh = it->g, ks = it->s / (q->ne[3] / k->ne[3]);
    /* the cells any of the item's queries sees */
    int64_t lo = it->m ? n_kv : 0, hi = it->m ? 0 : n_kv;
    const int64_t h_end = it->m && it->m->ne[2] > 1 ? it->h1 : it->h0 + 1;  /* per-head masks? */
    for (int64_t r = it->r0; it->m && r < it->r1; ++r)
        for (int64_t h = it->h0; h < h_end; ++h) {
            const uint16_t *mr = mask_row(it, r, h);
            int64_t a = 0, b = n_kv;
            while (a < b && mr[a] == F16_NEG_INF) ++a;
            while (b > a && mr[b - 1] == F16_NEG_INF) --b;
            if (a < b) { if (a < lo) lo = a; if (b > hi) hi = b; }
        }
    const int64_t ncell = hi > lo ? hi - lo : 0;
    const int64_t stride = (ncell + 7) & ~7LL;
    float *sc = work, *tile = sc + (int64_t)nq * stride, *acc = tile + (int64_t)CT * (D > DV ? D : DV);
    float *den = acc + (int64_t)nq * DV;
    const float *qp[RB * 64];
    int iq = 0;
    for (int64_t r = it->r0; r < it->r1; ++r)
        for (int64_t h = it->h0; h < it->h1; ++h)
            qp[iq++] = (const float *)(q->data + r * q->nb[1] + h * q->nb[2] + it->s * q->nb[3]);
    /* pass 1: scores (then -inf where masked, plus the mask's value where not); a few
     * queries read K as F16 directly (the same values: the conversion is exact) */
    for (int64_t c = lo; nq <= FEW && c < hi; ++c) {
        const uint16_t *kc = (const uint16_t *)(k->data + c * k->nb[1] + kh * k->nb[2] + ks * k->nb[3]);
        __m256 a[FEW];
        for (int j = 0; j < nq; ++j) a[j] = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d += 8) {
            const __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kc + d)));
            for (int j = 0; j < nq; ++j) a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(qp[j] + d), kv, a[j]);
        }
        for (int j = 0; j < nq; ++j) sc[(int64_t)j * stride + (c - lo)] = lanes_sum(a[j]) * it->scale;
    }
    for (int64_t c0 = lo; nq > FEW && c0 < hi; c0 += CT) {
        const int nc = (int)(hi - c0 < CT ? hi - c0 : CT);
        for (int c = 0; c < nc; ++c)
            f16_to_f32((const uint16_t *)(k->data + (c0 + c) * k->nb[1] + kh * k->nb[2] + ks * k->nb[3]),
                       tile + (int64_t)c * D, D);
        scores_tile(qp, nq, tile, nc, D, it->scale, sc + (c0 - lo), stride);
    }
    iq = 0;
    for (int64_t r = it->r0; r < it->r1; ++r)
        for (int64_t h = it->h0; h < it->h1; ++h, ++iq) {
            float *row = sc + (int64_t)iq * stride;
            float m = -INFINITY;
            const uint16_t *mr = it->m ? mask_row(it, r, h) : NULL;
            for (int64_t c = 0; c < ncell; ++c) {
                if (mr && mr[lo + c] == F16_NEG_INF) { row[c] = -INFINITY; continue; }
                if (mr) row[c] += _cvtsh_ss(mr[lo + c]);
                if (row[c] > m) m = row[c];
            }
            for (int64_t c = ncell; c < stride; ++c) row[c] = -INFINITY;
            /* pass 2: p = e^(s - max), exactly 0 where masked; the denominator in cell order */
            float sum = 0.0f;
            if (m != -INFINITY) {
                const __m256 mv = _mm256_set1_ps(m), ninf = _mm256_set1_ps(-INFINITY);
                for (int64_t c = 0; c < stride; c += 8) {
                    const __m256 s = _mm256_loadu_ps(row + c);
                    const __m256 dead = _mm256_cmp_ps(s, ninf, _CMP_EQ_OQ);
                    _mm256_storeu_ps(row + c, _mm256_andnot_ps(dead, exp8(_mm256_sub_ps(s, mv))));
                }
                for (int64_t c = 0; c < ncell; ++c) sum += row[c];
            } else {
                memset(row, 0, sizeof(float) * (size_t)stride);
            }
            den[iq] = sum;
        }
    /* pass 3: the weighted sum of V, cell by cell in ascending order */
    memset(acc, 0, sizeof(float) * (size_t)nq * (size_t)DV);
    for (int64_t d = 0; nq <= FEW && d < DV; d += 32) {  /* V read as F16 directly */
        for (int j = 0; j < nq; ++j) {
            float *o = acc + (int64_t)j * DV + d;
            const float *pj = sc + (int64_t)j * stride;
            __m256 x0 = _mm256_loadu_ps(o), x1 = _mm256_loadu_ps(o + 8);
            __m256 x2 = _mm256_loadu_ps(o + 16), x3 = _mm256_loadu_ps(o + 24);
            for (int64_t c = lo; c < hi; ++c) {
                const uint16_t *vc = (const uint16_t *)(v->data + c * v->nb[1] + kh * v->nb[2] + ks * v->nb[3]) + d;
                const __m256 b = _mm256_broadcast_ss(pj + (c - lo));
                x0 = _mm256_fmadd_ps(b, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)vc)), x0);
                x1 = _mm256_fmadd_ps(b, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vc + 8))), x1);
                x2 = _mm256_fmadd_ps(b, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vc + 16))), x2);
                x3 = _mm256_fmadd_ps(b, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vc + 24))), x3);
            }
            _mm256_storeu_ps(o, x0); _mm256_storeu_ps(o + 8, x1);
            _mm256_storeu_ps(o + 16, x2); _mm256_storeu_ps(o + 24, x3);
        }
    }
    for (int64_t c0 = lo; nq > FEW && c0 < hi; c0 += CT) {
        const int nc = (int)(hi - c0 < CT ? hi - c0 : CT);
        for (int c = 0; c < nc; ++c)
            f16_to_f32((const uint16_t *)(v->data + (c0 + c) * v->nb[1] + kh * v->nb[2] + ks * v->nb[3]),
                       tile + (int64_t)c * DV, DV);
        pv_tile(sc + (c0 - lo), stride, nq, tile, nc, DV, acc);
    }
    iq = 0;
    for (int64_t r = it->r0; r < it->r1; ++r)
        for (int64_t h = it->h0; h < it->h1; ++h, ++iq) {
            const float inv = den[iq] == 0.0f ? 0.0f : 1.0f / den[iq];
            float *o = (float *)(it->dst + (it->s * it->n_rows * it->n_head + h + r * it->n_head) * it->dst_nb1);
            const __m256 iv = _mm256_set1_ps(inv), zero = _mm256_setzero_ps();
            for (int64_t d = 0; d < DV; d += 8)  /* + 0: a -0 left by added zeros is +0 */
                _mm256_storeu_ps(o + d, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(acc + (int64_t)iq * DV + d), iv), zero));
        }
}

/* The self-test (kernels/attention.py `selftest`), on synthetic data of 8 rows x 4 heads
 * sharing one KV head of 75 F16 cells, a causal mask with holes and one row that sees
 * nothing: every (row, head) computed alone (the F16-direct path), four heads of a row
 * together (the same path at its limit), two rows of heads (the tile path) and all 32
 * together must give the same bits, and those within 2e-5 of a double-precision softmax
 * attention. 0: both hold; 1: a grouping changed a value; 2: the values are wrong;
 * -1: no memory. */
#define ST_D 64
#define ST_N 8
#define ST_H 4
#define ST_KV 75

static float st_rand(uint32_t *x) {
    *x = *x * 1664525u + 1013904223u;
    return (float)((*x >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}

static void st_run(const item_t *base, int64_t r0, int64_t r1, int64_t h0, int64_t h1,
                   float *work) {
    item_t it = *base;
    it.r0 = r0; it.r1 = r1; it.h0 = h0; it.h1 = h1;
    run_item(&it, work);
}

static int st_reference(const float *q, const uint16_t *k, const uint16_t *v,
                        const uint16_t *m, float scale, const float *out) {
    for (int r = 0; r < ST_N; ++r)
        for (int h = 0; h < ST_H; ++h) {
            double sc[ST_KV], mx = -INFINITY, den = 0.0;
            for (int c = 0; c < ST_KV; ++c) {
                if (m[r * ST_KV + c] == F16_NEG_INF) { sc[c] = -INFINITY; continue; }
                double d = 0.0;
                for (int i = 0; i < ST_D; ++i)
                    d += (double)q[(h * ST_N + r) * ST_D + i] * _cvtsh_ss(k[c * ST_D + i]);
                sc[c] = d * scale + _cvtsh_ss(m[r * ST_KV + c]);
                if (sc[c] > mx) mx = sc[c];
            }
            for (int c = 0; c < ST_KV; ++c) den += sc[c] == -INFINITY ? 0.0 : exp(sc[c] - mx);
            const float *o = out + (h + r * ST_H) * ST_D;
            for (int i = 0; i < ST_D; ++i) {
                double y = 0.0;
                for (int c = 0; c < ST_KV && den > 0.0; ++c)
                    if (sc[c] != -INFINITY) y += exp(sc[c] - mx) / den * _cvtsh_ss(v[c * ST_D + i]);
                if (fabs(y - o[i]) > 2e-5) return 2;
            }
        }
    return 0;
}

int ngs_attn_selftest(void) {
    static float q[ST_H * ST_N * ST_D], out[4][ST_N * ST_H * ST_D];
    static uint16_t k[ST_KV * ST_D], v[ST_KV * ST_D], m[ST_N * ST_KV];
    uint32_t x = 12345u;
    for (int i = 0; i < ST_H * ST_N * ST_D; ++i) q[i] = st_rand(&x);
    for (int i = 0; i < ST_KV * ST_D; ++i) k[i] = _cvtss_sh(st_rand(&x), 0);
    for (int i = 0; i < ST_KV * ST_D; ++i) v[i] = _cvtss_sh(st_rand(&x), 0);
    for (int r = 0; r < ST_N; ++r)  /* causal, a hole every 7th cell, row 5 sees nothing */
        for (int c = 0; c < ST_KV; ++c)
            m[r * ST_KV + c] = (c > 60 + r || c % 7 == 3 || r == 5) ? F16_NEG_INF
                               : _cvtss_sh(c % 5 == 0 ? -0.5f : 0.0f, 0);
    tview_t tq = {0, {ST_D, ST_N, ST_H, 1}, {4, ST_D * 4, ST_N * ST_D * 4, ST_H * ST_N * ST_D * 4}, (char *)q};
    tview_t tk = {0, {ST_D, ST_KV, 1, 1}, {2, ST_D * 2, ST_KV * ST_D * 2, ST_KV * ST_D * 2}, (char *)k};
    tview_t tv = tk; tv.data = (char *)v;
    tview_t tm = {0, {ST_KV, ST_N, 1, 1}, {2, ST_KV * 2, ST_N * ST_KV * 2, ST_N * ST_KV * 2}, (char *)m};
    const int64_t need = (int64_t)RB * ST_H * ((ST_KV + 7) & ~7) + CT * ST_D + RB * ST_H * ST_D
                         + RB * ST_H + 64;
    float *work = (float *)malloc(sizeof(float) * (size_t)need);
    if (!work) return -1;
    const float scale = 0.125f;
    for (int g = 0; g < 4; ++g) {
        item_t base = {&tq, &tk, &tv, &tm, scale, 0, 0, 0, ST_N, 0, ST_H,
                       (char *)out[g], ST_D * 4, ST_H, ST_N};
        for (int r = 0; r < ST_N; r += (g == 2 ? 2 : 1))
            for (int h = 0; h < ST_H; h += (g == 0 ? 1 : ST_H)) {
                if (g == 0) st_run(&base, r, r + 1, h, h + 1, work);
                else if (g == 1) st_run(&base, r, r + 1, 0, ST_H, work);
                else if (g == 2) st_run(&base, r, r + 2, 0, ST_H, work);
            }
        if (g == 3) st_run(&base, 0, ST_N, 0, ST_H, work);
    }
    free(work);
    for (int g = 1; g < 4; ++g)
        if (memcmp(out[0], out[g], sizeof out[0])) return 1;
    return st_reference(q, k, v, m, scale, out[0]);
}

void ngs_attn_node(void *t, int ith, int nth, void *user);

static bool supported(const attn_hook_t *u, const void *t) {
    const void *qt = src_of(&u->off, t, 0), *kt = src_of(&u->off, t, 1), *vt = src_of(&u->off, t, 2);
    const void *mt = src_of(&u->off, t, 3), *st = src_of(&u->off, t, 4);
    if (!qt || !kt || !vt || st) return false;
    const tview_t q = view_of(&u->off, qt), k = view_of(&u->off, kt), v = view_of(&u->off, vt), dst = view_of(&u->off, t);
    float params[3];
    memcpy(params, (const char *)t + u->off.op_params_off, sizeof params);
    if (params[1] != 0.0f || params[2] != 0.0f) return false;  /* ALiBi, soft-capping */
    if (q.type != u->type_f32 || k.type != u->type_f16 || v.type != u->type_f16) return false;
    if (dst.type != u->type_f32 || dst.nb[0] != 4 || dst.nb[1] != (size_t)v.ne[0] * 4) return false;
    if (q.nb[0] != 4 || k.nb[0] != 2 || v.nb[0] != 2) return false;
    if (q.ne[0] != k.ne[0] || k.ne[0] % 32 || v.ne[0] % 32 || k.ne[0] > MAX_D || v.ne[0] > MAX_D)
        return false;
    if (k.ne[1] != v.ne[1] || k.ne[2] != v.ne[2] || k.ne[3] != v.ne[3]) return false;
    if (q.ne[2] % k.ne[2] || q.ne[3] % k.ne[3] || q.ne[2] / k.ne[2] > 64) return false;
    if (dst.ne[1] != q.ne[2] || dst.ne[2] != q.ne[1]) return false;
    if (mt) {
        const tview_t m = view_of(&u->off, mt);
        if (m.type != u->type_f16 || m.nb[0] != 2 || m.ne[0] < k.ne[1] || m.ne[1] < q.ne[1])
            return false;
    }
    return true;
}

/* Floats of scratch one thread needs for node t. */
static int64_t work_needed(const attn_hook_t *u, const void *t) {
    const tview_t q = view_of(&u->off, src_of(&u->off, t, 0)), k = view_of(&u->off, src_of(&u->off, t, 1));
    const tview_t v = view_of(&u->off, src_of(&u->off, t, 2));
    const int64_t G = q.ne[2] / k.ne[2], D = k.ne[0] > v.ne[0] ? k.ne[0] : v.ne[0];
    return (int64_t)RB * G * ((k.ne[1] + 7) & ~7LL) + CT * D + RB * G * v.ne[0] + RB * G + 64;
}

/* Scratch for node t, grown before the node is taken over (false: none to be had). */
static bool reserve(attn_hook_t *u, const void *t) {
    return grow_scratch(&u->work, &u->work_floats, work_needed(u, t), sizeof(float), u->nth);
}

void ngs_attn_free(attn_hook_t *u) {
    drop_scratch(&u->work, &u->work_floats);
}

/* Thread ith of nth of a taken node: its share of the work items (a row block of a
 * stream's KV head, its heads split in two or four when there are fewer items than
 * threads), each computed whole by one thread. */
void ngs_attn_node(void *t, int ith, int nth, void *user) {
    const attn_hook_t *u = (const attn_hook_t *)user;
    const int n = nth < u->nth ? nth : u->nth;  /* scratch for u->nth threads: more do nothing */
    if (u->oom || ith >= n) return;  /* oom: Python raises after the decode (Hook.check) */
    const void *mt = src_of(&u->off, t, 3);
    tview_t q = view_of(&u->off, src_of(&u->off, t, 0)), k = view_of(&u->off, src_of(&u->off, t, 1));
    tview_t v = view_of(&u->off, src_of(&u->off, t, 2)), dst = view_of(&u->off, t), m;
    if (mt) m = view_of(&u->off, mt);
    float scale;
    memcpy(&scale, (const char *)t + u->off.op_params_off + KEPT, sizeof scale);
    const int64_t N = q.ne[1], H = q.ne[2], S = q.ne[3], HKV = k.ne[2], G = H / HKV;
    const int64_t nrb = (N + RB - 1) / RB;
    int64_t split = 1;
    while (S * HKV * nrb * split < n && split < G && G % (split * 2) == 0) split *= 2;
    const int64_t n_items = S * HKV * nrb * split;
    for (int64_t i = ith; i < n_items; i += n) {
        int64_t x = i;
        const int64_t part = x % split; x /= split;
        const int64_t rb = x % nrb; x /= nrb;
        const int64_t g = x % HKV, s = x / HKV;
        item_t it = {&q, &k, &v, mt ? &m : NULL, scale, s, g, rb * RB,
                     (rb + 1) * RB < N ? (rb + 1) * RB : N,
                     g * G + part * (G / split), g * G + (part + 1) * (G / split),
                     dst.data, dst.nb[1], H, N};
        run_item(&it, (float *)u->work + (int64_t)ith * u->work_floats);
    }
}

/* llama.cpp's cb_eval. Asked about each node before it is computed: makes each
 * FLASH_ATTN_EXT node it supports a CUSTOM node of `ngs_attn_node` (a node made so in
 * an earlier decode of a reused graph stays so), reserving its scratch first; with
 * `enabled` off, gives such nodes back to llama.cpp. Never wants a node itself. */
bool ngs_attn_cb(void *t, bool ask, void *user) {
    attn_hook_t *u = (attn_hook_t *)user;
    if (ask) {
        const int32_t op = *op_of(&u->off, t);
        if (op == u->op_fa) {
            if (u->enabled && supported(u, t)) {
                if (!reserve(u, t)) u->oom = 1;  /* taken all the same: never llama.cpp's */
                make_custom(&u->off, t, u->op_custom, ngs_attn_node, u->nth, u);
                u->n_done++;
            } else {
                u->n_declined++;
            }
        } else if (is_custom_of(&u->off, t, u->op_custom, ngs_attn_node, u)) {
            if (!u->enabled) {
                give_back(&u->off, t, u->op_fa);
                u->n_declined++;
            } else {
                if (!reserve(u, t)) u->oom = 1;
                u->n_done++;
            }
        }
    }
    return u->next ? u->next(t, ask, u->next_user) : !ask;
}
