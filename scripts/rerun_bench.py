"""A pipeline re-run with the earlier run's results as predictions (issue 45).

    .venv/bin/python scripts/rerun_bench.py [-np 4] [-n 160] [-t 2] [--reps 2] [--split eval]

12 held-out documents (corpus.py: 6 classes to rename, 6 docstrings to summarise)
run once through `ngramspec batch`. Each is then edited slightly (one non-blank line
removed from its middle) and the edited set runs, reps times interleaved:

- cold:        auto speculation, no --previous;
- previous:    auto, --previous = the first run's results;
- off / off+wrong / auto+wrong: spec-off and auto, without and with a prediction
  that is wrong from its first token (another document's earlier text);
- off+previous: spec-off (no spec type: only the prediction drafts) with --previous,
  reported per record against off as `previous` is against cold;
- seeded, seeded+previous: temperature 0.7 with a fixed seed per record;
- same, same+previous: the documents not edited (a nightly re-run where nothing
  changed), without and with --previous;
- oracle: the edited documents with the cold run's own texts as --previous (the exact
  outputs: what no earlier run can beat, the bound for `previous`).

How much the edit changed each output (the first run's text against the cold run's:
common prefix, difflib ratio) is printed per document kind beside its generation time.

--bound then replays the edited documents offline (no timing noise: the run's decode-cost
curve prices every step), with the cold run's texts as the outputs, without and with the
first run's texts as predictions, through auto's planner and through a clairvoyant one
(each step verifies exactly the longest accepted run of its proposals): how much any
planner with these drafters could gain over cold.

Each batch is its own process, one at a time (2 cores: never two model processes).
It prints the texts' agreement, summed `predicted_ms` (generation) and the
summary's wall time (prompts included, model loading excluded), the best of reps,
and the ratios the issue asks for. --json-out keeps every figure.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from ngramspec.bench.corpus import documents, interleave
from ngramspec.doctor import measured_on, measured_on_line


def edited(prompt: str) -> str:
    """The prompt with the non-blank line nearest its middle removed."""
    lines = prompt.splitlines(keepends=True)
    mid = len(lines) // 2
    for i in sorted(range(len(lines)), key=lambda j: abs(j - mid)):
        if lines[i].strip():
            return "".join(lines[:i] + lines[i + 1:])
    raise ValueError("a document with no text")


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def run_batch(work: Path, name: str, inp: Path, args, extra: list[str]) -> dict:
    """One `ngramspec batch` process: {texts, gen_ms, wall, prediction counts}."""
    out, summ = work / f"{name}.jsonl", work / f"{name}.summary.json"
    for p in (out, summ):
        p.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "ngramspec", "batch", str(inp), "-o", str(out), "-np",
           str(args.parallel), "-n", str(args.n_predict), "-t", str(args.threads),
           "--summary-json", str(summ), *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    s = json.loads(summ.read_text())
    return {"texts": {x["id"]: x["text"] for x in lines},
            "gen_ms": sum(x["timings"]["predicted_ms"] for x in lines),
            "wall": s["wall"], "accepted": s["prediction_accepted"],
            "rejected": s["prediction_rejected"], "drafted": s["drafted"],
            "failed": s["failed"], "path": str(out),
            "records": {x["id"]: x["timings"] for x in lines}}


def wrong_previous(work: Path, first: dict) -> Path:
    """Each id gets the earlier text of another document whose text starts differently
    (so the prediction is wrong from its first token)."""
    ids = list(first["texts"])
    lines = []
    for k, rid in enumerate(ids):
        own = first["texts"][rid]
        other = next(first["texts"][ids[(k + j) % len(ids)]] for j in range(1, len(ids))
                     if first["texts"][ids[(k + j) % len(ids)]][:1] != own[:1])
        lines.append({"id": rid, "line": k + 1, "text": other, "finish_reason": "length",
                      "timings": {}})
    return write(work / "wrong.jsonl", lines)


def best(runs: list[dict]) -> dict:
    """The rep with the shortest wall time (`same` compares every rep's texts)."""
    return min(runs, key=lambda r: r["wall"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-np", "--parallel", type=int, default=4)
    ap.add_argument("-n", "--n-predict", type=int, default=160)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--split", default="eval")
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--bound", action="store_true",
                    help="also replay offline with a clairvoyant planner (modelled seconds)")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="rerun-"))
    docs = interleave(documents(6, 0, 0, args.split) + documents(0, 6, 0, args.split))
    v1 = write(work / "v1.jsonl", [{"id": d.id, "prompt": d.prompt} for d in docs])
    v2 = write(work / "v2.jsonl", [{"id": d.id, "prompt": edited(d.prompt)} for d in docs])
    seeded = write(work / "v2-seeded.jsonl", [{"id": d.id, "prompt": edited(d.prompt),
                                               "temperature": 0.7, "seed": 1000 + i}
                                              for i, d in enumerate(docs)])
    first = run_batch(work, "first", v1, args, [])
    prev = ["--previous", first["path"]]
    wrong = ["--previous", str(wrong_previous(work, first))]
    off = ["--spec-type", "none"]
    modes = {"cold": (v2, []), "previous": (v2, prev), "off": (v2, off),
             "off+previous": (v2, off + prev), "off+wrong": (v2, off + wrong),
             "auto+wrong": (v2, wrong),
             "seeded": (seeded, []), "seeded+previous": (seeded, prev),
             "same": (v1, []), "same+previous": (v1, prev), "oracle": (v2, None)}
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for rep in range(args.reps):
        for m, (inp, extra) in modes.items():
            if m.startswith("seeded") and rep:
                continue  # one rep: only the texts are compared
            if extra is None:  # the oracle: this rep's cold texts, exactly
                extra = ["--previous", runs["cold"][-1]["path"]]
            runs[m].append(run_batch(work, f"{m}-{rep}", inp, args, extra))
    report(args, runs, first)
    if args.bound:
        bounds(v2, first, best(runs["cold"]), args)


def bounds(v2: Path, first: dict, cold: dict, args) -> None:
    """Modelled generation of the edited documents, replayed with the cold texts as the
    outputs (re-tokenized), cold and with the first texts as predictions, by auto's
    planner and by a clairvoyant one (bench/replay.py). Loads the model after every
    batch has finished, for its tokenizer and its cached decode-cost curve."""
    import numpy as np

    from ngramspec.bench.replay import replay_batch
    from ngramspec.engine.runtime import load_engine
    from ngramspec.settings.engine import EngineSettings
    from ngramspec.settings.config import AUTO, SpecConfig
    from ngramspec.speculative.drafters.chains import Chains
    from ngramspec.speculative.drafters.prediction import PredictionDrafter
    from ngramspec.speculative.policy import CostPolicy
    from ngramspec.speculative.pool import HashPool

    spec = SpecConfig().with_types(AUTO)
    eng = load_engine(EngineSettings(None, n_ctx=4096 * args.parallel, threads=args.threads,
                                     n_seq=args.parallel, spec=spec))
    tok = lambda text: np.asarray(eng.model.tokenize(text, add_special=False, parse_special=False),
                                  dtype=np.int32)
    recs = [json.loads(x) for x in v2.read_text().splitlines()]
    streams = [(np.asarray(eng.model.tokenize(r["prompt"]), dtype=np.int32),
                tok(cold["texts"][r["id"]])) for r in recs]
    preds = [tok(first["texts"][r["id"]]) for r in recs]
    speed = {}
    for name, own, clair in (("cold", False, False), ("previous", True, False),
                             ("cold, clairvoyant", False, True), ("previous, clairvoyant", True, True)):
        chain = Chains(HashPool(spec.pool_bytes)).get(spec)
        speed[name] = replay_batch(chain, CostPolicy(eng.policy.cost, compare_all=True),
                                   eng.policy.cost, streams, slots=args.parallel,
                                   own=(lambda i: [PredictionDrafter(preds[i])]) if own else None,
                                   lengths=clairvoyant if clair else None)[1]
    eng.ctx.close()
    print("replayed offline (modelled generation, plain decoding / each): " +
          ", ".join(f"{k} {v:.2f}x" for k, v in speed.items()))
    print(f"previous vs cold, modelled: auto {speed['previous'] / speed['cold']:.2f}x; both "
          f"clairvoyant {speed['previous, clairvoyant'] / speed['cold, clairvoyant']:.2f}x; "
          f"previous clairvoyant vs cold auto {speed['previous, clairvoyant'] / speed['cold']:.2f}x")


def clairvoyant(active: list, options: list) -> list[int]:
    """What a planner that knew each stream would verify this step (`replay_batch`'s
    `lengths`): per sequence the proposal with the longest accepted run, exactly that
    long (nothing rejected, none left unproposed); its options are narrowed to that
    proposal, so `commit(k)` takes it. The bound of any planner with these drafters."""
    import numpy as np

    from ngramspec.speculative.drafters import common_prefix
    from ngramspec.speculative.speculation import DraftOptions

    out = []
    for (_, s), opts in zip(active, options):
        truth = s.generated[s.n_hist - len(s.prompt) + 1:]
        runs = [common_prefix(dr, truth) for _, dr in opts.proposals]
        if not runs or max(runs) == 0:
            out.append(0)
            continue
        best = int(np.argmax(runs))
        s.sp.options = DraftOptions([opts.proposals[best]])
        out.append(runs[best])
    return out


def per_kind(first: dict, b: dict) -> None:
    """Per document kind: how far the edit moved the outputs, and generation seconds."""
    import difflib

    gen = {m: {x["id"]: x["timings"]["predicted_ms"] for x in map(
        json.loads, Path(r["path"]).read_text().splitlines())} for m, r in b.items()}
    for kind in ("edit", "summary"):
        ids = [i for i in first["texts"] if i.startswith(kind)]
        old, new = first["texts"], b["cold"]["texts"]
        pref = [next((j for j, (x, y) in enumerate(zip(old[i], new[i])) if x != y),
                     min(len(old[i]), len(new[i]))) for i in ids]
        ratio = [difflib.SequenceMatcher(None, old[i], new[i], autojunk=False).ratio() for i in ids]
        unchanged = sum(old[i] == new[i] for i in ids)
        sums = {m: sum(gen[m][i] for i in ids) / 1e3 for m in ("cold", "previous", "same",
                                                               "same+previous")}
        print(f"{kind}: {unchanged}/{len(ids)} outputs unchanged by the edit; common prefix "
              f"{sorted(pref)} chars; difflib ratio {min(ratio):.2f}-{max(ratio):.2f}; "
              f"generation s cold {sums['cold']:.1f}, previous {sums['previous']:.1f}, "
              f"same {sums['same']:.1f}, same+previous {sums['same+previous']:.1f}")
    old, new = first["texts"], b["cold"]["texts"]
    for label, ids in (("changed", [i for i in old if old[i] != new[i]]),
                       ("unchanged", [i for i in old if old[i] == new[i]])):
        # the edited documents, by whether the edit changed their output; auto, and
        # spec-off (no spec type: only the prediction drafts), each against its cold run
        for with_prev, cold_m in (("previous", "cold"), ("off+previous", "off")) if ids else ():
            records(label, ids, gen, b, with_prev, cold_m)


def records(label: str, ids: list[str], gen: dict, b: dict, with_prev: str, cold_m: str) -> None:
    """Generation with --previous against cold for the records `ids`, then per record."""
    cold, prev = (sum(gen[m][i] for i in ids) for m in (cold_m, with_prev))
    worst = max(gen[with_prev][i] / gen[cold_m][i] for i in ids)
    print(f"edited, output {label} ({len(ids)}), {with_prev} vs {cold_m}: {prev / cold:.2f}x "
          f"the cold generation ({prev / 1e3:.1f} s vs {cold / 1e3:.1f} s; worst "
          f"record {worst:.2f}x)")
    for i in ids:  # per record: its prediction's drafted / accepted tokens
        t = b[with_prev].get("records", {}).get(i, {})
        print(f"  {i}: {gen[with_prev][i] / gen[cold_m][i]:.2f}x ({cold_m} "
              f"{gen[cold_m][i]:.0f} ms, {with_prev} {gen[with_prev][i]:.0f} ms; "
              f"prediction accepted/rejected {t.get('prediction_n_accepted')}/"
              f"{t.get('prediction_n_rejected')}, all drafts {t.get('draft_n')}/"
              f"{t.get('draft_n_accepted')})")


def report(args, runs: dict[str, list[dict]], first: dict) -> None:
    b = {m: best(r) for m, r in runs.items()}
    ref = b["cold"]["texts"]

    def same(m: str) -> str:
        n = sum(all(r["texts"].get(i) == t for r in runs[m]) for i, t in ref.items())
        return f"{n}/{len(ref)}"

    print(measured_on_line(measured_on()))
    print(f"-np {args.parallel}, "
          f"-n {args.n_predict}, -t {args.threads}, best of {args.reps} reps (wall)")
    print(f"{'mode':<16}{'gen s':>8}{'wall s':>8}{'drafted':>9}{'pred acc':>9}{'pred rej':>9}"
          f"{'same text as cold':>19}")
    for m, r in b.items():
        other = same(m) if not m.startswith(("seeded", "same")) else "-"
        print(f"{m:<16}{r['gen_ms'] / 1e3:>8.2f}{r['wall']:>8.2f}{r['drafted']:>9}"
              f"{r['accepted']:>9}{r['rejected']:>9}{other:>19}")
    s1, s2 = b["seeded"]["texts"], b["seeded+previous"]["texts"]
    print(f"previous vs cold: generation {b['cold']['gen_ms'] / b['previous']['gen_ms']:.2f}x "
          f"faster, wall {b['cold']['wall'] / b['previous']['wall']:.2f}x shorter")
    print(f"a prediction wrong from its first token: spec-off "
          f"{b['off+wrong']['wall'] / b['off']['wall'] - 1:+.1%} wall, "
          f"{b['off+wrong']['gen_ms'] / b['off']['gen_ms'] - 1:+.1%} generation; auto "
          f"{b['auto+wrong']['wall'] / b['cold']['wall'] - 1:+.1%} wall, "
          f"{b['auto+wrong']['gen_ms'] / b['cold']['gen_ms'] - 1:+.1%} generation")
    print(f"bound (the exact outputs as --previous): generation "
          f"{b['cold']['gen_ms'] / b['oracle']['gen_ms']:.2f}x faster, wall "
          f"{b['cold']['wall'] / b['oracle']['wall']:.2f}x shorter")
    print(f"unchanged documents: previous vs cold: generation "
          f"{b['same']['gen_ms'] / b['same+previous']['gen_ms']:.2f}x faster, wall "
          f"{b['same']['wall'] / b['same+previous']['wall']:.2f}x shorter, the same text "
          f"{sum(b['same+previous']['texts'].get(i) == t for i, t in b['same']['texts'].items())}"
          f"/{len(b['same']['texts'])}")
    per_kind(first, b)
    print(f"seeded (temperature 0.7): with --previous the same text "
          f"{sum(s1[i] == s2.get(i) for i in s1)}/{len(s1)}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({m: [{k: v for k, v in r.items()}
                                                        for r in rs] for m, rs in runs.items()},
                                                  indent=1))


if __name__ == "__main__":
    main()
