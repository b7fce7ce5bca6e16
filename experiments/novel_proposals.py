#!/usr/bin/env python
"""Would guesses for novel text pay on this CPU? (issue 23, proposal sources)

    python experiments/novel_proposals.py [-n 160] [--docs 12] [--json-out F]

Runs the held-out pipeline documents (ngramspec/bench/corpus.py, in the bench's order) one
after the other through greedy plain decoding on the embedded model, keeping each
step's top-4 candidates. At every step it asks the auto drafter chain for a draft (as
the engine would, the drafters told how much of each draft the text confirmed); a step
where no n-gram drafter proposes is a *novel* step. There, each source guesses the
next 1-3 tokens, and the script counts how many the model's greedy output accepts:

- recycling: token recycling's adjacency table (Luo et al. 2024): for each token, the
  top-4 candidates of the last step that emitted it; the guess chains top-1 entries;
- lookup: a dynamic n-gram cache of every earlier output (the same document's and the
  earlier documents', as llama.cpp's lookup cache): the most frequent continuation of
  the longest matching 1-4-gram;
- both: lookup where it has an entry, recycling otherwise.

Then it times the decodes a guess needs in this engine (a one-token step: the token, with
a dummy row only where rule U1 still needs one; with g guesses 1 + g rows, all with
logits) and prints the tokens per second each source would give at novel steps against
plain decoding, and the break-even acceptance. One model process; nothing else may run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ngramspec.settings.config import SpecConfig  # noqa: E402
from ngramspec.bench.corpus import documents, interleave  # noqa: E402
from ngramspec.spec.drafters.chain import DrafterChain  # noqa: E402
from ngramspec.engine.runtime import EngineSettings, load_engine  # noqa: E402

TOP = 4
MAX_GUESS = 3


class Recycling:
    """Adjacency table: token -> the top-TOP candidates of the last step that emitted it."""

    def __init__(self):
        self.adj: dict[int, list[int]] = {}

    def observe(self, token: int, top: list[int]) -> None:
        self.adj[token] = top

    def guess(self, context: list[int], n: int) -> list[int]:
        out, t = [], context[-1]
        while len(out) < n and t in self.adj:
            t = self.adj[t][0]
            out.append(t)
        return out


class Lookup:
    """Dynamic n-gram cache over every emitted output token: (n-gram) -> next counts."""

    def __init__(self, n_max: int = 4):
        self.n_max = n_max
        self.table: dict[tuple, Counter] = defaultdict(Counter)

    def add(self, output: list[int]) -> None:
        """Index the last token of `output` as the continuation of its preceding n-grams."""
        for n in range(1, self.n_max + 1):
            if len(output) > n:
                self.table[tuple(output[-n - 1:-1])][output[-1]] += 1

    def guess(self, context: list[int], n: int) -> list[int]:
        ctx, out = list(context), []
        while len(out) < n:
            nxt = None
            for k in range(self.n_max, 0, -1):
                c = self.table.get(tuple(ctx[-k:]))
                if c:
                    nxt = c.most_common(1)[0][0]
                    break
            if nxt is None:
                break
            out.append(nxt)
            ctx.append(nxt)
        return out


def greedy(engine, prompt: str, n: int) -> tuple[list[int], list[int], list[list[int]]]:
    """Prompt tokens, n greedy output tokens, and each output token's step top-TOP (the
    candidates for the token after it)."""
    ctx = engine.ctx
    toks = engine.model.tokenize(prompt)
    ctx.clear(0)
    ctx.begin_prompt(0, 0)
    step = min(512, ctx.prefill_chunk)
    for p in range(0, len(toks), step):
        holder, rows = ctx.prefill(0, toks[p:p + step], p, last=p + step >= len(toks))
    logits = holder.logits_at(rows[-1])
    out, tops = [], []
    for i in range(n):
        t = int(np.argmax(logits))
        out.append(t)
        rows = ctx.decode([(0, [t], len(toks) + i, True)])
        logits = ctx.logits_at(rows[0][0])
        idx = np.argpartition(-logits, TOP)[:TOP]
        tops.append(idx[np.argsort(-logits[idx])].tolist())
    ctx.clear(0)
    return toks.tolist(), out, tops


def novel_steps(chain: DrafterChain, prompt: list[int],
                out: list[int]) -> tuple[list[int], list[int]]:
    """Indices i (the step that has just emitted out[i]) where no drafter proposes, and
    those where the first drafted token is wrong (a step that emits one token too)."""
    chain.begin(0, np.array(prompt, dtype=np.int32))
    novel, missed = [], []
    for i in range(len(out) - 1):
        hist = np.array(prompt + out[:i], dtype=np.int32)
        d = chain.draft(0, hist, out[i], 16)
        if len(d) == 0:
            novel.append(i)
        else:
            truth = out[i + 1:i + 1 + len(d)]
            n_acc = 0
            while n_acc < len(truth) and int(d[n_acc]) == truth[n_acc]:
                n_acc += 1
            chain.accept(0, n_acc)
            if n_acc == 0:
                missed.append(i)
    chain.end(0)
    return novel, missed


def accepted(guess: list[int], truth: list[int]) -> int:
    n = 0
    while n < len(guess) and n < len(truth) and guess[n] == truth[n]:
        n += 1
    return n


def decode_seconds(engine, max_rows: int, cells: int, reps: int) -> dict[int, float]:
    """Median seconds of a decode of n rows (1..max_rows; padded only where rule U1 still
    applies), every row with logits, after `cells` cells of stream 0; shapes alternated,
    so the host's drift hits them alike."""
    ctx, rng = engine.ctx, np.random.default_rng(0)
    base = rng.integers(1000, 20000, cells).tolist()
    ctx.clear(0)
    for p in range(0, cells, 60):
        ctx.decode([(0, base[p:p + 60], p, False)])
    out: dict[int, list[float]] = defaultdict(list)
    for _ in range(reps):
        for n in range(1, max_rows + 1):
            toks = rng.integers(1000, 20000, n).tolist()
            t0 = time.perf_counter()
            ctx.decode([(0, toks, cells, True)])
            out[n].append(time.perf_counter() - t0)
            ctx.truncate(0, cells)
    ctx.clear(0)
    return {n: statistics.median(v) for n, v in out.items()}


def documents_run(description: str):
    """The command line these replay scripts share (-n, --docs, -t, --json-out), the
    engine, and the held-out documents in the bench's order."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("-n", type=int, default=160)
    ap.add_argument("--docs", type=int, default=12)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--json-out", default=None)
    a = ap.parse_args()
    engine = load_engine(EngineSettings(n_ctx=4096, threads=a.threads))
    return a, engine, interleave(documents())[:a.docs]


def emit(report: dict, json_out: str | None) -> int:
    """Print the report as JSON (and write it to json_out); the exit status."""
    print(json.dumps(report, indent=1))
    if json_out:
        Path(json_out).write_text(json.dumps(report, indent=1))
    return 0


def main() -> int:
    a, engine, docs = documents_run(__doc__.split("\n")[0])
    sources = {"recycling": Recycling(), "lookup": Lookup()}
    pops = ("novel", "one-token")  # no draft; no draft or a draft wrong at its first token
    hits = {(p, s): np.zeros(MAX_GUESS + 1) for p in pops for s in (*sources, "both")}
    proposed: Counter = Counter()
    size: Counter = Counter()
    n_steps = 0
    for doc in docs:
        prompt, out, tops = greedy(engine, doc.prompt, a.n)
        novel, missed = novel_steps(DrafterChain(SpecConfig(types=("auto",))), prompt, out)
        where = {i: ("novel", "one-token") for i in novel} | {i: ("one-token",) for i in missed}
        for i in range(len(out) - 1):
            if i in where:
                ctx, truth = prompt + out[:i + 1], out[i + 1:i + 1 + MAX_GUESS]
                guesses = {s: src.guess(ctx, MAX_GUESS) for s, src in sources.items()}
                guesses["both"] = guesses["lookup"] or guesses["recycling"]
                for p in where[i]:
                    size[p] += 1
                    for s, g in guesses.items():
                        if g:
                            proposed[p, s] += 1
                            hits[p, s][accepted(g, truth)] += 1
            sources["recycling"].observe(out[i], tops[i])
            sources["lookup"].add(prompt[-4:] + out[:i + 1])
        n_steps += len(out) - 1
        print(f"{doc.id}: {len(novel)} novel, {len(missed)} missed of {len(out) - 1}",
              file=sys.stderr)
    rows = decode_seconds(engine, 1 + MAX_GUESS, 300, 15)
    cost = {g: rows[1 + g] for g in range(MAX_GUESS + 1)}  # 1 token + g guesses
    report = {"docs": len(docs), "n_predict": a.n, "steps": n_steps, "population_steps": size,
              "step_ms": {g: round(s * 1e3, 2) for g, s in cost.items()}, "sources": {}}
    for (p, s), h in hits.items():
        n_prop, n_pop = proposed[p, s], size[p]
        row = {"proposed_at": n_prop, "share": round(n_prop / max(n_pop, 1), 3)}
        for g in range(1, MAX_GUESS + 1):  # guessing g tokens wherever the source has them
            acc = sum(min(k, g) * h[k] for k in range(MAX_GUESS + 1))
            # time per emitted token over the population: steps with a guess cost t(g)
            # and emit 1 + accepted; the others stay 1-token steps
            t_with = n_prop * cost[g] + (n_pop - n_prop) * cost[0]
            row[f"guess{g}"] = {"accept_first": round(sum(h[1:]) / max(n_prop, 1), 3),
                                "accepted_per_guess_step": round(acc / max(n_prop, 1), 3),
                                "speed_vs_plain": round((n_pop + acc) / t_with * cost[0], 3)}
        report["sources"][f"{p}/{s}"] = row
    report["break_even_first_accept_1guess"] = round(cost[1] / cost[0] - 1, 3)
    return emit(report, a.json_out)


if __name__ == "__main__":
    sys.exit(main())
