#!/usr/bin/env python
"""Would an output layer evaluated only on the rows that decide acceptance pay? (issue 23)

    python experiments/lazy_head.py [-n 160] [--docs 12] [--json-out F]

A verify decode computes the logits of every row, and Gemma's 262,144 x 640 Q8_0 output
layer is about half of a row's cost. Greedy acceptance needs row j's logits only when
draft tokens 0..j-1 were accepted. Through llama.cpp's public eval callback (`cb_eval`)
a decode can stop after `result_norm` (every KV write comes earlier in the graph), and
the output layer can be computed afterwards, by ggml's own kernels for the same column
count, only on the rows needed ("lazy"): the first row of the step alone, then, once
its draft token is accepted, the remaining rows in even chunks (tinyBLAS takes columns
in pairs on AVX2, so an odd chunk of 3+ costs more than one of one more).

The script
1. checks that such rows are bit-identical to llama.cpp's logits (1, 2, 3 and 8 rows;
   whole chunk and one row at a time);
2. times, alternated, at 600 cells (batch-invariant context, the engine's settings):
   llama.cpp's decode of n rows with every logit (no callback, and with the callback
   installed, which llama.cpp asks about every graph node), the decode stopped at
   `result_norm`, and the output layer alone over m rows;
3. runs the held-out documents through greedy plain decoding and replays them as the
   engine steps (the chain's first draft, up to 16 tokens), also with a one-token
   token-recycling guess (the top candidate after the token just emitted, from the
   rows computed so far) at steps where no drafter proposes; prices every step today
   (full decodes), lazily, and with an ideal lazy head (the needed rows only, in one
   call). Prints modelled generation seconds. One model process; nothing else may run.
"""
from __future__ import annotations

import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from branch_proposals import MAX_DRAFT, replay  # noqa: E402
from novel_proposals import documents_run, emit, greedy  # noqa: E402
from output_layer_cost import OutputLayer, StopAtNorm, make_context  # noqa: E402
CELLS = 600


def fill(ctx, rng) -> None:
    """CELLS cells of random tokens in stream 0, in generation-sized chunks."""
    base = rng.integers(1000, 20000, CELLS).tolist()
    for p in range(0, CELLS, 60):
        ctx.run_rows([(0, base[p:p + 60], p, False)], {}, {})


def check_identity(ctx, head: OutputLayer, stop: StopAtNorm, rng) -> dict[int, bool]:
    """Row count -> whether the stopped decode's rows, through `head` (all at once and
    one at a time), equal llama.cpp's logits bit for bit."""
    out = {}
    for n in (1, 2, 3, 8):
        toks = rng.integers(1000, 20000, n).tolist()
        stop.stop, stop.rows = False, []
        rows = ctx.run_rows([(0, toks, CELLS, True)], {}, {})[0]
        theirs = np.stack([ctx.logits_at(i) for i in rows])
        h = np.concatenate(stop.rows)
        out[n] = bool(np.array_equal(head(h), theirs)
                      and all(np.array_equal(head(h[i:i + 1])[0], theirs[i]) for i in range(n)))
        ctx.truncate(0, CELLS)
    stop.stop = True
    return out


def cost_tables(model, reps: int = 7, n_max: int = MAX_DRAFT + 1) -> dict:
    """Median seconds per row count of: full decodes without and with the callback,
    decodes stopped at result_norm, and the output layer alone; shapes alternated."""
    rng = np.random.default_rng(0)
    head = OutputLayer(model, per_column=False)
    stop = StopAtNorm(head.name_off)
    plain, lazy = make_context(model, 1, invariant=True), make_context(model, 1, stop.cb, True)
    stop.stop = False
    fill(plain, rng)
    fill(lazy, rng)
    identical = check_identity(lazy, head, stop, rng)
    t: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    h = rng.standard_normal((n_max, head.n_embd)).astype(np.float32)
    for _ in range(reps):
        for n in range(1, n_max + 1):
            toks = rng.integers(1000, 20000, n).tolist()
            for name, ctx, stopped in (("full", plain, False), ("full_cb", lazy, False),
                                       ("stopped", lazy, True)):
                stop.stop, stop.rows = stopped, []
                t0 = time.perf_counter()
                ctx.run_rows([(0, toks, CELLS, True)], {}, {})
                t[name][n].append(time.perf_counter() - t0)
                ctx.truncate(0, CELLS)
            t0 = time.perf_counter()
            head(h[:n])
            t["head"][n].append(time.perf_counter() - t0)
    plain.close()
    lazy.close()
    return {"identical": identical,
            **{k: {n: statistics.median(v) for n, v in d.items()} for k, d in t.items()}}


def lazy_seconds(rows: int, n_acc: int, tab: dict, ideal: bool = False) -> float:
    """A step of `rows` rows, n_acc draft tokens accepted: the stopped decode, then the
    output layer on row 0 and, while needed, on the rest in even chunks (`ideal`: on
    exactly the n_acc + 1 rows needed, in one call)."""
    s, head = tab["stopped"][rows], tab["head"]
    if ideal:
        return s + head[n_acc + 1]
    done, s = 1, s + head[1]
    while done < n_acc + 1:
        rest = rows - done
        chunk = rest - 1 if rest % 2 and rest >= 3 else rest
        s += head[chunk]
        done += chunk
    return s


def main() -> int:
    a, engine, docs = documents_run(__doc__.split("\n")[0])
    runs = []
    for doc in docs:
        runs.append(greedy(engine, doc.prompt, a.n))
        print(f"{doc.id}: done", file=sys.stderr)
    tab = cost_tables(engine.model)
    report: dict = {"identical_rows": tab["identical"],
                    **{f"{k}_ms": {n: round(v * 1e3, 1) for n, v in tab[k].items()}
                       for k in ("full", "full_cb", "stopped", "head")}, "policies": {}}
    for guess in (False, True):
        steps = [s for prompt, out, tops in runs
                 for s in replay("first", prompt, out, tops if guess else None)]
        kinds: Counter = Counter()
        for _, n_acc, kind in steps:
            kinds[kind] += 1
            kinds[f"{kind}_accepted"] += n_acc
        report["policies"]["first + guess" if guess else "first"] = {
            "steps": len(steps), "rows": sum(r for r, _, _ in steps), **kinds,
            "today_s": round(sum(tab["full"][r] for r, _, _ in steps), 2),
            "today_with_callback_s": round(sum(tab["full_cb"][r] for r, _, _ in steps), 2),
            "lazy_s": round(sum(lazy_seconds(r, n, tab) for r, n, _ in steps), 2),
            "lazy_ideal_s": round(sum(lazy_seconds(r, n, tab, True) for r, n, _ in steps), 2)}
    return emit(report, a.json_out)


if __name__ == "__main__":
    sys.exit(main())
