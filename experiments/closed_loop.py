"""The pipeline's closed loop in one process, timing generation decodes only.

N slots of one engine; the held-out documents (pipeline_bench.load_documents) queue up
and a freed slot takes the next one, as `ngramspec bench --parallel N` does through the
server, but without HTTP and with each prefill left out of the time, so modes compare on
what speculation changes (generation decodes) with less noise than whole-run wall time.
One engine per mode, one mode after another (never two model processes at once).

    python experiments/closed_loop.py --slots 8 --modes none,ngram-mod,auto [--no-trust auto]

`--no-trust`: these modes run with the planner's DraftTrust factor pinned at 1 (the
planner as it was before draft_trust.py), for comparison in the same run.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ngramspec.settings.config import spec_config_from_options  # noqa: E402
from ngramspec.bench.pipeline import load_documents  # noqa: E402
from ngramspec.engine.runtime import EngineSettings, load_engine  # noqa: E402
from ngramspec.engine.sampling import SamplingParams  # noqa: E402


def run_mode(spec_type: str, n_slots: int, n_predict: int, trust: bool) -> str:
    """One mode through the whole queue; a line with its decode seconds and drafts."""
    eng = load_engine(EngineSettings(n_ctx=4096 * n_slots, threads=2, n_seq=n_slots,
                                     spec=spec_config_from_options(spec_type)))
    if not trust:
        eng.policy.trust = lambda n_seqs: 1.0
    greedy = SamplingParams(temperature=0.0)
    queue = [eng.model.tokenize(d.prompt) for d in load_documents(None)]
    slots: list = [None] * n_slots
    spent, tokens, drafted, accepted = 0.0, 0, 0, 0
    while queue or any(slots):
        for i in range(n_slots):
            if slots[i] is None and queue:
                st = slots[i] = eng.start(i, queue.pop(0), greedy, n_predict)
                first = None
                while first is None:
                    first = eng.prefill(st)
                tokens += len(first.tokens)
        live = [st for st in slots if st is not None]
        t0 = time.perf_counter()
        outs = eng.step(live)
        spent += time.perf_counter() - t0
        tokens += sum(len(o.tokens) for o in outs)
        for i, st in enumerate(slots):
            if st is not None and st.done:
                drafted, accepted = drafted + st.draft_n, accepted + st.draft_n_accepted
                eng.finish(st)
                slots[i] = None
    trust_now = ""
    if trust and hasattr(eng.policy, "realized"):
        trust_now = "  trust (1/2-3/4-7/8+) " + " ".join(
            f"{eng.policy.trust(n):.2f}" for n in (1, 2, 4, 8))
    eng.ctx.close()
    eng.model.close()
    label = spec_type + ("" if trust else " (no trust)")
    return (f"slots {n_slots}  {label:20} decode {spent:6.2f} s  tokens {tokens}  "
            f"drafted {drafted}  accepted {accepted}{trust_now}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--modes", default="none,ngram-mod,ngram-simple,auto")
    ap.add_argument("--no-trust", default="", help="modes also run with trust pinned at 1")
    ap.add_argument("-n", "--n-predict", type=int, default=160)
    a = ap.parse_args()
    runs = [(m, True) for m in a.modes.split(",") if m]
    runs += [(m, False) for m in a.no_trust.split(",") if m]
    for mode, trust in runs:
        print(run_mode(mode, a.slots, a.n_predict, trust), flush=True)


if __name__ == "__main__":
    main()
