/* Shared by ngramspec's graph-node kernels (attention.c, matmul.c): reading a llama.cpp
 * graph node in place, and turning a node into a GGML_OP_CUSTOM node of ours (and back)
 * from an eval callback, before ggml computes it.
 *
 * ggml keeps a CUSTOM node's function, task count and user data at the start of its
 * op_params (struct ggml_custom_op_params, ggml-impl.h); the node's own first bytes of
 * op_params move to byte KEPT, so giving the node back restores it exactly. ggml calls
 * the function on every thread of the graph's computation (nth of them, whatever the
 * task count); a kernel with scratch for fewer threads leaves the others idle. */
#ifndef NGS_NODE_H
#define NGS_NODE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef bool (*eval_cb_t)(void *, bool, void *);
typedef void (*custom_fn_t)(void *dst, int ith, int nth, void *userdata);
typedef struct { custom_fn_t fun; int n_tasks; void *userdata; } custom_params_t;
#define KEPT 32
#define KEPT_BYTES 24

/* Where this file puts a CUSTOM node's function, task count and user data; the process
 * guard (kernels/guard.py) compares them with where ggml puts them. */
void ngs_custom_offsets(int64_t *out) {
    out[0] = (int64_t)offsetof(custom_params_t, fun);
    out[1] = (int64_t)offsetof(custom_params_t, n_tasks);
    out[2] = (int64_t)offsetof(custom_params_t, userdata);
}

/* Field offsets of struct ggml_tensor (native_lib.tensor_offsets). */
typedef struct {
    int64_t type_off, ne_off, nb_off, op_off, op_params_off, src_off, data_off;
} node_offsets_t;

typedef struct {
    int type; int64_t ne[4]; size_t nb[4]; char *data;
} tview_t;

static inline tview_t view_of(const node_offsets_t *o, const void *t) {
    tview_t v;
    const char *p = (const char *)t;
    v.type = *(const int32_t *)(p + o->type_off);
    memcpy(v.ne, p + o->ne_off, sizeof v.ne);
    memcpy(v.nb, p + o->nb_off, sizeof v.nb);
    v.data = *(char *const *)(p + o->data_off);
    return v;
}

static inline const void *src_of(const node_offsets_t *o, const void *t, int i) {
    return *(const void *const *)((const char *)t + o->src_off + 8 * i);
}

static inline int32_t *op_of(const node_offsets_t *o, void *t) {
    return (int32_t *)((char *)t + o->op_off);
}

/* Node t becomes a CUSTOM node running fun(t, ith, nth, user) on up to nth threads. */
static inline void make_custom(const node_offsets_t *o, void *t, int32_t op_custom,
                               custom_fn_t fun, int nth, void *user) {
    char *params = (char *)t + o->op_params_off;
    memmove(params + KEPT, params, KEPT_BYTES);
    const custom_params_t p = {fun, nth, user};
    memcpy(params, &p, sizeof p);
    *op_of(o, t) = op_custom;
}

/* A node made so by make_custom becomes the op `op` it was, with its own parameters. */
static inline void give_back(const node_offsets_t *o, void *t, int32_t op) {
    char *params = (char *)t + o->op_params_off;
    memmove(params, params + KEPT, KEPT_BYTES);
    *op_of(o, t) = op;
}

/* Whether t is a CUSTOM node that make_custom made with fun and user. */
static inline bool is_custom_of(const node_offsets_t *o, const void *t, int32_t op_custom,
                                custom_fn_t fun, const void *user) {
    custom_params_t p;
    if (*(const int32_t *)((const char *)t + o->op_off) != op_custom) return false;
    memcpy(&p, (const char *)t + o->op_params_off, sizeof p);
    return p.fun == fun && p.userdata == user;
}

/* A kernel's per-thread scratch: nth buffers of *have units (of `unit` bytes) at *work,
 * grown (never shrunk) to `need` units before a node is taken over, 64-byte aligned.
 * false, leaving it as it was, when the memory cannot be had. */
static inline bool grow_scratch(void **work, int64_t *have, int64_t need, size_t unit, int nth) {
    if (need <= *have) return true;
    void *w = aligned_alloc(64, ((size_t)need * unit * (size_t)nth + 63) & ~(size_t)63);
    if (!w) return false;
    free(*work);
    *work = w;
    *have = need;
    return true;
}

static inline void drop_scratch(void **work, int64_t *have) {
    free(*work);
    *work = NULL;
    *have = 0;
}
#endif
