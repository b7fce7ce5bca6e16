"""How far auto's drafts are from what any length choice, and the oracle, could give.

Records the held-out pipeline documents' greedy outputs once (the model, spec auto: the
output is the spec-off output), then replays them without the model through the
calibrated decode-cost model of this machine, and prints modelled generation seconds:

- auto:        the default policy (CostPolicy over the auto drafters);
- clairvoyant: the same drafters' proposals, each step verifying exactly the longest
               proposal prefix the target will accept (no rejected row; an upper bound
               for any choice of lengths over these proposals);
- oracle:      the recorded output itself as a prediction (the benchmark's oracle).

Prompt processing is left out (it is the same for all three). Usage:

    python experiments/policy_bounds.py [--slots 1,4,8] [--n-predict 160] [--streams F]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ngramspec.settings.config import spec_config_from_options  # noqa: E402
from ngramspec.spec.cost import cache_path  # noqa: E402
from ngramspec.spec.drafters.chain import DrafterChain  # noqa: E402
from ngramspec.spec.drafters.prediction import PredictionDrafter  # noqa: E402
from ngramspec.bench.pipeline import load_documents  # noqa: E402
from ngramspec.spec.policy import CostPolicy  # noqa: E402
from ngramspec.bench.replay import _plain_seconds, replay_batch  # noqa: E402
from ngramspec.engine.runtime import EngineSettings, load_engine  # noqa: E402
from ngramspec.engine.sampling import SamplingParams  # noqa: E402
from ngramspec.spec.speculation import NO_OPTIONS, DraftOptions  # noqa: E402


def record(path: Path, n_predict: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(prompt, generated) per document, from `path` if it holds them, else generated."""
    if path.exists():
        data = json.loads(path.read_text())
        if data.get("n_predict") == n_predict:
            return [(np.array(p, np.int32), np.array(g, np.int32)) for p, g in data["streams"]]
    eng = load_engine(EngineSettings(spec=spec_config_from_options(spec_type="auto")))
    out = []
    for doc in load_documents(None):
        prompt = eng.model.tokenize(doc.prompt)
        gen = [t for _, o in eng.generate_step(prompt, SamplingParams(temperature=0.0), n_predict)
               for t in o.tokens]
        out.append((prompt, np.array(gen, np.int32)))
        print(f"recorded {doc.id}: {len(prompt)} + {len(gen)} tokens", file=sys.stderr)
    path.write_text(json.dumps({"n_predict": n_predict,
                                "streams": [[p.tolist(), g.tolist()] for p, g in out]}))
    return out


class Clairvoyant(CostPolicy):
    """Knows each stream's continuation; verifies the longest accepted proposal prefix."""

    def __init__(self, cost, streams):
        super().__init__(cost, compare_all=True)
        self.streams = streams

    def _stream(self, history):
        """The stream whose prompt `history` starts with (prompts are distinct documents)."""
        return next((p, g) for p, g in self.streams
                    if len(history) >= len(p) and np.array_equal(history[:len(p)], p))

    def options(self, sp, history, sampled, room):
        opts = super().options(sp, history, sampled, room)
        prompt, gen = self._stream(history)
        truth = gen[len(history) - len(prompt) + 1:]
        best, pick = 0, -1
        for i, (_, draft) in enumerate(opts.proposals):
            n = min(len(draft), len(truth))
            miss = np.flatnonzero(draft[:n] != truth[:n])
            m = int(miss[0]) if len(miss) else n
            if m > best:
                best, pick = m, i
        if best == 0:
            return NO_OPTIONS
        return DraftOptions(opts.proposals, np.arange(1, best + 2, dtype=float),
                            np.array([-1] + [pick] * best))


def modelled(streams, slots: int, cost, which: str) -> float:
    """Modelled generation seconds of `which` over the streams through `slots` slots."""
    chain = DrafterChain(spec_config_from_options(spec_type="auto"))
    policy = (Clairvoyant(cost, streams) if which == "clairvoyant"
              else CostPolicy(cost, compare_all=True))

    def own(i: int):
        return [PredictionDrafter(streams[i][1][1:])] if which == "oracle" else []
    _, speedup = replay_batch(chain, policy, cost, streams, slots=slots, own=own)
    return _plain_seconds(cost, streams, slots) / speedup


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", default="1,4,8")
    ap.add_argument("--n-predict", type=int, default=160)
    ap.add_argument("--streams", default=None,
                    help="where the recorded outputs are kept between runs (default: next to "
                         "the decode-cost cache)")
    args = ap.parse_args()
    path = Path(args.streams) if args.streams else cache_path().parent / "policy_bounds_streams.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    streams = record(path, args.n_predict)
    for slots in [int(s) for s in args.slots.split(",")]:
        eng = load_engine(EngineSettings(n_ctx=2048 * slots, n_seq=slots,
                                         spec=spec_config_from_options(spec_type="auto")))
        cost = eng.policy.cost
        row = {w: modelled(streams, slots, cost, w) for w in ("auto", "clairvoyant", "oracle")}
        print(f"{slots} slot(s), modelled generation s: " +
              ", ".join(f"{k} {v:.2f}" for k, v in row.items()))
        del eng


if __name__ == "__main__":
    main()
