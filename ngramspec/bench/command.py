"""`ngramspec bench`: tok/s with speculation off vs on, measured in one run.

For each workload (fixture prompts and user files) and each mode (off, every
spec type, the oracle), runs greedy generation `reps` times, interleaving modes
(round r runs them in a rotated order) so drift on a shared machine hits all
modes alike. Speedup = median tok/s of a mode / median tok/s of off from the
same run. Every speculative run is also checked token-for-token against off.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from rich.table import Table

from ..console import out_console
from ..errors import ConfigError
from ..settings.config import SPEC_TYPES, SpecConfig, uses_draft_model
from ..engine.engine import Engine
from ..engine.generate import generate
from ..speculative.oracle import OracleDrafter
from ..settings.sampling import SamplingParams
from ..speculative.stats import tokens_per_step

FIXTURE_DIR = Path(__file__).resolve().parent / "fixtures" / "prompts"
GREEDY = SamplingParams(temperature=0.0)


@dataclass
class ModeResult:
    mode: str
    tok_per_s: list[float] = field(default_factory=list)
    tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    drafter_s: float = 0.0
    wall_s: float = 0.0
    host_s: float = 0.0  # generation steps' wall time outside their decodes' compute
    proposed: int = 0  # drafts proposed, verified or not
    declined: int = 0  # of them, not verified
    exact: bool = True

    @property
    def median_tps(self) -> float:
        return statistics.median(self.tok_per_s) if self.tok_per_s else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        return tokens_per_step(self.tokens - len(self.tok_per_s), self.steps)

    @property
    def host_per_step_us(self) -> float:
        return self.host_s / self.steps * 1e6 if self.steps else 0.0

    @property
    def drafter_share(self) -> float:
        return self.drafter_s / self.wall_s if self.wall_s else 0.0


@dataclass
class Workload:
    name: str
    prompt: str


def fixture_workloads() -> list[Workload]:
    return [Workload(p.stem, p.read_text(encoding="utf-8")) for p in sorted(FIXTURE_DIR.glob("*.txt"))]


def _drafter_seconds(engine: Engine) -> float:
    return sum(s.t_draft_us + s.t_accept_us + s.t_begin_us for s in engine.stats().values()) / 1e6


def run_workload(make_engine: Callable[[SpecConfig, object, bool], Engine], work: Workload,
                 modes: Sequence[str], spec: SpecConfig, n_predict: int, reps: int,
                 progress: Callable[[], None] = lambda: None) -> dict[str, ModeResult]:
    """Run every mode `reps` times on one workload; `off` first (it defines the truth)."""
    results = {m: ModeResult(m) for m in modes}
    truth: list[int] | None = None
    prompt_tokens = None
    for r in range(reps):
        order = list(modes[r % len(modes):]) + list(modes[:r % len(modes)])
        if truth is None:  # the oracle and the exactness check need off's tokens first
            order.remove("off")
            order.insert(0, "off")
        for mode in order:
            engine = _engine_for(make_engine, mode, spec, truth, prompt_tokens)
            t0 = time.perf_counter()
            out = generate(engine, work.prompt, GREEDY, n_predict=n_predict,
                           speculative=mode != "off")
            wall = time.perf_counter() - t0
            res, f = results[mode], out.final
            res.tok_per_s.append(f.predicted_per_second)
            res.tokens += f.generation_tokens
            res.steps += f.steps
            res.drafted += f.draft_n
            res.accepted += f.draft_n_accepted
            res.drafter_s += _drafter_seconds(engine)
            res.wall_s += wall
            res.host_s += engine.host_s
            for st in engine.stats().values():
                res.proposed += st.n_prop_drafts
                res.declined += st.n_declined
            if mode == "off" and truth is None:
                truth = out.tokens
                prompt_tokens = engine.model.tokenize(work.prompt)
            elif truth is not None and out.tokens != truth:
                res.exact = False
            progress()
    return results


def _engine_for(make_engine, mode: str, spec: SpecConfig, truth, prompt_tokens) -> Engine:
    """The engine of one mode: make_engine(config, extra drafter, whether -md drafts).
    A draft-model type (draft-simple, ...) has no n-gram drafter of its own: its config
    has no types, and the -md model drafts."""
    if mode == "off":
        return make_engine(SpecConfig(types=()), None, False)
    if mode == "oracle":
        full = np.concatenate([prompt_tokens, np.asarray(truth, dtype=np.int32)])
        return make_engine(SpecConfig(types=(), draft_max=spec.draft_max, policy=spec.policy),
                           OracleDrafter(full), False)
    types, policy = split_mode(mode)
    cfg = spec.with_types(types)
    if policy is not None:
        cfg = replace(cfg, policy=policy)
    return make_engine(cfg, None, uses_draft_model(types))


def split_mode(mode: str) -> tuple[str, str | None]:
    """A bench mode `TYPES[:POLICY]` as (spec types, draft policy or None for
    --draft-policy's): `ngram-mod:fixed` runs llama.cpp's lengths beside a cost-policy
    `auto` in one run."""
    types, _, policy = mode.partition(":")
    if policy and policy not in ("cost", "fixed"):
        raise ConfigError(f"bench mode {mode!r}: the policy after ':' is cost or fixed")
    return types, policy or None


def run_peer(binary: str, model_path: str, work: Workload, spec_types: Sequence[str],
             n_predict: int, reps: int, n_ctx: int, threads: int,
             progress: Callable[[], None] = lambda: None) -> dict[str, float]:
    """Median predicted tok/s of the C++ llama-server per spec type ('none' included)."""
    from .peer import LlamaServerPeer

    out = {}
    for t in ["none", *[t for t in spec_types if t in SPEC_TYPES]]:
        with LlamaServerPeer(binary, model_path, t, n_ctx=n_ctx, threads=threads) as peer:
            peer.complete(work.prompt, 8)  # warm-up
            tps = []
            for _ in range(reps):
                tps.append(peer.complete(work.prompt, n_predict)["timings"]["predicted_per_second"])
                progress()
        out["off" if t == "none" else t] = statistics.median(tps)
    return out


def speedups(results: dict[str, ModeResult]) -> dict[str, float]:
    base = results["off"].median_tps
    return {m: (r.median_tps / base if base else 0.0) for m, r in results.items()}


def to_json(all_results: dict[str, dict[str, ModeResult]], meta: dict,
            peers: dict[str, dict[str, float]] | None = None) -> str:
    out = {"meta": meta, "workloads": {}, "llama_server_tok_per_s": peers or {}}
    for w, res in all_results.items():
        sp = speedups(res)
        out["workloads"][w] = {m: {**asdict(r), "median_tok_per_s": r.median_tps,
                                   "speedup": sp[m], "acceptance_rate": r.acceptance_rate,
                                   "tokens_per_step": r.tokens_per_step,
                                   "drafter_share": r.drafter_share,
                                   "host_per_step_us": r.host_per_step_us}
                               for m, r in res.items()}
    return json.dumps(out, indent=2)


def plot(all_results: dict[str, dict[str, ModeResult]], path: str) -> None:
    """Grouped bar chart of speedup vs off per workload and mode."""
    try:
        import matplotlib
    except ImportError:
        from ..errors import NgramSpecError
        raise NgramSpecError("--plot needs matplotlib: pip install 'ngramspec[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    works = list(all_results)
    modes = [m for m in next(iter(all_results.values())) if m != "off"]
    fig, ax = plt.subplots(figsize=(2 + 1.6 * len(works), 4.5))
    width = 0.8 / max(len(modes), 1)
    for i, m in enumerate(modes):
        vals = [speedups(all_results[w])[m] for w in works]
        ax.bar(np.arange(len(works)) + i * width, vals, width, label=m)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(np.arange(len(works)) + width * (len(modes) - 1) / 2, works)
    ax.set_ylabel("speedup vs spec off (tok/s ratio)")
    ax.set_title("ngramspec bench")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def print_bench(name, res, n_predict, reps, peer=None) -> None:
    """The bench's table of one workload: every mode against spec-off (and llama-server)."""
    sp = speedups(res)
    t = Table(title=f"bench: {name} (greedy, {n_predict} tokens, median of {reps})")
    cols = ["mode", "tok/s", "speedup", "accept rate", "tokens/step", "drafter share",
            "host/step", "proposed/declined", "exact"]
    if peer:
        cols += ["llama-server tok/s", "ours / llama-server"]
    for col in cols:
        t.add_column(col, justify="left" if col == "mode" else "right")
    for mode, r in res.items():
        row = [mode, f"{r.median_tps:.1f}", f"{sp[mode]:.2f}x",
               f"{r.acceptance_rate:.1%}" if r.drafted else "-",
               f"{r.tokens_per_step:.2f}", f"{r.drafter_share:.1%}",
               f"{r.host_per_step_us:.0f} us", f"{r.proposed}/{r.declined}" if r.proposed else "-",
               "yes" if r.exact else "NO"]
        if peer:
            p = peer.get(mode)
            row += [f"{p:.1f}" if p else "-", f"{r.median_tps / p:.2f}x" if p else "-"]
        t.add_row(*row)
    out_console.print(t)
    others = {m: r.median_tps for m, r in res.items() if m not in ("auto", "oracle")}
    if "auto" in res and others:
        best = max(others, key=others.get)
        out_console.print(f"auto vs the best other mode ({best}, {others[best]:.1f} tok/s): "
                          f"{res['auto'].median_tps / others[best]:.2f}x")
    if peer and "auto" in res:
        best = max((v, k) for k, v in peer.items() if k != "off")
        out_console.print(f"auto vs llama-server's best ngram type ({best[1]}, {best[0]:.1f} tok/s):"
                          f" {res['auto'].median_tps / best[0]:.2f}x")
