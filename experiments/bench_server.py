#!/usr/bin/env python
"""Aggregate throughput of `ngramspec serve`: 1 slot (sequential) vs 4 slots (concurrent),
speculation off vs on, on the fixture prompts (greedy, n_predict 128 by default).

    python experiments/bench_server.py [--n-predict 128] [--threads 2] [--spec-type ngram-mod]

Each configuration starts a fresh server on a free loopback port. Speculation is
switched per request (header X-Ngramspec-Speculative: off), so both modes share
one server and one model load. Prints a rich table: wall time, generated tokens,
aggregate tok/s (all generated tokens / wall time), drafted/accepted and ratios.
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ngramspec.server.launch import start_server  # noqa: E402


def run_config(slots: int, prompts: list[str], args) -> list[dict]:
    per_slot = args.slot_ctx
    sp = start_server(["-np", str(slots), "-c", str(per_slot * slots), "--temp", "0",
                       "-t", str(args.threads), "--spec-type", args.spec_type, "--metrics"],
                      timeout=300)
    rows = []
    try:
        with httpx.Client(base_url=sp.url, timeout=600) as c:
            c.post("/completion", json={"prompt": "Hello", "n_predict": 8})  # warm-up
            texts = {}
            for spec in ("off", "on"):
                def one(p):
                    r = c.post("/completion", json={"prompt": p, "n_predict": args.n_predict},
                               headers={"X-Ngramspec-Speculative": spec})
                    r.raise_for_status()
                    return r.json()

                t0 = time.perf_counter()
                if slots == 1:
                    outs = [one(p) for p in prompts]
                else:
                    with ThreadPoolExecutor(slots) as ex:
                        outs = list(ex.map(one, prompts))
                wall = time.perf_counter() - t0
                texts[spec] = [o["content"] for o in outs]
                toks = sum(o["tokens_predicted"] for o in outs)
                rows.append({"slots": slots, "spec": spec, "wall": wall, "tokens": toks,
                             "tok_s": toks / wall,
                             "drafted": sum(o["timings"].get("draft_n", 0) for o in outs),
                             "accepted": sum(o["timings"].get("draft_n_accepted", 0) for o in outs),
                             "prompt_tokens": sum(o["tokens_evaluated"] for o in outs)})
            same = sum(a == b for a, b in zip(texts["off"], texts["on"]))
            for r in rows:
                r["identical"] = f"{same}/{len(prompts)}"
    finally:
        sp.stop()
    return rows


def main() -> None:
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run `finally`: stop the servers
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--spec-type", default="ngram-mod")
    ap.add_argument("--slot-ctx", type=int, default=2048, help="context tokens per slot")
    ap.add_argument("--prompts", default=str(ROOT / "fixtures/prompts/*.txt"))
    ap.add_argument("--parallel", type=int, default=4, help="slots of the concurrent run")
    args = ap.parse_args()
    files = sorted(glob.glob(args.prompts))
    if not files:
        sys.exit(f"no prompts match {args.prompts}")
    prompts = [Path(f).read_text(encoding="utf-8") for f in files]
    console = Console(stderr=True)
    rows = []
    for slots in (1, args.parallel):
        with console.status(f"{slots} slot(s): {len(prompts)} prompts x {args.n_predict} tokens, "
                            "spec off then on ..."):
            rows += run_config(slots, prompts, args)
    base = next(r for r in rows if r["slots"] == 1 and r["spec"] == "off")["tok_s"]
    t = Table(title=f"ngramspec serve: aggregate throughput ({len(prompts)} fixture prompts, "
                    f"greedy, n_predict {args.n_predict}, spec-type {args.spec_type}, "
                    f"{args.threads} threads)")
    for col in ("slots", "spec", "wall s", "tokens", "agg tok/s", "vs spec off",
                "vs 1 slot off", "drafted", "accepted", "identical off/on"):
        t.add_column(col, justify="right")
    for r in rows:
        off = next(x for x in rows if x["slots"] == r["slots"] and x["spec"] == "off")["tok_s"]
        t.add_row(str(r["slots"]), r["spec"], f"{r['wall']:.1f}", str(r["tokens"]),
                  f"{r['tok_s']:.1f}", f"{r['tok_s'] / off:.2f}x", f"{r['tok_s'] / base:.2f}x",
                  str(r["drafted"]), str(r["accepted"]), r["identical"])
    Console(width=160).print(t)


if __name__ == "__main__":
    main()
