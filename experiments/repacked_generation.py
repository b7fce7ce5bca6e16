#!/usr/bin/env python
"""Would generation on llama.cpp's repacked weights pay? (issue 22, ninth session)

    python experiments/repacked_generation.py [--rounds 2]

Repacked Q4_K weights give a token the same values whatever its neighbours only when
every ubatch holds a multiple of 4 rows (docs/benchmarks-history.md, "Plain decoding: the
levers measured"). This times generation decodes as the engine makes them (batch-
invariant contexts, flash attention's reference path, 8 streams of 600 cells, every
row with logits) on the plain weights generation uses today against the repacked
weights with the ubatch padded to 4 rows, shape by shape, alternated, median of 11.
One model process; nothing else may run.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ngramspec.llama.context import Context, ContextParams
from ngramspec.llama.model import Model  # noqa: E402

STREAMS = 8
CELLS = 600
SHAPES = [(1, 1), (2, 1), (3, 1), (4, 1), (8, 1), (1, 4), (1, 8), (1, 16), (4, 4), (8, 2)]


def filled(model: Model, rng) -> Context:
    ctx = Context(model, ContextParams(n_ctx=1024 * STREAMS, n_seq_max=STREAMS, n_threads=2))
    prompt = rng.integers(1000, 20000, CELLS).tolist()
    for s in range(STREAMS):
        for p in range(0, CELLS, 60):
            ctx.run_rows([(s, prompt[p:p + 60], p, False)], {s: 4})
    return ctx


def median_ms(ctx: Context, entries, pads, reps: int = 11) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        ctx.run_rows(entries, pads)
        ts.append(time.perf_counter() - t0)
        for seq_id, _, pos0, _ in entries:
            ctx.truncate(seq_id, pos0)
    return 1e3 * statistics.median(ts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    plain = filled(Model(None, use_extra_bufts=False), rng)
    repacked = filled(Model(None, use_extra_bufts=True), rng)
    print(f"{'streams x rows':>15} {'plain ms':>9} {'repacked ms':>12} {'pad':>4} {'ratio':>6}")
    for _ in range(a.rounds):
        for streams, n in SHAPES:
            entries = [(s, rng.integers(1000, 20000, n).tolist(), CELLS, True)
                       for s in range(streams)]
            pad = -streams * n % 4
            t_plain = median_ms(plain, entries, {})
            t_rep = median_ms(repacked, entries, {0: pad} if pad else {})
            print(f"{f'{streams} x {n}':>15} {t_plain:9.1f} {t_rep:12.1f} {pad:4d} "
                  f"{t_rep / t_plain:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
