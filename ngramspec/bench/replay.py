"""Replay: measure a drafter on a recorded token stream, without a model.

`replay` walks a recorded greedy stream exactly as the verify loop would: at
each step the drafter sees the history and the last sampled token, proposes a
draft (capped so the step never overshoots the stream), the draft is checked
against the true continuation, and the step advances by accepted + 1 tokens.

Invariants: steps * 1 + accepted == len(generated) - 1 (each step emits the
accepted draft tokens plus one token from the target); the drafter receives
exactly the calls the engine would make (through one `Speculation`).
"""
from __future__ import annotations

import collections
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
from rich.table import Table

from ..settings.config import SPEC_TYPES, SpecConfig
from ..speculative.cost import Shape
from ..speculative.drafters import DrafterChain, as_tokens, common_prefix
from ..console import out_console
from ..errors import NgramSpecError
from ..llama.context import MAX_INVARIANT_BATCH
from ..speculative.policy import FixedPolicy
from ..speculative.speculation import Speculation
from ..speculative.stats import tokens_per_step


@dataclass
class Stream:
    """A recorded workload: prompt tokens and the target's greedy continuation."""

    name: str
    prompt: np.ndarray
    generated: np.ndarray
    meta: dict = field(default_factory=dict)

    @property
    def tokens(self) -> np.ndarray:
        return np.concatenate([self.prompt, self.generated])


def load_stream(path: str | Path) -> Stream:
    """Load a fixture stream JSON ({"prompt_tokens": [...], "generated_tokens": [...]})."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise NgramSpecError(f"stream file not found: {p}") from None
    except (OSError, ValueError) as e:
        raise NgramSpecError(f"cannot read stream {p}: {e}") from None
    if not isinstance(data, dict) or "prompt_tokens" not in data or "generated_tokens" not in data:
        raise NgramSpecError(f"{p} is not a token stream: expected JSON with "
                             "'prompt_tokens' and 'generated_tokens'")
    return Stream(name=str(data.get("name", p.stem)),
                  prompt=as_tokens(data["prompt_tokens"], f"{p.name}: prompt_tokens"),
                  generated=as_tokens(data["generated_tokens"], f"{p.name}: generated_tokens"),
                  meta={k: v for k, v in data.items() if not k.endswith("_tokens")})


@dataclass
class ReplayResult:
    name: str
    n_prompt: int
    n_generated: int
    steps: int
    drafts: int
    drafted: int
    accepted: int
    draft_ns: np.ndarray
    modelled_speedup: float | None = None  # replay_policy: plain decoding time / modelled time

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens emitted per verify step, bonus token included."""
        return tokens_per_step(self.n_generated - 1, self.steps)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def percentile_us(self, q: float) -> float:
        return float(np.percentile(self.draft_ns, q)) / 1e3 if len(self.draft_ns) else 0.0

    def as_dict(self) -> dict:
        return {"name": self.name, "n_prompt": self.n_prompt, "n_generated": self.n_generated,
                "steps": self.steps, "tokens_per_step": self.tokens_per_step,
                "drafts": self.drafts, "drafted": self.drafted, "accepted": self.accepted,
                "acceptance_rate": self.acceptance_rate,
                "draft_p50_us": self.percentile_us(50), "draft_p99_us": self.percentile_us(99)}


@dataclass
class _Seq:
    """One recorded stream being replayed in a slot."""

    index: int  # position in the streams given
    sp: Speculation
    prompt: np.ndarray
    generated: np.ndarray
    n_hist: int
    sampled: int
    steps: int = 0
    drafts: int = 0
    drafted: int = 0
    accepted: int = 0
    times: list = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.n_hist - len(self.prompt) >= len(self.generated) - 1

    def result(self, name: str) -> ReplayResult:
        return ReplayResult(name, len(self.prompt), len(self.generated), self.steps, self.drafts,
                            self.drafted, self.accepted, np.asarray(self.times, dtype=np.int64))


def _lengths(active: list, opts: list, policy, lengths, per_seq: int, total: int) -> list[int]:
    """This step's draft lengths: `lengths`' (replay_batch) when given, else the planner's."""
    if lengths is not None:
        return lengths(active, opts)
    return policy.plan(opts, [Shape(slot, 1, 1, s.n_hist) for slot, s in active], per_seq, total)


def _verify(s: _Seq, draft: np.ndarray) -> int:
    """Check `draft` against the stream, advance by accepted + 1; return accepted."""
    at = s.n_hist - len(s.prompt)
    truth = s.generated[at + 1:at + 2 + len(draft)]
    n_acc = common_prefix(draft, truth)
    if len(draft):
        s.drafts, s.drafted, s.accepted = s.drafts + 1, s.drafted + len(draft), s.accepted + n_acc
    s.sp.settle([int(t) for t in truth[:n_acc + 1]], n_acc)
    s.n_hist += n_acc + 1
    s.sampled = int(s.generated[s.n_hist - len(s.prompt)])
    s.steps += 1
    return n_acc


def _plain_seconds(cost, streams, slots: int) -> float:
    """Modelled time of plain decoding: one token per running slot per decode."""
    queue = collections.deque((len(p), len(g) - 1) for p, g in streams)
    running: dict[int, list[int]] = {}  # slot -> [history length, steps left]
    seconds = 0.0
    while queue or running:
        for slot in range(slots):
            if slot not in running and queue:
                running[slot] = list(queue.popleft())
        running = {k: v for k, v in running.items() if v[1] > 0}
        if not running:
            continue
        seconds += cost.seconds([Shape(k, 1, 1, v[0]) for k, v in sorted(running.items())])
        for v in running.values():
            v[0], v[1] = v[0] + 1, v[1] - 1
    return seconds


def _start(slot: int, chain: DrafterChain, policy, own: Sequence, index: int,
           prompt: np.ndarray, generated: np.ndarray) -> "_Seq":
    """Stream `index` started in `slot`: its Speculation has begun on the prompt."""
    sp = Speculation(slot, chain, policy, own)
    sp.begin(prompt)
    return _Seq(index, sp, prompt, generated, len(prompt), int(generated[0]))


def replay_batch(chain: DrafterChain, policy, cost, streams: Sequence[tuple[np.ndarray, np.ndarray]],
                 *, slots: int | None = None, max_draft: int | None = None,
                 on_step: Callable[[int, int, int, int], None] | None = None,
                 own: Callable[[int], Sequence] | None = None, lengths: Callable | None = None
                 ) -> tuple[list[ReplayResult], float | None]:
    """Replay recorded streams through `slots` slots (default: one per stream), as a
    server would decode them: waiting streams start when a slot frees.

    Every step each running sequence's Speculation plans, the planner chooses all
    lengths together (as the engine's step does), each draft is checked against its
    stream's true continuation and the sequence advances by accepted + 1. With a
    decode-cost model `cost` each step is priced as one decode of all entries (prompt
    evaluation is left out of both sides); the second value returned is plain
    decoding's modelled time, through the same slots, over that (the speedup).
    `on_step` gets (stream, history length, drafted, accepted); `own(i)` gives stream
    i's own drafters (a prediction: `PredictionDrafter(generated)` is the oracle).
    `lengths(active, options)`: a step's draft lengths instead of the planner's (active:
    (slot, _Seq) pairs), e.g. scripts/rerun_bench.py's clairvoyant planner."""
    streams = [(as_tokens(p, "prompt"), as_tokens(g, "generated")) for p, g in streams]
    slots = slots or len(streams)
    queue = collections.deque(range(len(streams)))
    running: dict[int, _Seq] = {}
    results: list[ReplayResult | None] = [None] * len(streams)
    cap = max_draft if max_draft is not None else 1 << 30
    per_seq = MAX_INVARIANT_BATCH
    total = 512 - slots if cost is not None and cost.per_seq_streams else MAX_INVARIANT_BATCH
    name, seconds = getattr(policy, "name", "policy"), 0.0
    while queue or running:
        for slot in range(slots):
            if slot not in running and queue:
                i = queue.popleft()
                running[slot] = _start(slot, chain, policy, own(i) if own else (), i, *streams[i])
        for slot in [k for k, s in running.items() if s.done]:
            s = running.pop(slot)
            s.sp.end()
            results[s.index] = s.result(name)
        if not running:
            continue
        active = sorted(running.items())
        t0 = time.perf_counter_ns()
        opts = []
        for slot, s in active:
            room = min(cap, len(s.generated) - 2 - (s.n_hist - len(s.prompt)))
            hist = np.concatenate([s.prompt, s.generated[:s.n_hist - len(s.prompt)]])
            opts.append(s.sp.plan(hist, s.sampled, room))
        ks = _lengths(active, opts, policy, lengths, per_seq, total)
        shapes = []
        for (slot, s), k in zip(active, ks):
            draft = s.sp.commit(k)
            s.times.append((time.perf_counter_ns() - t0) // len(active))
            shapes.append(Shape(slot, 1 + len(draft), 1 + len(draft), s.n_hist))
            pos = s.n_hist
            n_acc = _verify(s, draft)
            if on_step is not None:
                on_step(s.index, pos, len(draft), n_acc)
        if cost is not None:
            seconds += cost.seconds(shapes)
    if cost is None or not seconds:
        return results, None
    return results, _plain_seconds(cost, streams, slots) / seconds


def replay_policy(chain: DrafterChain, policy, cost, prompt: np.ndarray, generated: np.ndarray,
                  *, name: str = "", max_draft: int | None = None,
                  on_step: Callable[[int, int, int], None] | None = None) -> ReplayResult:
    """Replay one recorded stream with `policy` (a DraftPolicy) choosing every step's
    draft: `replay_batch` with one sequence. With a decode-cost model `cost`,
    `modelled_speedup` is plain decoding's modelled time over the policy's, so a policy
    can be judged on a recorded stream without a model and without timing noise.
    `on_step` gets (history length, drafted, accepted) after every step."""
    step = None if on_step is None else (lambda i, pos, k, a: on_step(pos, k, a))
    (res,), speedup = replay_batch(chain, policy, cost, [(prompt, generated)],
                                   max_draft=max_draft, on_step=step)
    res.name = name or res.name
    res.modelled_speedup = speedup
    return res


def replay(chain: DrafterChain, prompt: np.ndarray, generated: np.ndarray, *,
           name: str = "", max_draft: int | None = None) -> ReplayResult:
    """Replay `generated` (the target's output after `prompt`) through `chain` with
    llama.cpp's fixed policy: the chain's draft, capped at `max_draft`.

    The first generated token is what prompt processing sampled; every later one
    is produced by a verify step. A draft never exceeds the tokens left minus one.
    """
    return replay_policy(chain, FixedPolicy(), None, prompt, generated,
                         name=name or ",".join(chain.config.types), max_draft=max_draft)


def replay_types(stream: Stream, config: SpecConfig, types: Iterable[str] | None = None,
                 max_draft: int | None = None) -> list[ReplayResult]:
    """Replay every spec type (default: all four) with `config`'s parameters, each on
    a fresh pool, plus the configured chain if it has several types."""
    rows = []
    for t in types or SPEC_TYPES:
        chain = DrafterChain(config.with_types(t))
        rows.append(replay(chain, stream.prompt, stream.generated, name=t, max_draft=max_draft))
    if len(config.types) > 1:
        rows.append(replay(DrafterChain(config), stream.prompt, stream.generated,
                           max_draft=max_draft))
    return rows


# ------------------------------------------------------------------ drafter cost


@dataclass
class CostResult:
    name: str
    history: int
    calls: int
    p50_us: float
    p99_us: float
    ingest_tokens: int
    ingest_tok_per_s: float


def tile(tokens: np.ndarray, length: int) -> np.ndarray:
    reps = -(-length // max(len(tokens), 1))
    return np.tile(tokens, reps)[:length].astype(np.int32)


def drafter_cost(stream: Stream, config: SpecConfig, name: str, history: int = 8192,
                 calls: int = 400, ingest: int = 65536,
                 clock: Callable[[], int] = time.perf_counter_ns) -> CostResult:
    """Per-call draft time at `history` tokens of context, and prompt ingestion rate.

    History is the stream tiled to length; the drafter begins on the first
    `history` tokens and then replays `calls` steps (so it drafts, accepts and
    indexes as in generation). Ingestion times `begin` on a fresh pool with an
    `ingest`-token prompt.
    """
    cfg = config.with_types(name)
    toks = tile(stream.tokens, history + 4 * calls + 2)
    res = replay(DrafterChain(cfg), toks[:history], toks[history:], name=name)
    times = res.draft_ns[:calls]
    big = tile(stream.tokens, ingest)
    chain = DrafterChain(cfg)
    t0 = clock()
    chain.begin(0, big)
    dt = max(clock() - t0, 1)
    return CostResult(name, history, len(times), float(np.percentile(times, 50)) / 1e3,
                      float(np.percentile(times, 99)) / 1e3, ingest, ingest / (dt / 1e9))


def print_replay(name, n_prompt, n_gen, rows, costs, selected) -> None:
    t = Table(title=f"replay: {name} ({n_prompt} prompt + {n_gen} generated tokens)")
    for col in ("drafter", "steps", "tokens/step", "accept rate", "drafts", "drafted",
                "accepted", "draft p50 µs", "draft p99 µs"):
        t.add_column(col, justify="left" if col == "drafter" else "right")
    for r in rows:
        mark = "★ " if r.name in selected else "  "
        t.add_row(mark + r.name, str(r.steps), f"{r.tokens_per_step:.2f}",
                  f"{r.acceptance_rate:.1%}", str(r.drafts), str(r.drafted), str(r.accepted),
                  f"{r.percentile_us(50):.1f}", f"{r.percentile_us(99):.1f}")
    out_console.print(t)
    if costs:
        c = Table(title=f"drafter cost at {costs[0].history} tokens of history")
        for col in ("drafter", "calls", "p50 µs/call", "p99 µs/call", "prompt ingestion"):
            c.add_column(col, justify="left" if col == "drafter" else "right")
        for r in costs:
            c.add_row(r.name, str(r.calls), f"{r.p50_us:.1f}", f"{r.p99_us:.1f}",
                      f"{r.ingest_tok_per_s / 1e6:.2f} M tok/s ({r.ingest_tokens} tokens)")
        out_console.print(c)
