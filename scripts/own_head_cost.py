#!/usr/bin/env python
"""What our output layer (ngramspec/llama/kernels/head.py) saves, decode shape by decode shape.

    .venv/bin/python scripts/own_head_cost.py [--reps 15] [--cells 600]

Generation contexts of the embedded model in one process, as the engine makes them
(batch-invariant, 8 KV streams of `cells` cells): one with llama.cpp's output layer and
one with ours per instruction-set variant this CPU runs (AVX2, AVX-512 VNNI); each decode
shape (streams x tokens, every row with logits) is timed on each, alternated, and the
logits compared bit for bit with llama.cpp's. One model process; nothing else
may run (docs/benchmarks-history.md, "An output layer of our own").
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ngramspec.llama.context import Context, ContextParams
from ngramspec.llama.model import Model  # noqa: E402

STREAMS = 8
SHAPES = [(1, 1), (1, 2), (2, 1), (1, 4), (4, 1), (4, 2), (8, 1), (1, 8), (2, 8), (1, 16), (4, 4)]


def filled(model: Model, own: str | None, cells: int) -> Context:
    """A context of STREAMS streams of `cells` cells each (the same tokens every call),
    with our output layer's variant `own` (None: llama.cpp's)."""
    rng = np.random.default_rng(1)
    if own:
        os.environ["NGRAMSPEC_KERNEL_VARIANT"] = own
    try:
        ctx = Context(model, ContextParams(n_ctx=2048 * STREAMS, n_seq_max=STREAMS,
                                           own_head=own is not None,
                                           own_matmul=False))  # only the output layer differs
    finally:
        os.environ.pop("NGRAMSPEC_KERNEL_VARIANT", None)
    if own and not (ctx.head is not None and ctx.head.active):
        raise SystemExit(f"our output layer ({own}) is not available here (`ngramspec doctor`)")
    for s in range(STREAMS):
        toks = rng.integers(1000, 20000, cells).tolist()
        for p in range(0, cells, 60):
            ctx.decode([(s, toks[p:p + 60], p, False)])
    return ctx


def step(ctx: Context, shape, toks, cells: int) -> tuple[float, np.ndarray]:
    n_seq, per = shape
    t0 = time.perf_counter()
    rows = ctx.decode([(s, toks[s][:per], cells, True) for s in range(n_seq)])
    dt = time.perf_counter() - t0
    logits = np.stack([ctx.logits_at(i) for r in rows for i in r])
    for s in range(n_seq):
        ctx.truncate(s, cells)
    return dt, logits


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--cells", type=int, default=600)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    model = Model(use_extra_bufts=False)
    from ngramspec.llama.kernels import head
    ctxs = {"llama.cpp": filled(model, None, a.cells)}
    for v in head.KERNEL.candidates():
        ctxs[v] = filled(model, v, a.cells)
    own = [k for k in ctxs if k != "llama.cpp"]
    print(f"{'streams x tokens':>16} {'llama.cpp ms':>13} " +
          " ".join(f"{v + ' ms':>15} {'ratio':>6}" for v in own) + "  identical")
    for shape in SHAPES:
        times: dict[str, list[float]] = {k: [] for k in ctxs}
        same = True
        for _ in range(a.reps):
            toks = [rng.integers(1000, 20000, shape[1]).tolist() for _ in range(shape[0])]
            got = {}
            for label, ctx in ctxs.items():
                dt, got[label] = step(ctx, shape, toks, a.cells)
                times[label].append(dt)
            same &= all(np.array_equal(got[v].view(np.uint32), got["llama.cpp"].view(np.uint32))
                        for v in own)
        m = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        print(f"{shape[0]:>9} x {shape[1]:<4} {m['llama.cpp']:>13.1f} " +
              " ".join(f"{m[v]:>15.1f} {m[v] / m['llama.cpp']:>6.2f}" for v in own) +
              f"  {same}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
