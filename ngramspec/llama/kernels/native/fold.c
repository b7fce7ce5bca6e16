/* A run of plain greedy generation steps in one call (ngramspec/engine/fold.py): per step,
 * one row per sequence (its last sampled token at its next position, a logit row), one
 * llama_decode, llama_synchronize, each row's argmax taken from llama.cpp's logits, or
 * from our output layer's kernel where the engine's decode would take it (q8_head.c, with
 * the position check Hook.fill makes), the token appended to the sequence's history.
 * Between steps, a speculating sequence's plan asks its drafters (drafting.c
 * `ngs_propose`: every drafter, or a resting sequence's watcher alone) where the caller's
 * schedule says it would; the run stops before the step whose drafters find a draft (or
 * need Python), after a step that sampled an end-of-generation token, after max_steps
 * steps, once max_ns nanoseconds have passed, or at a failed decode.
 *
 * Why in C: a step made from Python pays ~4 us to enter a C call, ~10 to come back and
 * runs its glue on caches the decode has cooled (~75-115 us of host a step measured on 2
 * cores); here the host part of a step is the batch rows, the argmax and the clock reads
 * (~6 us at 1 slot).
 *
 * Invariants: the argmax is numpy's (the first greatest value, or the first NaN);
 * every step's batch holds exactly the rows the engine's own step would (Engine.step:
 * [sampled] at n_hist, ascending sequence ids); nothing here allocates. Plain C: the
 * argmax's wide lanes are chosen at run time by the CPU's flags (x86-64 only). */
#include <stddef.h>
#include <stdint.h>
#include <time.h>

typedef struct {  /* llama.h's llama_batch (fold.py checks the field offsets) */
    int32_t n_tokens;
    int32_t *token;
    float *embd;
    int32_t *pos;
    int32_t *n_seq_id;
    int32_t **seq_id;
    int8_t *logits;
} ngs_batch;

typedef int32_t (*ngs_decode_fn)(void *ctx, ngs_batch batch);
typedef void (*ngs_sync_fn)(void *ctx);
typedef float *(*ngs_row_fn)(void *ctx, int32_t i);
typedef int (*ngs_head_fn)(const void *w, int64_t n_vocab, int64_t n_embd, const float *rows,
                           int64_t stride, const int32_t *which, int k, float **out, int nth,
                           const void *from_float, int64_t *argmax);
typedef int (*ngs_propose_fn)(uint64_t *table, int shift, int64_t resets, const int32_t *hist,
                              int64_t L, int32_t last, int max_len, int min_len, int first_only,
                              int n_d, int from, const int64_t *params, uint64_t *const *states,
                              int32_t *out, int out_stride, int32_t *lens, int64_t *starts,
                              int64_t *filled);

/* The run's shared arguments; n_steps and why are written back. */
typedef struct {
    void *ctx;
    ngs_decode_fn decode;
    ngs_sync_fn sync;
    ngs_row_fn row;
    ngs_batch *batch;
    const uint8_t *eog;     /* per token id: 1 = ends generation */
    ngs_propose_fn propose; /* NULL: no sequence looks */
    uint64_t *table;        /* the hash pool (HashPool._ptr, _shift, resets) */
    int64_t resets;
    int64_t max_ns;
    int32_t shift;
    int32_t n_vocab;
    int32_t n_seqs;
    int32_t max_steps;
    int32_t n_steps;        /* out: steps made */
    int32_t why;            /* out: NGS_FOLD_* */
    int32_t rc;             /* out: llama_decode's code where why is NGS_FOLD_FAILED */
    int32_t pad_;
    /* our output layer (llama/kernels/head.py; head NULL: llama.cpp's rows): the decode is
     * armed (its graph ends at result_norm, the eval callback keeping each row and its
     * position in the hook), then q8_head.c's kernel takes each kept row's argmax */
    ngs_head_fn head;
    const void *head_w;     /* the output weight (Q8_0), head_vocab rows of head_embd */
    const float *head_rows; /* the hook's kept rows */
    const int32_t *head_idx;/* 0 .. n_seqs-1: row j is sequence j's (fold.py checks the order) */
    float **head_out;       /* n_seqs NULLs: no logits written */
    const void *head_ff;    /* ggml's Q8_0 from_float */
    int64_t *head_best;     /* [n_seqs]: the argmaxes */
    int32_t *hook_stop;     /* the hook's fields the decode arms and the rows are checked by */
    int64_t *hook_n_rows;
    int32_t *hook_overflow;
    const int32_t *row_pos;
    int64_t head_vocab;
    int64_t head_embd;
    int32_t head_threads;
    int32_t pad2_;
} ngs_fold;

/* One sequence of the run; sampled, n_hist, the counts and emitted are written. */
typedef struct {
    int32_t *tokens;        /* the history buffer: tokens[n_hist] takes each step's input */
    int32_t *emitted;       /* [max_steps]: the token step s sampled */
    const uint8_t *look;    /* [max_steps]: what step s's plan asks (NGS_LOOK_*; NULL: none) */
    int64_t *look_ns;       /* [max_steps]: the time step s's look took (0: none) */
    const int64_t *params;  /* the chain's drafter rows (NativeChain) */
    uint64_t *const *states;
    int32_t *out;
    int32_t *lens;
    int64_t *starts;
    int64_t *filled;
    int64_t n_hist;
    int32_t seq_id;
    int32_t sampled;
    int32_t room;           /* Engine._room before step 0: step s's is room - s */
    int32_t max_draft;      /* the policy's cap on a draft, within the chain's draft_max */
    int32_t min_len;        /* the chain's draft_min */
    int32_t w;              /* the watcher's index in the chain */
    int32_t n_d;            /* the chain's drafters */
    int32_t first_only;     /* NGS_LOOK_ALL stops at the first draft (llama.cpp's chain) */
    int32_t out_stride;
    int32_t n_watch;        /* out: NGS_LOOK_WATCH calls that found nothing */
    int32_t n_all;          /* out: NGS_LOOK_ALL calls that found nothing */
    int32_t resume;         /* out: the last look's ngs_propose return (-1: none) */
} ngs_fold_seq;

/* A step's plan for one sequence (Speculation.plan): nothing (resting, not watching), the
 * chain's watcher alone (DrafterChain.watch), or every drafter (DrafterChain.propose). */
enum { NGS_LOOK_NONE, NGS_LOOK_WATCH, NGS_LOOK_ALL };

enum { NGS_FOLD_STEPS, NGS_FOLD_EOG, NGS_FOLD_TIME, NGS_FOLD_LOOK, NGS_FOLD_FAILED };
#define NGS_FOLD_MAX_SEQS 256  /* sequences of one run: llama.cpp's LLAMA_MAX_SEQ */

static int64_t ngs_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* numpy's argmax of x[0..n) in lanes of BYTES bytes: the first greatest value, or the
 * first NaN. Each lane keeps its own first greatest; lanes merge by value, then index. */
#define NGS_ARGMAX(NAME, BYTES, TARGET)                                                   \
typedef float NAME##_vf __attribute__((vector_size(BYTES)));                              \
typedef int32_t NAME##_vi __attribute__((vector_size(BYTES)));                            \
TARGET static int32_t NAME(const float *x, int32_t n) {                                   \
    enum { W = BYTES / 4 };                                                                \
    int32_t i = 0, k = 0;                                                                  \
    float m = x[0];                                                                        \
    if (n >= 2 * W) {                                                                      \
        NAME##_vf b0, b1;                                                                  \
        NAME##_vi a0, a1, i0, i1, step, nan;                                               \
        for (int l = 0; l < W; ++l) {                                                      \
            b0[l] = b1[l] = x[0]; a0[l] = a1[l] = 0; nan[l] = 0;                           \
            i0[l] = l; i1[l] = W + l; step[l] = 2 * W;                                     \
        }                                                                                  \
        for (; i + 2 * W <= n; i += 2 * W, i0 += step, i1 += step) {                       \
            NAME##_vf v0, v1;                                                              \
            __builtin_memcpy(&v0, x + i, BYTES);                                           \
            __builtin_memcpy(&v1, x + i + W, BYTES);                                       \
            const NAME##_vi g0 = v0 > b0, g1 = v1 > b1;                                    \
            nan |= (v0 != v0) | (v1 != v1);                                                \
            b0 = (NAME##_vf)(((NAME##_vi)v0 & g0) | ((NAME##_vi)b0 & ~g0));                \
            b1 = (NAME##_vf)(((NAME##_vi)v1 & g1) | ((NAME##_vi)b1 & ~g1));                \
            a0 = (i0 & g0) | (a0 & ~g0);                                                   \
            a1 = (i1 & g1) | (a1 & ~g1);                                                   \
        }                                                                                  \
        int any = 0;                                                                       \
        for (int l = 0; l < W; ++l) any |= nan[l];                                         \
        if (any) { for (int32_t j = 0; j < n; ++j) if (x[j] != x[j]) return j; }           \
        for (int l = 0; l < W; ++l) {                                                      \
            if (b0[l] > m || (b0[l] == m && a0[l] < k)) { m = b0[l]; k = a0[l]; }          \
            if (b1[l] > m || (b1[l] == m && a1[l] < k)) { m = b1[l]; k = a1[l]; }          \
        }                                                                                  \
    }                                                                                      \
    for (; i < n; ++i) {                                                                   \
        if (x[i] != x[i]) return i;                                                        \
        if (x[i] > m) { m = x[i]; k = i; }                                                 \
    }                                                                                      \
    return k;                                                                              \
}

NGS_ARGMAX(ngs_argmax16, 16, )
#if defined(__x86_64__) && defined(__GNUC__)
NGS_ARGMAX(ngs_argmax32, 32, __attribute__((target("avx2"))))
NGS_ARGMAX(ngs_argmax64, 64, __attribute__((target("avx512f,avx512bw"))))
#endif

typedef int32_t (*ngs_argmax_fn)(const float *x, int32_t n);

/* The widest argmax this CPU runs (lanes of the vector width its flags allow: narrower
 * lanes emulated by the compiler cost up to 5x). */
static ngs_argmax_fn ngs_argmax_pick(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) return ngs_argmax64;
    if (__builtin_cpu_supports("avx2")) return ngs_argmax32;
#endif
    return ngs_argmax16;
}

/* numpy's argmax of x[0..n) (tests/test_fold.py), with the lanes ngs_fold_steps uses. */
int32_t ngs_fold_argmax(const float *x, int32_t n) { return ngs_argmax_pick()(x, n); }

/* Sequence q's look before step s (q->look[s]), as DrafterChain.watch / propose make it
 * with NativeChain.ask (both call ngs_propose so): q->resume is what ngs_propose returned
 * (-1: no look), the time goes to q->look_ns[s]. Returns 1 where the look found a draft, 2
 * where it needs Python (either way the run stops before step s, and the caller resumes
 * the look from q->resume: NativeChain.preset, so no drafter is asked twice for one
 * step), 0 otherwise. */
static int ngs_fold_look(const ngs_fold *f, ngs_fold_seq *q, int s) {
    const int mode = q->look ? q->look[s] : NGS_LOOK_NONE;
    const int room = q->room - s;
    const int max_len = room < q->max_draft ? room : q->max_draft;
    q->look_ns[s] = 0;
    q->resume = -1;
    if (mode == NGS_LOOK_NONE || room <= 0 || max_len < q->min_len) return 0;
    const int64_t t0 = ngs_now();
    const int lo = mode == NGS_LOOK_WATCH ? q->w : 0;
    const int hi = mode == NGS_LOOK_WATCH ? q->w + 1 : q->n_d;
    const int first = mode == NGS_LOOK_WATCH ? 1 : q->first_only;
    q->resume = f->propose(f->table, f->shift, f->resets, q->tokens, q->n_hist, q->sampled,
                           max_len, q->min_len, first, hi, lo, q->params, q->states, q->out,
                           q->out_stride, q->lens, q->starts, q->filled);
    q->look_ns[s] = ngs_now() - t0;
    if (q->resume < hi) return 2;
    for (int i = lo; i < hi; ++i) if (q->lens[i] >= q->min_len && q->lens[i] > 0) return 1;
    return 0;
}

/* The looks before step s of every sequence, in order: 1 where the run stops there (nothing
 * counted), else each look that was made counted (it found nothing). A look that needs
 * Python ends them: the engine's step drafts that drafter (which may write the shared
 * pool) before it asks the later sequences, so they are asked afresh then. */
static int ngs_fold_looks(const ngs_fold *f, ngs_fold_seq *seqs, int s) {
    int stop = 0;
    for (int j = 0; j < f->n_seqs; ++j) seqs[j].resume = -1;
    for (int j = 0; j < f->n_seqs; ++j) {
        const int r = ngs_fold_look(f, seqs + j, s);
        stop |= r;
        if (r == 2) break;
    }
    if (stop) return 1;
    for (int j = 0; j < f->n_seqs; ++j) {
        ngs_fold_seq *q = seqs + j;
        if (q->resume >= 0) {
            if (q->look[s] == NGS_LOOK_WATCH) q->n_watch += 1; else q->n_all += 1;
        }
    }
    return 0;
}

/* One step's decode: the rows written, decoded (armed where our output layer takes it),
 * synchronized; its compute time (our layer's kernel included, as Context.run_rows
 * counts it). Returns llama_decode's code, or where a row cannot be read: -1 (llama.cpp
 * handed out no row), -2 (our layer kept other rows than one per sequence at its
 * position: Hook.fill's check), -3 (our layer's kernel could not allocate). Each
 * sequence's argmax goes to toks[j]. */
static int32_t ngs_fold_decode(ngs_fold *f, ngs_fold_seq *seqs, ngs_argmax_fn argmax,
                               int32_t *toks, int64_t *compute_ns) {
    ngs_batch *b = f->batch;
    const int n = f->n_seqs;
    for (int j = 0; j < n; ++j) {
        b->token[j] = seqs[j].sampled;
        b->pos[j] = (int32_t)seqs[j].n_hist;
        b->seq_id[j][0] = seqs[j].seq_id;
        b->logits[j] = 1;
    }
    b->n_tokens = n;
    if (f->head) { *f->hook_stop = 1; *f->hook_n_rows = 0; *f->hook_overflow = 0; }
    const int64_t t0 = ngs_now();
    int32_t rc = f->decode(f->ctx, *b);
    if (rc == 0) f->sync(f->ctx);
    if (f->head) {
        *f->hook_stop = 0;
        if (rc == 0 && (*f->hook_overflow || *f->hook_n_rows != n)) rc = -2;
        for (int j = 0; rc == 0 && j < n; ++j) if (f->row_pos[j] != b->pos[j]) rc = -2;
        if (rc == 0 && f->head(f->head_w, f->head_vocab, f->head_embd, f->head_rows,
                               f->head_embd, f->head_idx, n, f->head_out, f->head_threads,
                               f->head_ff, f->head_best) != 0) rc = -3;
        for (int j = 0; rc == 0 && j < n; ++j) toks[j] = (int32_t)f->head_best[j];
    } else if (rc == 0) {
        for (int j = 0; j < n; ++j) if (!f->row(f->ctx, j)) rc = -1;
        for (int j = 0; rc == 0 && j < n; ++j) toks[j] = argmax(f->row(f->ctx, j), f->n_vocab);
    }
    *compute_ns = ngs_now() - t0;
    return rc;
}

/* The run described at the top of the file; `compute_ns[s]`: step s's llama_decode +
 * llama_synchronize. Returns the steps made (also in f->n_steps). */
int ngs_fold_steps(ngs_fold *f, ngs_fold_seq *seqs, int64_t *compute_ns) {
    const ngs_argmax_fn argmax = ngs_argmax_pick();
    int32_t toks[NGS_FOLD_MAX_SEQS];
    if (f->n_seqs > NGS_FOLD_MAX_SEQS) {
        f->why = NGS_FOLD_FAILED;
        f->rc = -1;
        f->n_steps = 0;
        return 0;
    }
    const int64_t start = ngs_now();
    int s = 0;
    f->why = NGS_FOLD_STEPS;
    for (int j = 0; j < f->n_seqs; ++j) {  /* step 0's plan was the caller's */
        seqs[j].look_ns[0] = 0;
        seqs[j].resume = -1;
    }
    for (; s < f->max_steps; ++s) {
        int stop = s > 0 && f->propose && ngs_fold_looks(f, seqs, s);
        if (stop) { f->why = NGS_FOLD_LOOK; break; }
        f->rc = ngs_fold_decode(f, seqs, argmax, toks, compute_ns + s);
        if (f->rc != 0) { f->why = NGS_FOLD_FAILED; break; }  /* the caller drops this step's KV */
        for (int j = 0; j < f->n_seqs; ++j) {
            ngs_fold_seq *q = seqs + j;
            const int32_t tok = toks[j];
            q->tokens[q->n_hist++] = q->sampled;
            q->sampled = tok;
            q->emitted[s] = tok;
            stop |= tok >= 0 && tok < f->n_vocab && f->eog[tok];
        }
        if (stop) { f->why = NGS_FOLD_EOG; ++s; break; }
        if (ngs_now() - start >= f->max_ns) { f->why = NGS_FOLD_TIME; ++s; break; }
    }
    f->n_steps = s;
    return s;
}

/* The layout fold.py's ctypes mirrors must have: sizes and the last fields' offsets. */
void ngs_fold_layout(int64_t *out) {
    out[0] = (int64_t)sizeof(ngs_fold);
    out[1] = (int64_t)offsetof(ngs_fold, head_threads);
    out[2] = (int64_t)sizeof(ngs_fold_seq);
    out[3] = (int64_t)offsetof(ngs_fold_seq, n_hist);
    out[4] = (int64_t)offsetof(ngs_fold_seq, resume);
}
