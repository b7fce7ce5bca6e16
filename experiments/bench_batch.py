#!/usr/bin/env python
"""`ngramspec batch -np 4` against the same documents one at a time through
`ngramspec generate`, and through `ngramspec serve -np 4` with 4 concurrent HTTP
clients (issue 11's "Must show"). Greedy, one process at a time.

    python experiments/bench_batch.py [--n-docs 44] [-n 256] [-t THREADS] [--slot-ctx 2048]
                                  [--check-speedup] [--json-out FILE] [--out-dir DIR]

Documents: the held-out standard-library corpus (`ngramspec.bench.corpus`, split
"eval"): 24 class sources to refactor, 16 module docstrings to summarize, 4
open prompts (44 in all), kinds interleaved. Nobody on the project wrote them.

Aggregate tok/s = generated tokens / seconds, model loading excluded everywhere:
- batch: the job's wall time from its summary (`--summary-json`): first record
  pulled to last result written, prompts included;
- generate: one process per document; seconds = its prompt_ms + predicted_ms
  (llama.cpp timings from `--json`), summed over the documents;
- serve: wall time from the first request to the last response of 4 client
  threads (`pipeline_bench.send_all`), prompts included.
`--rounds 2` runs batch and serve twice each, in the order batch, serve, serve,
batch (ABBA), and reports each side's total tokens over total seconds: a machine
that drifts faster or slower during the run then favours neither side.
`--check-speedup` also runs batch with `--spec-type none`, so the speedup over
plain decoding that batch's summary estimates can be checked against a real
plain run (verify seconds of the two runs, same tokens). Outputs are compared document by document (greedy: they must agree).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ngramspec.bench import pipeline as PB  # noqa: E402
from ngramspec.bench.corpus import documents, interleave  # noqa: E402

CLI = [sys.executable, "-c", "from ngramspec.cli.main import run; run()"]


def run_batch(docs_path: Path, out_dir: Path, args, spec_type: str = "auto") -> dict:
    out, summ = out_dir / f"batch-{spec_type}.jsonl", out_dir / f"batch-{spec_type}.json"
    out.unlink(missing_ok=True)  # a fresh job, not a resume
    subprocess.run([*CLI, "batch", str(docs_path), "-o", str(out), "-np", str(args.parallel),
                    "-c", str(args.slot_ctx * args.parallel), "-n", str(args.n_predict),
                    "-t", str(args.threads), "--spec-type", spec_type,
                    "--summary-json", str(summ)], check=True)
    s = json.loads(summ.read_text())
    texts = {x["id"]: x["text"] for x in map(json.loads, out.read_text().splitlines())}
    return {"tok_per_s": s["tok_per_s"], "generated": s["generated"], "seconds": s["wall"],
            "failed": s["failed"], "speedup_estimate": s["speedup_over_plain"],
            "verify_seconds": s["verify_seconds"], "texts": texts}


def run_generate(docs, out_dir: Path, args) -> dict:
    gen, secs, texts = 0, 0.0, {}
    for i, d in enumerate(docs):
        f = out_dir / f"doc-{i}.txt"
        f.write_text(d.prompt)
        r = subprocess.run([*CLI, "generate", "-f", str(f), "-n", str(args.n_predict),
                            "--temp", "0", "-t", str(args.threads), "-c", str(args.slot_ctx),
                            "--json"], check=True, capture_output=True, text=True)
        out = json.loads(r.stdout)
        t = out["timings"]
        gen += t["predicted_n"]
        secs += (t["prompt_ms"] + t["predicted_ms"]) / 1e3
        texts[d.id] = out["content"]
        print(f"generate {i + 1}/{len(docs)}", file=sys.stderr)
    return {"tok_per_s": gen / secs, "generated": gen, "seconds": secs, "texts": texts}


def run_serve(docs, args) -> dict:
    [res] = PB.run_ngramspec(docs, args.parallel, ["auto"], args.n_predict, args.threads,
                                args.slot_ctx, None)
    return {"tok_per_s": res.tok_per_s, "generated": res.generated, "seconds": res.wall_s,
            "texts": res.texts}


def paired_runs(run_a, run_b, rounds: int) -> tuple[dict, dict]:
    """A and B, `rounds` times each in ABBA order (A B, B A, A B, ...); each side's
    runs merged: tokens and seconds summed, tok/s = their ratio, verify seconds per
    run (their mean), texts of the first
    run (`runs_agree` says whether every later run produced the same texts)."""
    a_runs, b_runs = [], []
    for i in range(rounds):
        order = [(run_a, a_runs), (run_b, b_runs)]
        for run, into in (order if i % 2 == 0 else order[::-1]):
            into.append(run())
    return merge_runs(a_runs), merge_runs(b_runs)


def merge_runs(runs: list[dict]) -> dict:
    out = dict(runs[0])
    for k in ("generated", "seconds"):
        out[k] = sum(r[k] for r in runs)
    if "verify_seconds" in out:  # per run, to compare with a single spec-off run
        out["verify_seconds"] = sum(r["verify_seconds"] for r in runs) / len(runs)
    out["tok_per_s"] = out["generated"] / out["seconds"]
    out["each_tok_per_s"] = [round(r["tok_per_s"], 1) for r in runs]
    out["runs_agree"] = all(r["texts"] == runs[0]["texts"] for r in runs)
    return out


def report(rows: dict[str, dict], n_docs: int, args) -> None:
    ref = rows["batch"]["texts"]
    t = Table(title=f"{n_docs} documents, {args.n_predict} tokens each, greedy, "
                    f"{args.threads} threads, {args.slot_ctx} tokens per slot")
    for col in ("run", "generated", "seconds", "aggregate tok/s", "batch is", "same text as batch"):
        t.add_column(col, justify="left" if col == "run" else "right")
    for name, r in rows.items():
        same = sum(r["texts"].get(k) == v for k, v in ref.items())
        t.add_row(name, str(r["generated"]), f"{r['seconds']:.1f}", f"{r['tok_per_s']:.1f}",
                  f"{rows['batch']['tok_per_s'] / r['tok_per_s']:.2f}x", f"{same}/{len(ref)}")
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(t)
    est = rows["batch"]["speedup_estimate"]
    line = f"batch's own estimate of its speedup over plain decoding: {est:.2f}x" if est else ""
    if "batch, spec off" in rows:
        on, off = rows["batch"], rows["batch, spec off"]
        line += (f"; measured against batch --spec-type none: verify steps "
                 f"{off['verify_seconds'] / on['verify_seconds']:.2f}x, aggregate tok/s "
                 f"(prompts included) {on['tok_per_s'] / off['tok_per_s']:.2f}x")
    if line:
        console.print(line)
    for name, r in rows.items():
        if len(r.get("each_tok_per_s", ())) > 1:
            console.print(f"{name}: runs {r['each_tok_per_s']} tok/s, "
                          f"same texts every run: {r['runs_agree']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-docs", type=int, default=44)
    ap.add_argument("-n", "--n-predict", type=int, default=256)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("-np", "--parallel", type=int, default=4)
    ap.add_argument("--slot-ctx", type=int, default=2048)
    ap.add_argument("--check-speedup", action="store_true",
                    help="also run batch with --spec-type none")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run batch and serve this many times each, ABBA order")
    ap.add_argument("--skip-generate", action="store_true")
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--out-dir", default=None, help="keep inputs and outputs here")
    args = ap.parse_args()
    docs = interleave(documents(24, 16, 4, "eval"))[:args.n_docs]
    out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="bench-batch-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    docs_path = out_dir / "docs.jsonl"
    docs_path.write_text("".join(json.dumps({"id": d.id, "prompt": d.prompt}) + "\n" for d in docs))
    batch, serve = paired_runs(lambda: run_batch(docs_path, out_dir, args),
                               lambda: run_serve(docs, args), args.rounds)
    rows = {"batch": batch}
    if args.check_speedup:
        rows["batch, spec off"] = run_batch(docs_path, out_dir, args, "none")
    rows[f"serve -np {args.parallel}, {args.parallel} clients"] = serve
    if not args.skip_generate:
        rows["generate, one at a time"] = run_generate(docs, out_dir, args)
    report(rows, len(docs), args)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(
            {k: {x: y for x, y in v.items() if x != "texts"} for k, v in rows.items()}, indent=1))


if __name__ == "__main__":
    main()
