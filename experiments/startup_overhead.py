#!/usr/bin/env python
"""Whole-process `ngramspec generate` runs: does speculation ever lose at start-up?

    python experiments/startup_overhead.py [--runs 10] [--n-predict 256] [--noise]

Held-out prompts from the standard library (ngramspec/bench/corpus.py): a class refactor
(edit) and an open-ended prompt. Each round runs, one process at a time, spec-off,
ngram-mod and auto on both prompts (`generate --json`, greedy), and records the whole
process's wall time, the start-up time up to the first token (process wall minus the
generation's own prompt and predicted time), the calibration time the run reports,
and whether the decode-cost cache file changed. `--noise` starts a CPU-bound process
for 1 s out of every 3 while the runs go on (a shared machine). Prints one JSON
report: per mode and prompt the wall times, start-up overhead over spec-off, speed-up,
and the number of cache rewrites.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ngramspec.bench.corpus import documents  # noqa: E402
from ngramspec.spec.cost import cache_path  # noqa: E402

MODES = {"off": ["--spec-type", "none"], "ngram-mod": ["--spec-type", "ngram-mod"],
         "auto": ["--spec-type", "auto"]}


def cache_digest() -> str:
    p = cache_path()
    return hashlib.sha1(p.read_bytes()).hexdigest() if p.exists() else ""


def run_once(prompt_file: str, mode: str, n_predict: int, threads: int) -> dict:
    cmd = [sys.executable, "-m", "ngramspec", "generate", "-f", prompt_file, "-n", str(n_predict),
           "--temp", "0", "-t", str(threads), "--json", *MODES[mode]]
    before = cache_digest()
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{mode} failed: {p.stderr[-1000:]}")
    out = json.loads(p.stdout)
    gen = (out["timings"]["prompt_ms"] + out["timings"]["predicted_ms"]) / 1e3
    return {"wall": wall, "startup": wall - gen, "gen_s": gen,
            "calibration_s": out["calibration"]["seconds"], "source": out["calibration"]["source"],
            "tokens": out["timings"]["predicted_n"], "cache_rewritten": cache_digest() != before,
            "content_sha": hashlib.sha1(out["content"].encode()).hexdigest()[:12]}


def noise(stop: threading.Event) -> None:
    """A CPU-bound process for 1 s out of every 3 until `stop`."""
    while not stop.is_set():
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        stop.wait(1.0)
        hog.kill()
        hog.wait()
        stop.wait(2.0)


def summarize(runs: list[dict], off: list[dict]) -> dict:
    walls = [r["wall"] for r in runs]
    return {"wall_s": [round(w, 2) for w in walls],
            "startup_overhead_s": [round(r["startup"] - o["startup"], 2) for r, o in zip(runs, off)],
            "speedup_vs_off": [round(o["wall"] / r["wall"], 3) for r, o in zip(runs, off)],
            "calibration_s": [round(r["calibration_s"], 2) for r in runs],
            "sources": sorted({r["source"] for r in runs}),
            "cache_rewrites": sum(r["cache_rewritten"] for r in runs),
            "same_output_as_off": all(r["content_sha"] == o["content_sha"]
                                      for r, o in zip(runs, off)),
            "median_wall_s": round(statistics.median(walls), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--n-predict", type=int, default=256)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--noise", action="store_true")
    a = ap.parse_args()
    docs = {d.kind: d for d in documents(n_edit=1, n_summary=0, n_open=1)}
    tmp = Path(tempfile.mkdtemp(prefix="ngramspec-startup-"))
    files = {}
    for kind in ("edit", "open"):
        files[kind] = str(tmp / f"{kind}.txt")
        Path(files[kind]).write_text(docs[kind].prompt)
    stop = threading.Event()
    hog = threading.Thread(target=noise, args=(stop,), daemon=True)
    if a.noise:
        hog.start()
    results: dict = {(m, k): [] for m in MODES for k in files}
    try:
        for i in range(a.runs):
            for kind, f in files.items():
                for mode in MODES:
                    results[(mode, kind)].append(run_once(f, mode, a.n_predict, a.threads))
            print(f"round {i + 1}/{a.runs} done", file=sys.stderr)
    finally:
        stop.set()
    report = {"runs": a.runs, "n_predict": a.n_predict, "noise": a.noise,
              "prompts": {k: docs[k].id for k in files}}
    for (mode, kind), runs in results.items():
        report[f"{mode}/{kind}"] = summarize(runs, results[("off", kind)])
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
