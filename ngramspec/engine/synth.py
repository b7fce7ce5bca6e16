"""Synthetic draft acceptance (llama-server's --spec-synth-len / --spec-synth-rates).

A benchmarking mode: a draft token is accepted at random with a fixed
per-position probability instead of by comparison with the target's token, so a
run's acceptance profile is chosen, not measured. Its output is NOT the model's
(an accepted draft token is emitted whatever the target sampled) and exactness is
not promised; only rate 0 everywhere gives spec-off's tokens.

Invariants (as llama-server):
- `rates[i]` is the unconditional probability that draft position i is accepted;
  rates are in [0, 1] and non-increasing. A length L (mean tokens per step, the
  target's own token included) becomes geometric rates p, p^2, ... with
  1 + p + ... + p^n_max = L.
- Verification samples every row as usual (the sampler chain and its RNG advance
  exactly as without synthesis); position i is then accepted when a uniform draw
  of the sequence's own RNG is below rates[i] / rates[i-1], unless the draft token
  ends generation; the first rejected position emits the target's token.
- The sequence's RNG is seeded by the request's seed (random when unset), so a
  seeded request repeats its acceptance decisions.
"""
from __future__ import annotations

import math
import random
from typing import Sequence

from ..errors import ConfigError
from .sampling import RANDOM_SEED
from ..settings.flag import check_rates


def resolve_rates(length: float | None, rates: Sequence[float] | None,
                  n_max: int) -> tuple[float, ...]:
    """Per-position acceptance rates from --spec-synth-len or --spec-synth-rates
    (empty: synthesis off); ConfigError where llama-server refuses to start."""
    rates = tuple(rates or ())
    if length is None and not rates:
        return ()
    if length is not None and rates:
        raise ConfigError("--spec-synth-len and --spec-synth-rates are mutually exclusive")
    if n_max <= 0:
        raise ConfigError("synthetic acceptance needs speculation with drafts of 1 token or more")
    if rates:
        if len(rates) != n_max:
            raise ConfigError(f"--spec-synth-rates must hold {n_max} values (the draft "
                              f"length), got {len(rates)}")
        return check_rates(rates)
    if not math.isfinite(length) or not 1.0 <= length <= n_max + 1:
        raise ConfigError(f"--spec-synth-len must be within [1, {n_max + 1}], got {length}")
    p = _geometric_ratio(length - 1.0, n_max)
    return tuple(p ** (i + 1) for i in range(n_max))


def _geometric_ratio(target: float, n: int) -> float:
    """p in [0, 1] with p + p^2 + ... + p^n = target (bisection; the sum grows with p)."""
    if target >= n:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(48):
        mid = (lo + hi) / 2
        if sum(mid ** (j + 1) for j in range(n)) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def conditional(rates: Sequence[float]) -> tuple[float, ...]:
    """P(accept position i | positions before it accepted) = rates[i] / rates[i-1]."""
    out, prev = [], 1.0
    for r in rates:
        out.append(r / prev if prev > 0 else 0.0)
        prev = r
    return tuple(out)


class SynthAcceptance:
    """One sequence's synthetic acceptance decisions."""

    def __init__(self, probs: Sequence[float], seed: int):
        self.probs = tuple(probs)
        self.rng = random.Random(seed if seed != RANDOM_SEED else random.getrandbits(32))

    @property
    def n_max(self) -> int:
        """Longest draft the rates cover."""
        return len(self.probs)

    def accept(self, position: int) -> bool:
        """Whether draft position `position` is accepted (one draw per call)."""
        return self.rng.random() < self.probs[position]


def configure(engine, length: float | None, rates: Sequence[float] | None,
              notify=lambda line: None) -> None:
    """Turn synthetic acceptance on for `engine` (server flags); the draft length the
    rates must cover is the longest draft the engine can propose."""
    dd = engine.draft_drafter
    n_max = max(engine.spec.max_draft() if engine.spec.enabled else 0,
                getattr(dd, "n_max", 0) if dd is not None else 0)
    resolved = resolve_rates(length, rates, n_max)
    engine.synth = conditional(resolved)
    if resolved:
        notify("synthetic speculative acceptance is on (benchmarking): the output is not "
               f"the model's; rates {', '.join(f'{r:.6g}' for r in resolved)}")
