"""Per-drafter counters with llama.cpp's meaning, and their llama.cpp-style lines.

These are the project's only draft counters: the server's spec_decode_* totals are
their sum over drafters (`total`), never a second count.

Invariants: `n_acc_tokens <= n_gen_tokens`; `n_acc_drafts <= n_gen_drafts <= n_prop_drafts`;
`acc_per_pos[i]` counts drafts whose first i+1 tokens were accepted, so it is
non-increasing in i and `sum(acc_per_pos) == n_acc_tokens`; its length is the
longest draft verified (positions offered and never accepted show as 0).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DrafterStats:
    """What llama.cpp's `common_speculative_print_stats` reports for one implementation,
    and what it cannot: the drafts proposed (`n_prop_*`) beside those verified
    (`n_gen_*`), so a policy's declined proposals show (`n_declined`)."""

    name: str
    n_call_begin: int = 0
    n_call_draft: int = 0
    n_call_accept: int = 0
    n_gen_drafts: int = 0
    n_acc_drafts: int = 0
    n_gen_tokens: int = 0
    n_acc_tokens: int = 0
    t_begin_us: float = 0.0
    t_draft_us: float = 0.0
    t_accept_us: float = 0.0
    acc_per_pos: list[int] = field(default_factory=list)
    n_prop_drafts: int = 0  # drafts proposed (verified or not): a policy may decline them
    n_prop_tokens: int = 0

    @property
    def n_declined(self) -> int:
        """Proposed drafts that were not verified (the policy chose another, or none)."""
        return self.n_prop_drafts - self.n_gen_drafts

    def record_accept(self, n_accepted: int, n_drafted: int = 0) -> None:
        """One verified draft of `n_drafted` tokens, of them `n_accepted` accepted."""
        self.n_call_accept += 1
        count_accepted(self.acc_per_pos, n_accepted, n_drafted)
        if n_accepted > 0:
            self.n_acc_drafts += 1
            self.n_acc_tokens += n_accepted

    @property
    def acceptance_rate(self) -> float:
        return self.n_acc_tokens / self.n_gen_tokens if self.n_gen_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted tokens per verified draft (llama.cpp's `#mean acc len`)."""
        return 1.0 + self.n_acc_tokens / self.n_call_accept if self.n_call_accept else 1.0

    def line(self) -> str:
        """llama.cpp's `statistics <type>: ...` line."""
        name = self.name.replace("-", "_")
        return (f"statistics {name}: #calls(b,g,a) = {self.n_call_begin} {self.n_call_draft} "
                f"{self.n_call_accept}, #gen drafts = {self.n_gen_drafts}, #acc drafts = "
                f"{self.n_acc_drafts}, #gen tokens = {self.n_gen_tokens}, #acc tokens = "
                f"{self.n_acc_tokens}, dur(b,g,a) = {self.t_begin_us / 1e3:.3f}, "
                f"{self.t_draft_us / 1e3:.3f}, {self.t_accept_us / 1e3:.3f} ms, "
                f"#prop drafts = {self.n_prop_drafts}, #declined = {self.n_declined}")

    def add(self, other: DrafterStats) -> None:
        """Add `other`'s counts and times into these (the name stays)."""
        for k, v in list(other.__dict__.items()):
            if k == "acc_per_pos":
                self.acc_per_pos += [0] * (len(v) - len(self.acc_per_pos))
                for i, x in enumerate(v):
                    self.acc_per_pos[i] += x
            elif k != "name":
                setattr(self, k, getattr(self, k) + v)

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items()}
        d["n_declined"] = self.n_declined
        d["acceptance_rate"] = self.acceptance_rate
        d["mean_acceptance_length"] = self.mean_acceptance_length
        return d


def total(stats: dict[str, DrafterStats], name: str = "all") -> DrafterStats:
    """Every drafter's counts added into one."""
    out = DrafterStats(name)
    for st in list(stats.values()):
        out.add(st)
    return out


def count_accepted(per_pos: list[int], n_accepted: int, n_drafted: int = 0) -> None:
    """Count one verified draft in an accepted-per-position histogram: per_pos[i] += 1
    for each of its first n_accepted positions; the list grows to max(n_accepted,
    n_drafted) entries (the positions offered, for a histogram that shows misses)."""
    want = max(n_accepted, n_drafted)
    if len(per_pos) < want:
        per_pos.extend([0] * (want - len(per_pos)))
    for i in range(n_accepted):
        per_pos[i] += 1


def tokens_per_step(emitted: int, steps: int) -> float:
    """Mean tokens one verify step emits (its accepted draft tokens + 1): `emitted` is
    what `steps` steps emitted (a prompt's first token, which no step emits, excluded).
    1.0, plain decoding's value, when no step ran. Every tokens-per-step figure of the
    project (generate, bench, replay, the pipeline bench, batch) is this one."""
    return emitted / steps if steps else 1.0


def acceptance_line(accepted: int, generated: int) -> str:
    """llama.cpp's `draft acceptance rate = ...` line."""
    rate = accepted / generated if generated else 0.0
    return f"draft acceptance rate = {rate:.5f} ({accepted:5d} accepted / {generated:5d} generated)"


CALIBRATION_SOURCES = {"cache": "cached curve, refined from this run's decodes",
                       "default": "no cached curve yet: the default curve, learnt from this "
                                  "run's decodes",
                       "measured": "measured in full and cached"}


def calibration_line(cal) -> str:
    """The start-up time spent on the decode-cost model (cost.Calibration), and how."""
    return (f"decode-cost calibration: {cal.seconds:.2f} s "
            f"({CALIBRATION_SOURCES.get(cal.source, cal.source)})")


def timings(n_prompt: int, prompt_ms: float, n_predicted: int, predicted_ms: float,
            draft_n: int = 0, draft_n_accepted: int = 0, cache_n: int = 0,
            prediction: tuple[int, int] | None = None, host_ms: float | None = None,
            verify_steps: int = 0) -> dict:
    """llama.cpp's `timings` object (server-common.cpp): prompt_n counts the prompt
    tokens evaluated (cache_n were reused); the generation rate counts the tokens
    after the first, which the prompt's logits give; draft fields only when
    something was drafted. Ours on top: with a request's `prediction` = (drafted,
    accepted) of its tokens, `prediction_n_accepted` and `prediction_n_rejected` (the
    verified ones: part of draft_n / draft_n_accepted; OpenAI's usage counts as rejected
    every prediction token not in the completion, `render.usage`);
    with `host_ms` (the generation steps' wall time outside their decodes' compute:
    drafting, planning, sampling, bookkeeping) `host_ms` and `host_per_step_us` over
    its `verify_steps` steps (decodes, not tokens)."""
    steps = max(n_predicted - 1, 0)
    t = {"cache_n": cache_n, "prompt_n": n_prompt, "prompt_ms": prompt_ms,
         "prompt_per_token_ms": prompt_ms / n_prompt if n_prompt else 0.0,
         "prompt_per_second": n_prompt / (prompt_ms / 1e3) if prompt_ms > 0 else 0.0,
         "predicted_n": n_predicted, "predicted_ms": predicted_ms,
         "predicted_per_token_ms": predicted_ms / steps if steps else 0.0,
         "predicted_per_second": steps / (predicted_ms / 1e3) if predicted_ms > 0 else 0.0}
    if draft_n:
        t["draft_n"] = draft_n
        t["draft_n_accepted"] = draft_n_accepted
    if host_ms is not None:
        t["host_ms"] = host_ms
        t["host_per_step_us"] = host_ms * 1e3 / verify_steps if verify_steps else 0.0
    if prediction is not None:
        t["prediction_n_accepted"] = prediction[1]
        t["prediction_n_rejected"] = prediction[0] - prediction[1]
    return t
