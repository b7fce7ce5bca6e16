#!/usr/bin/env python
"""Would verifying a second branch pay on this CPU? (issue 23, item 3)

    python experiments/branch_proposals.py [-n 160] [--docs 12] [--json-out F]

Runs the held-out pipeline documents through greedy plain decoding (as
`novel_proposals.py` does), then replays each output through the auto drafter chain
step by step, as the engine steps (a step verifies a draft and emits what it accepted
plus one token), under three policies:

- first: the chain's first draft (llama.cpp's chain; the engine today, before the
  planner cuts lengths);
- tree: the first draft A and the first draft B of another drafter that differs from
  it, verified together (B's rows after their common prefix attend to A's cells through
  KV seq_id sets); emits the longer accepted run. The drafters' second choices;
- best: an oracle picks, each step, the draft that is accepted furthest (no extra
  rows): what any choice among the drafters' proposals can reach.

Each policy's steps are priced with this machine's decode times of 1..17 rows, all with
logits, at ~600 cells (timed here, shapes alternated). Prints steps, rows and modelled
generation seconds per policy. It also counts, at steps whose draft is wrong at position
j, how often a one-token branch at j (placed there by an oracle: no real branch knows j)
from token recycling's top-4 table or the history's other n-gram continuations would
be right. One model process; nothing else may run.
"""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from novel_proposals import (Recycling, accepted, decode_seconds, documents_run,  # noqa: E402
                             emit, greedy)
from ngramspec.settings.config import SpecConfig  # noqa: E402
from ngramspec.spec.drafters.chain import DrafterChain  # noqa: E402

POLICIES = ("first", "tree", "best")
MAX_DRAFT = 16


def lookup_alternatives(history: list[int], exclude: int, n_max: int = 4) -> list[int]:
    """Next tokens after the longest suffix (n_max..1 tokens) of `history` found earlier
    in it, most frequent first, without `exclude`."""
    h = np.asarray(history, dtype=np.int32)
    for n in range(n_max, 0, -1):
        windows = np.lib.stride_tricks.sliding_window_view(h[:-1], n)
        starts = np.nonzero((windows == h[-n:]).all(axis=1))[0]
        nxt = Counter(int(h[s + n]) for s in starts if s + n < len(h))
        nxt.pop(exclude, None)
        if nxt:
            return [t for t, _ in nxt.most_common()]
    return []


def choose(policy: str, found: list, truth: list[int]) -> tuple[int, int, int]:
    """(index of the draft whose feedback the chain gets, rows verified, tokens accepted)."""
    drafts = [d.tolist() for _, d in found]
    acc = [accepted(d, truth) for d in drafts]
    if policy == "best":
        k = max(range(len(drafts)), key=lambda j: (acc[j], -len(drafts[j])))
        return k, len(drafts[k]), acc[k]
    other = next((j for j in range(1, len(drafts)) if drafts[j] != drafts[0]), None)
    if policy == "first" or other is None:
        return 0, len(drafts[0]), acc[0]
    rows = len(drafts[0]) + len(drafts[other]) - accepted(drafts[other], drafts[0])
    k = other if acc[other] > acc[0] else 0
    return k, rows, acc[k]


def replay(policy: str, prompt: list[int], out: list[int],
           tops: list[list[int]] | None = None) -> list[tuple[int, int, str]]:
    """One document's steps under `policy`, as (rows the step's decode holds: its token +
    the verified draft rows, draft tokens accepted, kind). Kind "draft" where a drafter
    proposes; where none does, with `tops` (each output token's step top-k), "guess": a
    one-token guess, token recycling's top candidate after the last token from the rows
    verified so far; else "none"."""
    chain = DrafterChain(SpecConfig(types=("auto",)))
    chain.begin(0, np.array(prompt, dtype=np.int32))
    rec, steps, i = Recycling(), [], 0
    while i < len(out) - 1:
        hist = np.array(prompt + out[:i], dtype=np.int32)
        found = chain.propose(0, hist, out[i], MAX_DRAFT, first_only=False)
        truth = out[i + 1:i + 1 + MAX_DRAFT]
        if found:
            k, n_rows, n_a = choose(policy, found, truth)
            chain.commit(0, *found[k])
            chain.accept(0, n_a)
            steps.append((1 + n_rows, n_a, "draft"))
        elif tops is not None and out[i] in rec.adj:
            n_a = accepted(rec.adj[out[i]][:1], truth)
            steps.append((2, n_a, "guess"))
        else:
            n_a = 0
            steps.append((1, 0, "none"))
        if tops is not None:
            for j in range(i, min(i + n_a + 1, len(out))):  # the rows this step computed
                rec.observe(out[j], tops[j])
        i += n_a + 1
    chain.end(0)
    return steps


def oracle_branch_hits(prompt: list[int], out: list[int], tops: list[list[int]],
                       rec: Recycling, tally: Counter) -> None:
    """At first-policy steps whose draft is wrong at j: would a one-token branch at j
    from recycling's table (as of the steps before) or the history be right?"""
    chain = DrafterChain(SpecConfig(types=("auto",)))
    chain.begin(0, np.array(prompt, dtype=np.int32))
    i = 0
    while i < len(out) - 1:
        a = chain.draft(0, np.array(prompt + out[:i], dtype=np.int32), out[i], MAX_DRAFT).tolist()
        truth = out[i + 1:i + 1 + MAX_DRAFT]
        n_a = accepted(a, truth)
        chain.accept(0, n_a)
        if n_a < min(len(a), len(truth)):
            tally["wrong_at_j"] += 1
            before = out[i] if n_a == 0 else a[n_a - 1]
            alts = [t for t in rec.adj.get(before, []) if t != a[n_a]]
            tally["recycling_top1"] += bool(alts) and alts[0] == truth[n_a]
            tally["recycling_top3"] += truth[n_a] in alts[:3]
            look = lookup_alternatives(prompt + out[:i + 1] + a[:n_a], a[n_a])
            tally["lookup_top1"] += bool(look) and look[0] == truth[n_a]
        for k in range(i, min(i + n_a + 1, len(out) - 1)):  # rows this verify computed
            rec.observe(out[k], tops[k])
        i += n_a + 1
    chain.end(0)


def main() -> int:
    a, engine, docs = documents_run(__doc__.split("\n")[0])
    steps: dict[str, list[int]] = {p: [] for p in POLICIES}
    tally: Counter = Counter()
    rec = Recycling()
    for doc in docs:
        prompt, out, tops = greedy(engine, doc.prompt, a.n)
        for p in POLICIES:
            steps[p] += [rows for rows, _, _ in replay(p, prompt, out)]
        oracle_branch_hits(prompt, out, tops, rec, tally)
        print(f"{doc.id}: done", file=sys.stderr)
    cost = decode_seconds(engine, MAX_DRAFT + 1, 600, 9)
    big = max(cost)
    price = lambda n: cost[min(n, big)] + max(0, n - big) * (cost[big] - cost[big - 1])  # noqa: E731
    report = {"decode_ms": {n: round(s * 1e3, 2) for n, s in cost.items()},
              "oracle_branch_at_j": dict(tally), "policies": {}}
    for p, rows in steps.items():
        report["policies"][p] = {"steps": len(rows), "rows": sum(rows),
                                 "modelled_s": round(sum(price(n) for n in rows), 2)}
    return emit(report, a.json_out)


if __name__ == "__main__":
    sys.exit(main())
