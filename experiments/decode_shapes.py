#!/usr/bin/env python
"""How the server's generation decodes split into ubatches over a pipeline run (issue 22).

    python experiments/decode_shapes.py --slots 4 [--mode off] [-n 160]

Serves the embedded model with `-np SLOTS` in a child process whose main-context
decodes are counted and timed by shape (sequences in the decode, the ubatches llama.cpp
splits it into per `ubatch.split`, and the idle sequence ids between its lowest and
highest; the prefill twin's prompt chunks on a line of their own), then sends the
held-out documents from SLOTS clients as `bench --parallel` does and prints the counts,
seconds and tokens. With one KV stream per slot, a decode whose sequences are not consecutive ids
runs as one ubatch per run of consecutive ids, each a graph that streams the weights
again: this measures how often that happens (a dummy row in each idle slot would join
the runs). One model process; nothing else may run.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def serve_counting(out_path: str, server_args: list[str]) -> None:
    """Run `ngramspec.server` with Context.run_rows counting shapes: SIGUSR1 clears the
    counts, SIGUSR2 writes them to out_path (uvicorn keeps SIGTERM and SIGINT)."""
    import runpy

    from ngramspec.llama import model, ubatch

    shapes: dict[tuple, list] = {}  # shape -> [decodes, seconds, tokens]
    run_rows = model.Context.run_rows

    def counted(self, entries, pads, pad_logits=None):
        t0 = time.perf_counter()
        rows = run_rows(self, entries, pads, pad_logits)
        seconds = time.perf_counter() - t0
        key: tuple = ("prefill twin", 0, 0, 0)  # a context without a twin: the twin itself
        if self.twin is not None:  # the main context
            lens = [(s, len(t) + pads.get(s, 0)) for s, t, _, _ in entries]
            ids = [s for s, _ in lens]
            n_ub = len(ubatch.split(lens, self.n_ubatch, self.per_seq_streams))
            key = ("main", len(ids), n_ub, max(ids) - min(ids) + 1 - len(ids))
        tally = shapes.setdefault(key, [0, 0.0, 0])
        tally[0] += 1
        tally[1] += seconds
        tally[2] += sum(len(t) for _, t, _, _ in entries)
        return rows

    def dump(*_):
        Path(out_path + ".part").write_text(json.dumps([[*k, *v] for k, v in shapes.items()]))
        os.replace(out_path + ".part", out_path)  # whole when the client sees it

    model.Context.run_rows = counted
    signal.signal(signal.SIGUSR2, dump)
    signal.signal(signal.SIGUSR1, lambda *_: shapes.clear())
    sys.argv = ["ngramspec.server", *server_args]
    runpy.run_module("ngramspec.server", run_name="__main__")


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        serve_counting(sys.argv[2], sys.argv[3:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--mode", default="off", help="off, auto or a spec type")
    ap.add_argument("-n", type=int, default=160)
    a = ap.parse_args()
    import httpx

    from ngramspec.bench.pipeline import load_documents, mode_body
    from ngramspec.server.launch import start_server

    out = f"/tmp/decode_shapes_{os.getpid()}.json"
    srv = start_server(["-np", str(a.slots), "-c", str(4096 * a.slots), "-t", "2", "--temp", "0"],
                       timeout=900, entry=(__file__, "--serve", out))
    body = {"n_predict": a.n, "temperature": 0.0, "cache_prompt": False, **mode_body(a.mode)}
    try:
        with httpx.Client(base_url=srv.url, timeout=1800) as client:
            client.post("/completion", json={**body, "prompt": "Hello"}).raise_for_status()
            srv.proc.send_signal(signal.SIGUSR1)  # the warm-up's decodes not counted
            t0 = time.perf_counter()
            with ThreadPoolExecutor(a.slots) as ex:
                list(ex.map(lambda d: client.post("/completion", json={**body, "prompt": d.prompt})
                            .raise_for_status(), load_documents(None)))
            wall = time.perf_counter() - t0
        srv.proc.send_signal(signal.SIGUSR2)
        while not Path(out).exists() and srv.proc.poll() is None:
            time.sleep(0.1)
    finally:
        srv.stop()
    rows = sorted(json.loads(Path(out).read_text()), key=lambda r: (r[0], -r[4]))
    os.unlink(out)
    print(f"{a.slots} slots, {a.mode}: {wall:.1f} s; decodes by shape")
    print(f"{'context':>12} {'sequences':>10} {'ubatches':>9} {'idle ids inside':>16} "
          f"{'decodes':>8} {'seconds':>8} {'tokens':>7}")
    for ctx, n_seq, n_ub, gaps, count, seconds, tokens in rows:
        print(f"{ctx:>12} {n_seq:10d} {n_ub:9d} {gaps:16d} {count:8d} {seconds:8.2f} {tokens:7d}")
    for ctx in ("main", "prefill twin"):
        mine = [r for r in rows if r[0] == ctx]
        print(f"{ctx}: {sum(r[4] for r in mine)} decodes, {sum(r[5] for r in mine):.2f} s, "
              f"{sum(r[6] for r in mine)} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
