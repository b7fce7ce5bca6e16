"""Measure what batch invariance costs: decode time per batch size and spec-off tok/s.

Runs two child processes (ggml reads its settings once per process):
  stock      llama.cpp defaults: repacked weights, tiled K-quant matmul, no padding
  invariant  ngramspec's default: no repack, GGML_CPU_TILED_MM=0, flash attention,
             1-token decodes padded to 2, decodes under 64 tokens
and prints one table. Usage: python experiments/invariance_cost.py [--threads 2] [-n 128]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r'''
import json, os, sys, time
import numpy as np
mode, threads, n_predict = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if mode == "stock":
    os.environ["GGML_CPU_TILED_MM"] = "1"
from ngramspec.llama.model import Model, Context, ContextParams
from ngramspec.engine.engine import Engine
from ngramspec.engine.generate import generate
from ngramspec.engine.sampling import SamplingParams
from ngramspec import SpecConfig
inv = mode == "invariant"
m = Model(use_extra_bufts=not inv)
ctx = Context(m, ContextParams(n_ctx=4096, n_threads=threads, flash_attn=True, batch_invariant=inv))
eng = Engine(m, ctx)
prompt = open("fixtures/prompts/refactor.txt").read()
toks = m.tokenize(prompt)
out = {"decode_ms": {}}
for k in (1, 2, 4, 8, 16, 32, 62):
    times = []
    for _ in range(5):
        ctx.clear()
        (ctx.prefill(0, toks[:400], 0) if inv else ctx.decode([(0, toks[:400], 0, False)]))
        t0 = time.perf_counter()
        ctx.decode([(0, toks[400:400 + k], 400, True)])
        times.append(time.perf_counter() - t0)
    out["decode_ms"][k] = 1e3 * min(times)
ctx.clear()
r = generate(eng, prompt, SamplingParams(temperature=0), n_predict=n_predict, speculative=False)
out["off_tok_s"] = r.final.predicted_per_second
print(json.dumps(out))
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=128)
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = {}
    for mode in ("stock", "invariant"):
        p = subprocess.run([sys.executable, "-c", CHILD, mode, str(a.threads), str(a.n)],
                           cwd=root, capture_output=True, text=True, check=True)
        res[mode] = json.loads(p.stdout.strip().splitlines()[-1])
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"cost of batch invariance ({a.threads} threads, Gemma 3 270M Q4_K_M)")
    for c in ("tokens per decode", "stock ms", "invariant ms", "ratio"):
        t.add_column(c, justify="right")
    for k in res["stock"]["decode_ms"]:
        s, i = res["stock"]["decode_ms"][k], res["invariant"]["decode_ms"][k]
        t.add_row(k, f"{s:.1f}", f"{i:.1f}", f"{i / s:.2f}x")
    s, i = res["stock"]["off_tok_s"], res["invariant"]["off_tok_s"]
    t.add_row("spec-off tok/s", f"{s:.1f}", f"{i:.1f}", f"{i / s:.2f}x")
    Console(width=100).print(t)


if __name__ == "__main__":
    main()
