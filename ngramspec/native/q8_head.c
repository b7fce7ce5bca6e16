/* The output layer of a Q8_0 model computed outside llama.cpp, row for row what
 * llama.cpp computes (ngramspec/own_head.py; docs/exactness.md, "The output layer").
 *
 * Invariant: every logit equals, bit for bit, ggml's x86 AVX2 vec_dot_q8_0_q8_0 of the
 * weight row and the Q8_0-quantized activation (and so llamafile's tinyBLAS row, which
 * rounds the same way): per 32-element block, the 8 int32 lane sums of the byte
 * products (exact integers), converted to float, times the float product of the two
 * fp16 scales, fused-multiply-added into 8 float lanes in block order, then the lanes
 * summed as ggml's hsum_float_8 does. Only the loop around it differs: each weight row
 * is read once for all k columns (8 or 4 at a time from L1), one pass over the matrix.
 * own_head.py checks the identity against llama.cpp's rows before it is ever used.
 */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lanes.h"

typedef struct { uint16_t d; int8_t qs[32]; } __attribute__((packed)) block_q8;
typedef void (*from_float_t)(const float *, void *, int64_t);


/* Rows [r0, r1) against columns c0 .. c0+nc-1 (nc <= 8, a constant where inlined). */
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

/* logits out[c][0 .. n_rows) of the weight matrix w (n_rows rows of n_embd Q8_0 values)
 * for the k activation rows h + which[c] * h_stride (floats), quantized with ggml's own
 * `from_float` (the CPU backend's Q8_0 quantizer). Runs on nth OpenMP threads. Returns
 * 0, or -1 when memory for the quantized columns cannot be had. */
int ngs_q8_0_head(const void *w, int64_t n_rows, int64_t n_embd, const float *h,
                  int64_t h_stride, const int32_t *which, int k, float **out, int nth,
                  from_float_t from_float) {
    const int nb = (int)(n_embd / 32);
    block_q8 *y = malloc(sizeof(block_q8) * (size_t)nb * (size_t)k);
    float *yd = malloc(sizeof(float) * (size_t)nb * (size_t)k);
    if (!y || !yd) { free(y); free(yd); return -1; }
    for (int c = 0; c < k; ++c) {
        from_float(h + (int64_t)which[c] * h_stride, y + (int64_t)c * nb, n_embd);
        for (int b = 0; b < nb; ++b) yd[(int64_t)c * nb + b] = _cvtsh_ss(y[(int64_t)c * nb + b].d);
    }
    const block_q8 *wb = (const block_q8 *)w;
#pragma omp parallel for schedule(static) num_threads(nth)
    for (int64_t r0 = 0; r0 < n_rows; r0 += 16) {  /* 16 weight rows stay in L1 for all columns */
        const int64_t r1 = r0 + 16 < n_rows ? r0 + 16 : n_rows;
        for (int c0 = 0, n = 0; c0 < k; c0 += n) {  /* 8 columns at a time, then 4, then the rest */
            n = k - c0 >= 8 ? 8 : k - c0 >= 4 ? 4 : k - c0;
            switch (n) {
            case 8: rows_x_cols(wb, r0, r1, nb, y, yd, c0, 8, out); break;
            case 4: rows_x_cols(wb, r0, r1, nb, y, yd, c0, 4, out); break;
            case 3: rows_x_cols(wb, r0, r1, nb, y, yd, c0, 3, out); break;
            case 2: rows_x_cols(wb, r0, r1, nb, y, yd, c0, 2, out); break;
            default: rows_x_cols(wb, r0, r1, nb, y, yd, c0, 1, out); break;
            }
        }
    }
    free(y);
    free(yd);
    return 0;
}

/* What the eval callback shares with Python (own_head.Hook mirrors it field by field). */
typedef struct {
    int64_t name_off, data_off, ne_off, op_off, src_off; /* fields of struct ggml_tensor */
    int32_t op_mul_mat;
    int32_t stop;          /* end the graph after result_norm in this decode */
    float *rows;           /* result_norm rows, appended ubatch after ubatch */
    int64_t cap;           /* floats `rows` holds */
    int64_t n_rows;        /* rows appended in this decode */
    int32_t overflow;
    const void *norm;      /* the result_norm tensor of the graph being asked */
    const void *head;      /* the output layer's weight tensor (found once) */
    int32_t head_is_output; /* the matmul over result_norm is the graph's result_output */
} hook_t;

static inline const void *src_of(const hook_t *u, const void *t, int i) {
    return *(const void *const *)((const char *)t + u->src_off + 8 * i);
}

/* llama.cpp's cb_eval (ggml_backend_sched_eval_callback). Asked about each node: wants
 * result_norm only when stopping; remembers the output matmul's weight. Called with
 * result_norm's values: appends its rows, and ends the graph there when stopping
 * (ggml's scheduler skips the rest of the split; every KV write comes earlier). */
bool ngs_eval_cb(void *t, bool ask, void *user) {
    hook_t *u = (hook_t *)user;
    const char *name = (const char *)t + u->name_off;
    if (ask) {
        if (strcmp(name, "result_norm") == 0) {
            u->norm = t;
            return u->stop != 0;
        }
        if (u->norm && *(const int32_t *)((const char *)t + u->op_off) == u->op_mul_mat
                && src_of(u, t, 1) == u->norm) {
            u->head = src_of(u, t, 0);
            u->head_is_output = strcmp(name, "result_output") == 0;
        }
        return false;
    }
    const int64_t *ne = (const int64_t *)((const char *)t + u->ne_off);
    const float *data = *(const float *const *)((const char *)t + u->data_off);
    const int64_t n = ne[0] * ne[1];
    if (u->n_rows * ne[0] + n > u->cap) {
        u->overflow = 1;
    } else {
        memcpy(u->rows + u->n_rows * ne[0], data, (size_t)n * sizeof(float));
        u->n_rows += ne[1];
    }
    return u->stop == 0;
}
