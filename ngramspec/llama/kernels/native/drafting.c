/* The drafters' hot loops on the shared hash pool (ngramspec/speculative/pool.py), in C,
 * the decode layouts the planner prices (`ngs_layout_features`), the expected tokens of
 * acceptance statistics (`ngs_expected`) and the planner's search (`ngs_ascend`).
 *
 * Invariant: every function computes exactly what its Python reference computes (pool.py,
 * ubatch.py, acceptance.py, planner.py; tests/test_native_drafting.py and test_planner.py
 * compare them on random inputs): the n-gram hash of hashing.py (h = h * P + t, modulo
 * 2**64), the slot and tag of HashPool.locate, a slot written as (tag << 32) | value; the
 * floating-point operations in the reference's order, without fused multiply-adds. Plain
 * C, no instruction-set extension: it is compiled as the "generic" variant and runs on any
 * CPU the compiler targets.
 */
#include <stdint.h>

#define NGS_P 6364136223846793005ULL
#define NGS_GOLD 0x9E3779B97F4A7C15ULL
#define NGS_LOW32 0xFFFFFFFFULL
#define NGS_MAX_DRAFT 64  /* positions AcceptanceStats keeps (cost.MAX_DRAFT) */

static inline uint64_t ngs_mix(uint64_t h, uint64_t salt) { return (h ^ salt) * NGS_GOLD; }
static inline uint64_t ngs_tag(uint64_t x) { return ((x >> 8) & NGS_LOW32) | 1ULL; }

/* The value stored for key hash h in namespace salt, or -1. */
static inline int64_t ngs_get(const uint64_t *table, int shift, uint64_t h, uint64_t salt) {
    const uint64_t x = ngs_mix(h, salt);
    const uint64_t e = table[x >> shift];
    return (e >> 32) == ngs_tag(x) ? (int64_t)(e & NGS_LOW32) : -1;
}

/* Token i of the key window hist[L-n+1 .. L) + [last]. */
static inline uint64_t ngs_key_token(const int32_t *hist, int64_t L, int32_t last, int n, int i) {
    return (uint64_t)(int64_t)(i < n - 1 ? hist[L - n + 1 + i] : last);
}

/* P**(n-1) modulo 2**64: the weight of a window's oldest token (hashing.power). */
static inline uint64_t ngs_power(int n) {
    uint64_t p = 1;
    for (int i = 1; i < n; ++i) p *= NGS_P;
    return p;
}

static uint64_t ngs_key_hash(const int32_t *hist, int64_t L, int32_t last, int n) {
    uint64_t h = 0;
    for (int i = 0; i < n; ++i) h = h * NGS_P + ngs_key_token(hist, L, last, n, i);
    return h;
}

/* HashPool.put_ngrams: window j = tokens[j .. j+n) for j < count gets values[j] (values
 * NULL: value0 + j); with `first`, a slot that already holds the same key keeps its
 * value. Returns how many empty slots it filled (HashPool.used grows by that). */
int64_t ngs_put_ngrams(uint64_t *table, int shift, uint64_t salt, const int32_t *tokens,
                       int64_t count, int n, const int32_t *values, int64_t value0, int first) {
    if (count <= 0) return 0;
    const uint64_t p_old = ngs_power(n);
    uint64_t h = 0;
    for (int i = 0; i < n; ++i) h = h * NGS_P + (uint64_t)(int64_t)tokens[i];
    int64_t filled = 0;
    for (int64_t j = 0; j < count; ++j) {
        if (j) h = (h - (uint64_t)(int64_t)tokens[j - 1] * p_old) * NGS_P
                   + (uint64_t)(int64_t)tokens[j + n - 1];
        const uint64_t x = ngs_mix(h, salt), tag = ngs_tag(x);
        uint64_t *slot = &table[x >> shift];
        if (*slot == 0) ++filled;
        else if (first && (*slot >> 32) == tag) continue;
        const uint64_t v = values ? (uint64_t)(uint32_t)values[j] : (uint64_t)(value0 + j);
        *slot = (tag << 32) | (v & NGS_LOW32);
    }
    return filled;
}

/* ngram-mod's draft (HashPool.follow): from the key hist[L-n+1 .. L) + [last], up to
 * max_n tokens, each the value stored for the current window, the window rolling on by
 * it; stops at the first window the pool does not hold. Returns the count, in out. */
int ngs_follow(const uint64_t *table, int shift, uint64_t salt, const int32_t *hist, int64_t L,
               int32_t last, int n, int max_n, int32_t *out) {
    if (L < n - 1 || n < 1) return 0;
    const uint64_t p_old = ngs_power(n);
    uint64_t h = ngs_key_hash(hist, L, last, n);
    int k = 0;
    for (; k < max_n; ++k) {
        const int64_t v = ngs_get(table, shift, h, salt);
        if (v < 0) break;
        out[k] = (int32_t)v;
        const uint64_t gone = k < n ? ngs_key_token(hist, L, last, n, k) : (uint64_t)(int64_t)out[k - n];
        h = (h - gone * p_old) * NGS_P + (uint64_t)v;
    }
    return k;
}

/* The position index's lookup (SeqIndex.find + matches_at): the position stored for the
 * key hist[L-n+1 .. L) + [last] if the n tokens there equal the key, else -1; the key's
 * hash into *hash_out. */
int64_t ngs_find(const uint64_t *table, int shift, uint64_t salt, const int32_t *hist, int64_t L,
                 int32_t last, int n, uint64_t *hash_out) {
    if (L < n - 1 || n < 1) { *hash_out = 0; return -1; }
    const uint64_t h = ngs_key_hash(hist, L, last, n);
    *hash_out = h;
    const int64_t pos = ngs_get(table, shift, h, salt);
    if (pos < 0 || pos + n > L) return -1;
    for (int i = 0; i < n; ++i)
        if ((uint64_t)(int64_t)hist[pos + i] != ngs_key_token(hist, L, last, n, i)) return -1;
    return pos;
}

/* A position index's step (SeqIndex.sync_find): the windows starting at [state[0], stop),
 * stop = L - n - lag + 1, are indexed as ngs_put_ngrams indexes them (value: the start;
 * keep_first), state[0] becomes stop and state[1] the slots that filled; then the key
 * hist[L-n+1 .. L) + [last] is looked up as ngs_find looks it up. Returns its position or
 * -1; the key's hash into *hash_out. */
int64_t ngs_index_find(uint64_t *table, int shift, uint64_t salt, const int32_t *hist, int64_t L,
                       int32_t last, int n, int lag, int keep_first, int64_t *state,
                       uint64_t *hash_out) {
    const int64_t start = state[0], stop = L - n - lag + 1;
    state[1] = 0;
    if (stop > start) {
        state[1] = ngs_put_ngrams(table, shift, salt, hist + start, stop - start, n, 0, start,
                                  keep_first);
        state[0] = stop;
    }
    return ngs_find(table, shift, salt, hist, L, last, n, hash_out);
}

/* ---------------------------------------------------------------- one sequence's chain
 * A drafter chain's proposals for one sequence in one call (speculative/drafters/native_chain.py
 * `NativeChain`), each drafter as its Python `draft` computes it (ngram_simple.py,
 * ngram_map.py's NgramMapK, ngram_mod.py). Per drafter, constant parameters p[NGS_P_FIELDS]
 * and its per-sequence state row s[NGS_S_FIELDS] (seq_row.py names the fields). */

enum { NGS_PY = 0, NGS_SIMPLE = 1, NGS_MAPK = 2, NGS_MOD = 3 };  /* seq_row.KINDS */
enum { NGS_P_KIND, NGS_P_N, NGS_P_M, NGS_P_LAG, NGS_P_FIRST, NGS_P_MIN, NGS_P_FIELDS = 8 };
enum { NGS_S_SALT, NGS_S_INDEXED, NGS_S_RESETS, NGS_S_STATS_SALT, NGS_S_LAST_H, NGS_S_LAST_SET,
       NGS_S_START, NGS_S_FIELDS = 8 };
#define NGS_MOD_CHUNK 32   /* ngram_mod.CHUNK */
#define NGS_MAX_COUNT 16380  /* ngram_map.MAX_COUNT */

/* SeqIndex._fresh, then sync_find (or sync alone when `find` is 0): the position or -1. */
static int64_t ngs_index_step(uint64_t *table, int shift, int64_t resets, const int32_t *hist,
                              int64_t L, int32_t last, const int64_t *p, uint64_t *s, int find,
                              uint64_t *h, int64_t *filled) {
    if ((int64_t)s[NGS_S_RESETS] != resets || (int64_t)s[NGS_S_INDEXED] > L) {
        s[NGS_S_INDEXED] = 0;
        s[NGS_S_RESETS] = (uint64_t)resets;
    }
    const int n = (int)p[NGS_P_N];
    const int64_t start = (int64_t)s[NGS_S_INDEXED], stop = L - n - p[NGS_P_LAG] + 1;
    if (stop > start) {
        *filled += ngs_put_ngrams(table, shift, s[NGS_S_SALT], hist + start, stop - start, n,
                                  0, start, (int)p[NGS_P_FIRST]);
        s[NGS_S_INDEXED] = (uint64_t)stop;
    }
    return find ? ngs_find(table, shift, s[NGS_S_SALT], hist, L, last, n, h) : -1;
}

/* HashPool.put of a value (the pool's `used` grows by the slots it fills, in *filled). */
static void ngs_put(uint64_t *table, int shift, uint64_t h, uint64_t salt, uint64_t v,
                    int64_t *filled) {
    const uint64_t x = ngs_mix(h, salt);
    uint64_t *slot = &table[x >> shift];
    if (*slot == 0) ++*filled;
    *slot = (ngs_tag(x) << 32) | (v & NGS_LOW32);
}

/* NgramMapK.draft: the draft's length, its first token at hist[*start]. */
static int ngs_map_k(uint64_t *table, int shift, int64_t resets, const int32_t *hist, int64_t L,
                     int32_t last, int max_len, const int64_t *p, uint64_t *s, int64_t *start,
                     int64_t *filled) {
    const int n = (int)p[NGS_P_N], m = (int)p[NGS_P_M];
    uint64_t h = 0;
    s[NGS_S_LAST_SET] = 0;
    const int find = L >= 2 * (int64_t)n + m;
    const int64_t pos = ngs_index_step(table, shift, resets, hist, L, last, p, s, find, &h,
                                       filled);
    if (pos < 0 || pos + n + m > L || max_len <= 0) return 0;
    const uint64_t salt = s[NGS_S_STATS_SALT];
    const int64_t v = ngs_get(table, shift, h, salt);
    int64_t hits = v >= 0 ? v >> 16 : 0, acc = v >= 0 ? (v & 0xFFFF) : m;
    hits = hits + 1 < NGS_MAX_COUNT ? hits + 1 : NGS_MAX_COUNT;
    ngs_put(table, shift, h, salt, (uint64_t)((hits << 16) | acc), filled);
    if (hits < p[NGS_P_MIN]) return 0;
    int len = m < acc ? m : (int)acc;
    if (max_len < len) len = max_len;
    if (len <= 0) return 0;
    s[NGS_S_LAST_H] = h;
    s[NGS_S_LAST_SET] = 1;
    *start = pos + n;
    return len;
}

/* The drafters [from, n_d) for one sequence (history hist[0 .. L), the sampled token
 * `last`), each as its `draft(seq, hist, last, max_len)`: lens[i] its draft's length
 * (0: none, or shorter than min_len), its tokens at hist[starts[i] ..] or, where starts[i]
 * is -1, at out + i * out_stride (ngram-mod's chain). With first_only it stops after the
 * first draft of min_len tokens or more. `resets`: HashPool.resets; the slots filled are
 * added to *filled. Returns n_d when done, or the index of a drafter Python must draft
 * (kind NGS_PY, or an ngram-mod whose table takes its next chunk first): lens from it on
 * are 0 and the caller calls again from the next one. */
int ngs_propose(uint64_t *table, int shift, int64_t resets, const int32_t *hist, int64_t L,
                int32_t last, int max_len, int min_len, int first_only, int n_d, int from,
                const int64_t *params, uint64_t *const *states, int32_t *out, int out_stride,
                int32_t *lens, int64_t *starts, int64_t *filled) {
    for (int i = from; i < n_d; ++i) lens[i] = 0;
    for (int i = from; i < n_d; ++i) {
        const int64_t *p = params + (int64_t)i * NGS_P_FIELDS;
        uint64_t *s = states[i];
        const int n = (int)p[NGS_P_N];
        int len = 0;
        starts[i] = -1;
        if (p[NGS_P_KIND] == NGS_SIMPLE) {
            const int m = (int)p[NGS_P_M];
            uint64_t h = 0;
            const int find = L > (int64_t)n + m + 1 && max_len > 0;
            const int64_t pos = ngs_index_step(table, shift, resets, hist, L, last, p, s, find,
                                               &h, filled);
            const int64_t copy = pos < 0 ? 0 : (m < L - (pos + n) ? m : L - (pos + n));
            if (pos >= 0 && copy >= n) {
                len = (int)(copy < max_len ? copy : max_len);
                starts[i] = pos + n;
            }
        } else if (p[NGS_P_KIND] == NGS_MAPK) {
            len = ngs_map_k(table, shift, resets, hist, L, last, max_len, p, s, &starts[i],
                            filled);
        } else if (p[NGS_P_KIND] == NGS_MOD) {
            s[NGS_S_LAST_SET] = 0;  /* n_draft_last */
            if (L < n) continue;
            if ((int64_t)s[NGS_S_INDEXED] + NGS_MOD_CHUNK < L) return i;
            if (max_len <= 0) continue;
            int want = max_len < p[NGS_P_M] ? max_len : (int)p[NGS_P_M];
            if (want < p[NGS_P_MIN]) want = (int)p[NGS_P_MIN];
            int32_t *o = out + (int64_t)i * out_stride;
            len = ngs_follow(table, shift, s[NGS_S_SALT], hist, L, last, n, want, o);
            if (len < p[NGS_P_MIN] || len == 0) { len = 0; continue; }
            if (len > max_len) len = max_len;
            s[NGS_S_LAST_SET] = (uint64_t)len;
            s[NGS_S_START] = (uint64_t)(L - n + 1);
        } else {
            return i;
        }
        lens[i] = len;
        if (first_only && len >= min_len) {
            for (int j = i + 1; j < n_d; ++j) lens[j] = 0;
            return n_d;
        }
    }
    return n_d;
}

/* ---------------------------------------------------------------- decode layouts
 * The features the planner prices a decode by (speculative/cost.py `_fixed_features`), for
 * a context with one KV stream per sequence: llama/ubatch.py's `layout` (U1 padding,
 * llama.cpp's split_equal, the logit rows of each ubatch, the ragged counts evened out
 * with padding rows) computed as ubatch.py computes it (tests/test_native_drafting.py
 * compares them on random decodes). The planner meets thousands of layouts a run it has
 * not seen; in Python each costs ~26 us, here ~6 us with the ctypes call (hot). */

#define NGS_MAX_ENTRIES 64
#define NGS_MAX_UBATCHES 1024

typedef struct { int first, end, take; } ngs_ub;  /* entries [first, end) take `take` each */

/* split_equal (ubatch.py) of lengths len[0..m) (entries with 0 tokens skipped) for seq
 * ids ids[]; the ubatches into ub, returns their count, or -1 past NGS_MAX_UBATCHES. */
static int ngs_split_equal(const int32_t *ids, const int64_t *len, int m, int n_ubatch,
                           ngs_ub *ub) {
    int64_t rem[NGS_MAX_ENTRIES];
    int n = 0, first = 0;
    for (int i = 0; i < m; ++i) rem[i] = len[i];
    for (;;) {
        while (first < m && rem[first] <= 0) ++first;
        if (first == m) return n;
        if (n == NGS_MAX_UBATCHES) return -1;
        int end = first + 1;
        int64_t take = rem[first];
        while (end < m && rem[end] > 0 && ids[end] == ids[end - 1] + 1 && end - first <= n_ubatch) {
            if (rem[end] < take) take = rem[end];
            ++end;
        }
        const int64_t cap = n_ubatch / (end - first) > 1 ? n_ubatch / (end - first) : 1;
        if (take > cap) take = cap;
        for (int j = first; j < end; ++j) rem[j] -= take;
        ub[n++] = (ngs_ub){first, end, (int)take};
    }
}

/* x[6] = (ubatches, tokens with padding, logit rows, 0, ragged ubatches, multi-row
 * ubatches) and padded[m] of a decode of m entries e[3 i .. 3 i + 2] = (seq id, tokens,
 * logit rows), ascending ids, one KV stream per sequence; `pad`: batch-invariant padding,
 * `lone_ok`: no U1 padding. Returns 0, or -1 where it does not apply (then the Python
 * layout answers). */
int ngs_layout_features(const int32_t *e, int m, int n_ubatch, int pad, int quantum,
                        int lone_ok, double *x, int32_t *padded) {
    ngs_ub ub[NGS_MAX_UBATCHES];
    int32_t ids[NGS_MAX_ENTRIES], n_tok[NGS_MAX_ENTRIES], n_log[NGS_MAX_ENTRIES];
    int64_t len[NGS_MAX_ENTRIES], pads[NGS_MAX_ENTRIES] = {0}, pad_log[NGS_MAX_ENTRIES] = {0};
    int64_t logits[NGS_MAX_UBATCHES];
    if (m <= 0 || m > NGS_MAX_ENTRIES || n_ubatch <= 0) return -1;
    for (int i = 0; i < m; ++i) {
        ids[i] = e[3 * i]; n_tok[i] = e[3 * i + 1]; n_log[i] = e[3 * i + 2];
        if (n_tok[i] <= 0) return -1;
    }
    int nub = -1;
    for (int round = 0; round <= m; ++round) {  /* pads_needed: no ubatch of one token */
        for (int i = 0; i < m; ++i) len[i] = n_tok[i] + pads[i];
        nub = ngs_split_equal(ids, len, m, n_ubatch, ub);
        if (nub < 0) return -1;
        if (!pad || lone_ok) break;
        int lone = -1;
        for (int u = 0; u < nub && lone < 0; ++u)
            if (ub[u].end - ub[u].first == 1 && ub[u].take == 1) lone = ub[u].first;
        if (lone < 0) break;
        if (round == m) return -1;  /* did not converge: ubatch.py raises */
        pads[lone] += 1;
    }
    int64_t cursor[NGS_MAX_ENTRIES] = {0};
    for (int u = 0; u < nub; ++u) {  /* _logits_per_ubatch (no pad row has a logit yet) */
        int64_t count = 0;
        for (int j = ub[u].first; j < ub[u].end; ++j) {
            const int64_t a = cursor[j], b = cursor[j] + ub[u].take, n = n_tok[j];
            const int64_t lo = a > n - n_log[j] ? a : n - n_log[j], hi = b < n ? b : n;
            if (hi > lo) count += hi - lo;
            cursor[j] = b;
        }
        logits[u] = count;
    }
    for (int u = 0; pad && u < nub; ++u) {  /* ragged counts take padding rows' logits */
        int64_t start[NGS_MAX_ENTRIES] = {0};  /* tokens of each entry before ubatch u */
        for (int v = 0; v < u; ++v)
            for (int j = ub[v].first; j < ub[v].end; ++j) start[j] += ub[v].take;
        while (logits[u] > quantum && logits[u] % quantum != 0) {
            int s = -1;
            for (int j = ub[u].first; j < ub[u].end && s < 0; ++j)
                if (pads[j] > pad_log[j] && start[j] + ub[u].take > n_tok[j]) s = j;
            if (s < 0) break;
            pad_log[s] += 1;
            logits[u] += 1;
        }
    }
    int64_t tokens = 0, rows = 0, odd = 0, multi = 0;
    for (int i = 0; i < m; ++i) { padded[i] = (int32_t)(n_tok[i] + pads[i]); tokens += padded[i]; }
    for (int u = 0; u < nub; ++u) {
        rows += logits[u];
        odd += logits[u] > quantum && logits[u] % quantum != 0;
        multi += logits[u] >= 2;
    }
    x[0] = nub; x[1] = (double)tokens; x[2] = (double)rows; x[3] = 0.0;
    x[4] = (double)odd; x[5] = (double)multi;
    return 0;
}

/* AcceptanceStats.expected_tokens (speculative/acceptance.py): out[K] = E[tokens | K] for
 * K = 0..n-1 (n <= m + 1) from decayed counts kept as differences, last position first
 * (counts[i] = dacc[0] + .. + dacc[m - 1 - i]); p_i = (acc_i + prior) / (off_i + sw),
 * out[0] = 1, out[K] = out[K - 1] + p_0 .. p_{K-1}: the numpy reference's operations in
 * its order (the same values). */
void ngs_expected(const double *dacc, const double *doff, int m, double sw, double prior,
                  double *out, int n) {
    double acc[NGS_MAX_DRAFT], off[NGS_MAX_DRAFT], a = 0.0, o = 0.0, prod = 1.0;
    if (m > NGS_MAX_DRAFT) m = NGS_MAX_DRAFT;
    for (int j = 0; j < m; ++j) { a += dacc[j]; o += doff[j]; acc[j] = a; off[j] = o; }
    const int top = n - 1 < m ? n - 1 : m;
    out[0] = 1.0;
    for (int i = 0; i < top; ++i) {
        prod *= (acc[m - 1 - i] + prior) / (off[m - 1 - i] + sw);
        out[i + 1] = out[i] + prod;
    }
}

/* CostPolicy.options' table (policy.py, acceptance.best_expected): for each of `rows`
 * candidates r (AcceptanceStats r's counts dacc[r], doff[r] and its sw[r], prior[r] as
 * ngs_expected takes them) E[tokens | K] for K = 0..len[r]; per K = 0..top (top = the
 * largest len) the first candidate with the most, candidates without K counting as
 * -infinity (numpy's argmax over the table): expected[K] its value, pick[K] = idx[it],
 * pick[0] = -1; then, with scale < 1, every value's extra tokens shrunk by it:
 * (expected[K] - 1) x scale + 1 (DraftTrust.shrink). Returns top. */
int ngs_best_expected(const double *const *dacc, const double *const *doff, const double *sw,
                      const double *prior, const int32_t *len, const int64_t *idx, int rows,
                      double *expected, int64_t *pick, double scale) {
    double e[NGS_MAX_DRAFT + 1];
    int top = 0;
    for (int r = 0; r < rows; ++r) if (len[r] > top) top = len[r];
    if (top > NGS_MAX_DRAFT) top = NGS_MAX_DRAFT;
    for (int k = 0; k <= top; ++k) pick[k] = -2;  /* no candidate has K yet: -infinity */
    for (int r = 0; r < rows; ++r) {
        const int n = (len[r] < top ? len[r] : top) + 1;
        ngs_expected(dacc[r], doff[r], NGS_MAX_DRAFT, sw[r], prior[r], e, n);
        for (int k = 0; k < n; ++k)
            if (pick[k] == -2 || e[k] > expected[k]) { expected[k] = e[k]; pick[k] = idx[r]; }
    }
    pick[0] = -1;
    if (scale < 1.0)
        for (int k = 0; k <= top; ++k) expected[k] = (expected[k] - 1.0) * scale + 1.0;
    return top;
}

/* ------------------------------------------------------------------ the planner's search
 * planner._ascend in C (speculative/planner.py states the search; `_native_ascend` in
 * planner.py calls this): the same arithmetic in the same order, so the same lengths. */

typedef struct {
    int m, n_ubatch, pad, quantum, lone_ok;
    const int32_t *ids, *n_tok, *n_log;
    const int64_t *kv;
    const double *coef;
    double per_kv;
    int32_t e[3 * NGS_MAX_ENTRIES];
} ngs_plan;

/* DecodeCost.price of the decode with ks[i] more tokens (and logit rows) for entry i:
 * the features' dot product with the coefficients, left to right, plus the KV term. */
static int ngs_price(ngs_plan *p, const int32_t *ks, double *out) {
    double x[6];
    int32_t padded[NGS_MAX_ENTRIES];
    for (int i = 0; i < p->m; ++i) {
        p->e[3 * i] = p->ids[i];
        p->e[3 * i + 1] = p->n_tok[i] + ks[i];
        p->e[3 * i + 2] = p->n_log[i] + ks[i];
    }
    if (ngs_layout_features(p->e, p->m, p->n_ubatch, p->pad, p->quantum, p->lone_ok, x,
                            padded) != 0)
        return -1;
    double s = 0.0;
    for (int f = 0; f < 6; ++f) s += x[f] * p->coef[f];
    int64_t cells = 0;
    for (int i = 0; i < p->m; ++i) cells += (int64_t)padded[i] * p->kv[i];
    *out = s + p->per_kv * (double)cells / 1000.0;
    return 0;
}

/* planner._best_alone: the first K <= k_top with the best e[K] / (sec[K] + kv * tok[K]). */
static int ngs_best_alone(const double *e, int k_top, const double *sec, const double *tok,
                          double kv) {
    int best = 0;
    double top = e[0] / (sec[0] + kv * tok[0]);
    for (int k = 1; k <= k_top; ++k) {
        const double r = e[k] / (sec[k] + kv * tok[k]);
        if (r > top) { top = r; best = k; }
    }
    return best;
}

/* planner._alone: one sequence in the decode, its draft of at most k_top tokens: 0 when
 * the acceptance-free bound says no length pays ((e[1] - 1) * t(1) <= slope), else the
 * best length alone (ngs_best_alone) if trust x its rate beats plain decoding's; kv_cells
 * its stream's cells (the KV term per_kv * kv_cells / 1000 per token). */
int ngs_alone(const double *e, int k_top, const double *sec, const double *tok, double slope,
              double per_kv, int64_t kv_cells, double trust) {
    if (k_top <= 0) return 0;
    if ((e[1] - 1.0) * (sec[0] + per_kv * (double)kv_cells / 1000.0 * tok[0]) <= slope) return 0;
    const double kv = per_kv * (double)kv_cells / 1000.0;
    const int k = ngs_best_alone(e, k_top, sec, tok, kv);
    const double rate = e[k] / (sec[k] + kv * tok[k]), plain = e[0] / (sec[0] + kv * tok[0]);
    return rate * trust > plain * (1 + 1e-9) ? k : 0;
}

/* planner._ascend over m entries (ids ascending; n_tok, n_log, kv: the base decode);
 * expected[i]: E[tokens | K] for K = 0..len[i]-1, or NULL (no options); caps[i]: the
 * most draft tokens of entry i; sec, tok: DecodeCost.alone's table; slope its least
 * per-token cost. Writes ks; returns 0, or -1 where the layout is not C's (Python's
 * search answers). Candidates are tried in ascending order. */
int ngs_ascend(const int32_t *ids, const int32_t *n_tok, const int32_t *n_log,
               const int64_t *kv, int m, const double *const *expected, const int32_t *len,
               const int32_t *caps, int budget, const double *coef, double per_kv,
               int n_ubatch, int pad, int quantum, int lone_ok, const double *sec,
               const double *tok, double slope, double trust, int max_rounds, int32_t *ks) {
    ngs_plan p = {m, n_ubatch, pad, quantum, lone_ok, ids, n_tok, n_log, kv, coef, per_kv, {0}};
    double gain[NGS_MAX_ENTRIES], total = 0.0, t, best, plain;
    int active[NGS_MAX_ENTRIES], n_active = 0, own[NGS_MAX_ENTRIES][3];
    if (m <= 1 || m > NGS_MAX_ENTRIES) return -1;
    int any = 0;
    for (int i = 0; i < m; ++i) { ks[i] = 0; any |= caps[i] > 0; }
    if (!any) return 0;
    for (int i = 0; i < m; ++i) {
        gain[i] = expected[i] ? expected[i][0] : 1.0;
        total += gain[i];
    }
    if (ngs_price(&p, ks, &t) != 0) return -1;
    best = plain = total / t;
    for (int i = 0; i < m; ++i) {
        if (caps[i] <= 0 || expected[i][1] - expected[i][0] <= plain * slope) continue;
        const int top = caps[i] < len[i] - 1 ? caps[i] : len[i] - 1;
        own[n_active][0] = 0;
        own[n_active][1] = caps[i];
        own[n_active][2] = ngs_best_alone(expected[i], top, sec, tok,
                                          per_kv * (double)kv[i] / 1000.0);
        active[n_active++] = i;
    }
    for (int round = 0; round < (n_active ? max_rounds : 0); ++round) {
        int changed = 0;
        for (int a = 0; a < n_active; ++a) {
            const int i = active[a], was = ks[i];
            const double *e = expected[i];
            int sum = 0;
            for (int j = 0; j < m; ++j) sum += ks[j];
            const int room = budget - (sum - was);
            int pick = was, last = -1;
            for (;;) {  /* the candidates in ascending order, each once */
                int k = 1 << 30;
                for (int c = 0; c < 3; ++c) if (own[a][c] > last && own[a][c] < k) k = own[a][c];
                for (int b = 0; b < n_active; ++b)
                    if (ks[active[b]] > last && ks[active[b]] < k) k = ks[active[b]];
                if (k == 1 << 30) break;
                last = k;
                if (k == was || k > caps[i] || k > room) continue;
                ks[i] = k;
                if (ngs_price(&p, ks, &t) != 0) return -1;
                const double r = (total - gain[i] + e[k]) / t;
                if (r > best * (1 + 1e-9)) { best = r; pick = k; }
                ks[i] = was;
            }
            ks[i] = pick;
            if (pick != was) {
                total += e[pick] - gain[i];
                gain[i] = e[pick];
                changed = 1;
            }
        }
        if (!changed) break;
    }
    if (!(best * trust > plain))
        for (int i = 0; i < m; ++i) ks[i] = 0;
    return 0;
}
