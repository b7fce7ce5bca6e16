"""Cost-aware draft length: verify cost t(K) x acceptance statistics -> best K.

A verify step that evaluates `sampled` + K draft tokens costs t(K+1) seconds
and emits 1 + A tokens, A = accepted draft tokens. With p_i the probability that
draft token i is accepted given tokens 1..i-1 were,
    E[tokens | K] = 1 + sum_{i<=K} prod_{j<=i} p_j
and the step's throughput is E[tokens | K] / t(K+1). `best_length` picks the K
maximising it (K = 0 means: do not draft, plain decode at 1 / t(1)).

Invariants:
- `VerifyCost.t(n)` is positive and non-decreasing in n (measured points are
  made monotone; interpolation is linear, extrapolation extends the last slope).
- `AcceptanceStats` estimates p_i from decayed counts with a Beta prior, so an
  unseen position is neither certain nor hopeless, and old evidence fades.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

MAX_DRAFT = 64


@dataclass
class VerifyCost:
    """Seconds to evaluate a batch of n tokens (all logits), from measured points."""

    sizes: list[int]
    seconds: list[float]

    def __post_init__(self) -> None:
        order = np.argsort(self.sizes)
        self.sizes = [int(self.sizes[i]) for i in order]
        secs = np.maximum.accumulate(np.asarray([self.seconds[i] for i in order], dtype=float))
        self.seconds = [float(s) for s in secs]
        if not self.sizes or self.seconds[0] <= 0:
            raise ValueError("a verify-cost curve needs positive timings")

    def t(self, n: int) -> float:
        xs, ys = self.sizes, self.seconds
        if n <= xs[0]:
            return ys[0]
        if n >= xs[-1]:
            if len(xs) == 1:
                return ys[-1]
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            return ys[-1] + slope * (n - xs[-1])
        return float(np.interp(n, xs, ys))

    def table(self, k_max: int = MAX_DRAFT) -> np.ndarray:
        """t(K+1) for K = 0..k_max."""
        return np.asarray([self.t(k + 1) for k in range(k_max + 1)])

    @classmethod
    def linear(cls, base_s: float, per_token_s: float) -> "VerifyCost":
        """A synthetic curve t(n) = base + per_token * (n - 1) (for tests and fallbacks)."""
        sizes = [1, 2, 4, 8, 16, 32, 64, 65]
        return cls(sizes, [base_s + per_token_s * (n - 1) for n in sizes])


@dataclass
class AcceptanceStats:
    """Decayed per-position acceptance counts of one drafter (optionally per sequence).

    offered[i]: drafts whose position i was verified (all earlier accepted);
    accepted[i]: of those, how many accepted position i.
    """

    decay: float = 0.97
    # Beta prior of the pooled rate: a cold drafter is trusted at 1/1.1 = 0.91 per
    # token, and one unaccepted pseudo-token of 0.1 keeps the hazard estimate
    # positive but lets a drafter that is never wrong (a copy) reach the long
    # drafts where verification is cheapest per token within a few steps.
    prior_accept: float = 1.0
    prior_reject: float = 0.1
    shrink: float = 1.0  # pseudo-observations pulling each position towards the pool
    offered: np.ndarray = field(default_factory=lambda: np.zeros(MAX_DRAFT))
    accepted: np.ndarray = field(default_factory=lambda: np.zeros(MAX_DRAFT))
    n_updates: int = 0

    def update(self, n_offered: int, n_accepted: int) -> None:
        """Record a verified draft of length n_offered with n_accepted accepted."""
        n_offered = min(n_offered, MAX_DRAFT)
        n_accepted = min(n_accepted, n_offered)
        self.offered *= self.decay
        self.accepted *= self.decay
        seen = min(n_accepted + 1, n_offered)  # positions verified: accepted ones + first miss
        self.offered[:seen] += 1
        self.accepted[:n_accepted] += 1
        self.n_updates += 1

    def p(self) -> np.ndarray:
        """Conditional acceptance probability per position (posterior mean).

        Each position shrinks towards the drafter's pooled rate over all positions
        (itself shrunk towards the Beta prior), so positions never offered yet
        inherit what the drafter shows elsewhere: a drafter that is always right
        gets tried at lengths it has not reached before.
        """
        pooled = (self.accepted.sum() + self.prior_accept) / (
            self.offered.sum() + self.prior_accept + self.prior_reject)
        return (self.accepted + self.shrink * pooled) / (self.offered + self.shrink)

    def expected_tokens(self) -> np.ndarray:
        """E[tokens emitted | draft length K] for K = 0..MAX_DRAFT."""
        return np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(self.p()))])


def best_length(stats: AcceptanceStats, cost: np.ndarray, max_len: int) -> tuple[int, float]:
    """(K, tokens per second) maximising E[tokens | K] / t(K+1) over K in 0..max_len.

    `cost` is VerifyCost.table(): cost[K] = t(K+1).
    """
    k_max = int(min(max_len, len(cost) - 1, MAX_DRAFT))
    if k_max <= 0:
        return 0, 1.0 / cost[0]
    rate = stats.expected_tokens()[:k_max + 1] / cost[:k_max + 1]
    k = int(np.argmax(rate))
    return k, float(rate[k])


# ------------------------------------------------------------------ calibration


def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ngramspec" / "verify_cost.json"


def calibrate(measure: Callable[[int], float], sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
              repeats: int = 3) -> VerifyCost:
    """Build a VerifyCost from `measure(n)` = seconds for one n-token verify batch
    (the minimum of `repeats` runs: the least disturbed one)."""
    secs = [min(measure(n) for _ in range(repeats)) for n in sizes]
    return VerifyCost(list(sizes), secs)


PROBE_SIZES = (8, 32)
PROBE_TOLERANCE = 1.5


def _still_valid(curve: VerifyCost, measure: Callable[[int], float]) -> bool:
    """Spot-check a cached curve: re-measure PROBE_SIZES (best of 2) and keep the
    curve only if every probe is within PROBE_TOLERANCE of it. A curve recorded
    while the machine was busy, or before a change of kernels or hardware, would
    otherwise steer every draft length until the cache is deleted by hand."""
    for n in PROBE_SIZES:
        now, cached = min(measure(n) for _ in range(2)), curve.t(n)
        if not (cached / PROBE_TOLERANCE <= now <= cached * PROBE_TOLERANCE):
            return False
    return True


def load_or_calibrate(key: str, measure: Callable[[int], float], refresh: bool = False) -> VerifyCost:
    """The curve for `key` (model file + size + threads + kernels): from the cache
    when a spot check still agrees with it, else measured and cached."""
    path = cache_path()
    data: dict = {}
    if path.exists():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
    if not refresh and key in data:
        try:
            entry = data[key]
            cached = VerifyCost(entry["sizes"], entry["seconds"])
        except (KeyError, TypeError, ValueError):
            cached = None
        if cached is not None and _still_valid(cached, measure):
            return cached
    curve = calibrate(measure)
    data[key] = {"sizes": curve.sizes, "seconds": curve.seconds, "measured_at": time.time()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1))
    except OSError:
        pass  # a read-only home only costs a re-calibration next time
    return curve
