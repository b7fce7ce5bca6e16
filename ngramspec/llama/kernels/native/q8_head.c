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
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "q8_dot.h"

/* logits out[c][0 .. n_rows) of the weight matrix w (n_rows rows of n_embd Q8_0 values)
 * for the k activation rows h + which[c] * h_stride (floats), quantized with ggml's own
 * `from_float` (the CPU backend's Q8_0 quantizer); out[c] NULL: column c's logits are
 * not kept. With argmax (not NULL), argmax[c] = numpy's argmax of column c's logits
 * (the first greatest, or the first NaN), found as they are computed. Runs on nth
 * OpenMP threads. Returns 0, or -1 when memory for the quantized columns cannot be had. */
int ngs_q8_0_head(const void *w, int64_t n_rows, int64_t n_embd, const float *h,
                  int64_t h_stride, const int32_t *which, int k, float **out, int nth,
                  from_float_t from_float, int64_t *argmax) {
    const int nb = (int)(n_embd / 32);
    char *mem = aligned_alloc(64, (size_t)cols_bytes(k, nb));
    best_t *best = argmax ? malloc(sizeof(best_t) * (size_t)k * (size_t)nth) : NULL;
    if (!mem || (argmax && !best)) { free(mem); free(best); return -1; }
    for (int64_t i = 0; best && i < (int64_t)k * nth; ++i) best[i] = (best_t){0.0f, -1};
    const cols_t cols = cols_at(mem, k, nb);
    quantize_cols(from_float, (const char *)h, h_stride * (int64_t)sizeof(float), which, &cols);
    const block_q8 *wb = (const block_q8 *)w;
    /* schedule(static): thread t takes the t-th contiguous share of the rows, so taking
     * the threads' argmaxes in thread order keeps numpy's first-occurrence rule */
#pragma omp parallel for schedule(static) num_threads(nth)
    for (int64_t r0 = 0; r0 < n_rows; r0 += 16)  /* 16 weight rows stay in L1 for all columns */
        rows_x_all_cols(wb, r0, r0 + 16 < n_rows ? r0 + 16 : n_rows, &cols, out,
                        best ? best + (int64_t)omp_get_thread_num() * k : NULL);
    for (int c = 0; best && c < k; ++c) {
        best_t b = {0.0f, -1};
        for (int t = 0; t < nth; ++t)
            if (best[(int64_t)t * k + c].i >= 0) best_take(&b, best[(int64_t)t * k + c].v,
                                                           best[(int64_t)t * k + c].i);
        argmax[c] = b.i;
    }
    free(best);
    free(mem);
    return 0;
}

/* What the eval callback shares with Python (head.Hook mirrors it field by field). */
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
    int32_t *row_pos;      /* the position of each appended row (INT32_MIN: not known) */
    int32_t *ub_pos;       /* the positions of the ubatch being asked about (inp_pos) */
    int32_t *ub_out;       /* which of its tokens have rows, in row order (out_ids) */
    int64_t pos_cap;       /* int32s each of row_pos, ub_pos and ub_out holds */
    int64_t n_ub_pos, n_ub_out; /* copied of the graph being asked; -1: none */
} hook_t;

int64_t ngs_hook_size(void) { return (int64_t)sizeof(hook_t); }

static inline const void *src_of(const hook_t *u, const void *t, int i) {
    return *(const void *const *)((const char *)t + u->src_off + 8 * i);
}

/* A graph input read where a node takes it as source 1 (RoPE takes inp_pos, the last
 * layer's GET_ROWS out_ids): copied into `to` at ask time, before any node that could
 * reuse its memory runs (ggml frees an input only after its last reader). */
static void copy_input(const hook_t *u, const void *s, int32_t *to, int64_t *n) {
    const int64_t m = ((const int64_t *)((const char *)s + u->ne_off))[0];
    const int32_t *data = *(const int32_t *const *)((const char *)s + u->data_off);
    if (!data || m > u->pos_cap) { *n = -1; return; }
    memcpy(to, data, (size_t)m * sizeof(int32_t));
    *n = m;
}

/* Each kept row's position: the ubatch's inp_pos at the row's token (out_ids). */
static void row_positions(hook_t *u, int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        const int64_t tok = u->n_ub_out >= 0 ? (j < u->n_ub_out ? u->ub_out[j] : -1) : j;
        u->row_pos[u->n_rows + j] = tok >= 0 && tok < u->n_ub_pos ? u->ub_pos[tok] : INT32_MIN;
    }
}

/* llama.cpp's cb_eval (ggml_backend_sched_eval_callback). Asked about each node: wants
 * result_norm only when stopping; remembers the output matmul's weight and the ubatch's
 * positions. Called with result_norm's values: appends its rows and their positions, and
 * ends the graph there when stopping (ggml's scheduler skips the rest of the split; every
 * KV write comes earlier). */
bool ngs_eval_cb(void *t, bool ask, void *user) {
    hook_t *u = (hook_t *)user;
    const char *name = (const char *)t + u->name_off;
    if (ask) {
        const void *s1 = src_of(u, t, 1);
        if (s1 && strcmp((const char *)s1 + u->name_off, "inp_pos") == 0)
            copy_input(u, s1, u->ub_pos, &u->n_ub_pos);
        else if (s1 && strcmp((const char *)s1 + u->name_off, "out_ids") == 0)
            copy_input(u, s1, u->ub_out, &u->n_ub_out);
        if (strcmp(name, "result_norm") == 0) {
            u->norm = t;
            return u->stop != 0;
        }
        if (u->norm && *(const int32_t *)((const char *)t + u->op_off) == u->op_mul_mat
                && s1 == u->norm) {
            u->head = src_of(u, t, 0);
            u->head_is_output = strcmp(name, "result_output") == 0;
        }
        return false;
    }
    const int64_t *ne = (const int64_t *)((const char *)t + u->ne_off);
    const float *data = *(const float *const *)((const char *)t + u->data_off);
    const int64_t n = ne[0] * ne[1];
    if (u->n_rows * ne[0] + n > u->cap || u->n_rows + ne[1] > u->pos_cap) {
        u->overflow = 1;
    } else {
        memcpy(u->rows + u->n_rows * ne[0], data, (size_t)n * sizeof(float));
        row_positions(u, ne[1]);
        u->n_rows += ne[1];
    }
    u->n_ub_pos = u->n_ub_out = -1;
    return u->stop == 0;
}
