/* The output layer of a Q8_0 model computed outside llama.cpp, row for row what
 * llama.cpp computes (ngramspec/own_head.py; docs/exactness.md, "The output layer").
 *
 * Invariant: every logit equals, bit for bit, ggml's x86 AVX2 vec_dot_q8_0_q8_0 of the
 * weight row and the Q8_0-quantized activation (and so llamafile's tinyBLAS row, which
 * rounds the same way): the arithmetic of q8_dot.h. Only the loop around it differs:
 * each weight row is read once for all k columns (8 or 4 at a time from L1), one pass
 * over the matrix. own_head.py checks the identity against llama.cpp's rows before it
 * is ever used.
 */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "q8_dot.h"

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
    quantize_cols(from_float, (const char *)h, h_stride * (int64_t)sizeof(float), which, k, n_embd,
                  y, yd);
    const block_q8 *wb = (const block_q8 *)w;
#pragma omp parallel for schedule(static) num_threads(nth)
    for (int64_t r0 = 0; r0 < n_rows; r0 += 16)  /* 16 weight rows stay in L1 for all columns */
        rows_x_all_cols(wb, r0, r0 + 16 < n_rows ? r0 + 16 : n_rows, nb, y, yd, k, out);
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
