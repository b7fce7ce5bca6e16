#!/usr/bin/env python
"""Plain decoding's levers (docs/benchmarks-history.md, issue 22): the cost of decode shapes on
plain weights (today's generation) and on llama.cpp's repacked weights (llama-server's),
and whether a token's logits on repacked weights depend on its neighbours.

    python experiments/repack_levers.py

Prints the median / best of 15 decodes per shape (ms), then the largest logit difference
of one token decoded in several batches against the same token with 3 padding rows. On
x86, repacked Q4_K weights go through a 4-column GEMM for the first 4*floor(n/4) rows of
a ubatch and a 1-column GEMV for the rest, and the two accumulate differently: exact
only if every ubatch's row count is a multiple of 4.
"""
import time

import numpy as np
import ngramspec  # noqa: F401  (sets GGML_CPU_TILED_MM=0 before llama.cpp loads)
from ngramspec.llama.model import Model
from ngramspec.llama.context import Context, ContextParams
threads = 2
plain = Model(None, use_extra_bufts=False)
rep = Model(None, use_extra_bufts=True)
def ctx_for(m, n_seq=1):
    return Context(m, ContextParams(n_ctx=2048*n_seq, n_seq_max=n_seq, n_threads=threads, batch_invariant=False))
rng = np.random.default_rng(0)
PROMPT = rng.integers(1000, 20000, 300).tolist()
def setup(ctx, seqs):
    for s in range(seqs):
        ctx.clear(s)
        ctx.run_rows([(s, PROMPT, 0, False)], {})
def timeit(ctx, entries, pads, reps=15):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter(); ctx.run_rows(entries, pads); ts.append(time.perf_counter() - t0)
        for e in entries: ctx.truncate(e[0], e[2])
    return 1e3 * float(np.median(ts)), 1e3*min(ts)
cp, cr = ctx_for(plain), ctx_for(rep)
setup(cp, 1); setup(cr, 1)
tok = [5000]
print("shape: median/min ms")
print("plain 1 tok + 1 pad (today's plain step): %.2f / %.2f" % timeit(cp, [(0, tok, 300, True)], {0: 1}))
print("plain 1 tok alone (not invariant):      %.2f / %.2f" % timeit(cp, [(0, tok, 300, True)], {}))
print("repack 1 tok (llama-server's step):     %.2f / %.2f" % timeit(cr, [(0, tok, 300, True)], {}))
for pads in (1, 3, 7):
    print(f"repack 1 tok + {pads} pad:                 %.2f / %.2f" % timeit(cr, [(0, tok, 300, True)], {0: pads}))
for n in (4, 8, 16, 32, 60):
    t = rng.integers(1000, 20000, n).tolist()
    print(f"plain {n} tok (all logits):  %.2f / %.2f" % timeit(cp, [(0, t, 300, True)], {0: 1 if n==1 else 0}), end="   ")
    print(f"repack {n} tok: %.2f / %.2f" % timeit(cr, [(0, t, 300, True)], {}))
# multi-seq
for ns in (4, 8):
    cp4, cr4 = ctx_for(plain, ns), ctx_for(rep, ns)
    setup(cp4, ns); setup(cr4, ns)
    e = [(s, tok, 300, True) for s in range(ns)]
    print(f"{ns} seqs x 1 tok: plain %.2f / %.2f" % timeit(cp4, e, {}), end="   ")
    print("repack %.2f / %.2f" % timeit(cr4, e, {}))
    del cp4, cr4
# exactness: token X's logits in [X,pad,pad,pad] vs [X,d1,d2,d3] vs in an 8-row batch vs 64-row
def logits_of(ctx, seq, toks, pos, pads, want_idx=0):
    rows = ctx.run_rows([(seq, toks, pos, True)], pads)[0]
    out = ctx.logits_at(rows[want_idx]).copy()
    ctx.truncate(seq, pos)
    return out
setup(cr, 1)
X = 5000
ref = logits_of(cr, 0, [X], 300, {0: 3})
for name, toks, pads in (("X+3 drafts", [X, 11, 12, 13], {}), ("X+7 drafts", [X]+list(range(100,107)), {}),
                         ("X+5 drafts+2pad", [X]+list(range(100,105)), {0: 2}), ("X alone (gemv)", [X], {}),
                         ("X+1 pad (gemv)", [X], {0: 1}), ("X + 59 drafts", [X]+list(range(100,159)), {})):
    l = logits_of(cr, 0, toks, 300, pads)
    print(f"{name}: max|diff| vs X+3pad = {np.abs(l-ref).max():.3g}, argmax same {int(l.argmax())==int(ref.argmax())}")

# Sweep: tokens of a 40-token sequence decoded in batches of 2..10 rows with 0-3 padding rows,
# against each token decoded with 3 padding rows (a 4-row GEMM): count the rows that differ,
# (a) in every batch shape, (b) only in shapes whose row count is a multiple of 4.
c1 = ctx_for(rep)
c1._run([(0, PROMPT, 0, False)], {})
SEQ = rng.integers(1000, 20000, 40).tolist()
refs = []
for i, t in enumerate(SEQ):
    rows = c1._run([(0, [t], 300 + i, True)], {0: 3})[0]
    refs.append(c1.logits_at(rows[0]).copy())
for only4 in (False, True):
    n_rows = n_bad = 0
    worst = 0.0
    for start in range(0, 30, 3):
        for n in range(2, 11):
            for pads in (0, 1, 2, 3):
                if only4 and (n + pads) % 4:
                    continue
                c1.truncate(0, 300 + start)
                rows = c1._run([(0, SEQ[start:start + n], 300 + start, True)], {0: pads})[0]
                for j, r in enumerate(rows):
                    d = float(np.abs(c1.logits_at(r) - refs[start + j]).max())
                    n_rows, n_bad, worst = n_rows + 1, n_bad + (d > 0), max(worst, d)
    print(f"{'multiple-of-4 shapes' if only4 else 'every shape'}: {n_bad} of {n_rows} rows differ "
          f"from the 4-row GEMM reference (max |diff| {worst:.3g})")
