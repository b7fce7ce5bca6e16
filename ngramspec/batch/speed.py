"""The speedup over plain decoding, measured on a run's own verify steps.

`StepTimer` wraps an Engine (the scheduler calls it like the engine) and times
every `engine.step`: one verify decode of all generating sequences, drafting,
planning and sampling included. Plain decoding would have produced the same
tokens one per sequence per decode: a step that produced E tokens (accepted + 1
per sequence) for b sequences stands for E / b plain decodes of b sequences.
What one plain decode of b sequences costs is measured on this run's own
undrafted steps with b sequences: they are exactly such decodes, taken from
the same run, machine and load. For an occupancy b that never had an undrafted
step, the price comes from llama.cpp's decode-cost model (`cost.DecodeCost`, the
one the engine is calibrated with) fitted on this run's timed steps.

    speedup = plain seconds (priced as above) / measured step seconds

Invariants: `seconds` is the summed wall time of the timed steps; only the
scheduler thread calls `step`; state is O(slots) plus at most `keep` steps held
for the fit (a deterministic reservoir sample), so memory is bounded on any job.
"""
from __future__ import annotations

import random
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..speculative.cost import FEATURES, DecodeCost, Shape

MIN_STEPS = 8  # fewer timed steps: no fit


@dataclass
class SpeedStats:
    """A run's verify steps: measured seconds and what plain decoding would have taken."""

    steps: int = 0
    undrafted: int = 0
    seconds: float = 0.0
    plain_seconds: float = 0.0  # 0: no estimate
    plain_measured: float = 0.0  # share of plain_seconds priced by undrafted steps (0..1)

    @property
    def speedup(self) -> float | None:
        return self.plain_seconds / self.seconds if self.plain_seconds and self.seconds else None

    def __add__(self, other: "SpeedStats") -> "SpeedStats":
        """Several engines (Ray actors), each priced on its own steps: seconds add up."""
        if (self.steps and not self.plain_seconds) or (other.steps and not other.plain_seconds):
            plain = measured = 0.0  # one side has no estimate, so the sum has none
        else:
            plain = self.plain_seconds + other.plain_seconds
            measured = (self.plain_measured * self.plain_seconds
                        + other.plain_measured * other.plain_seconds) / plain if plain else 0.0
        return SpeedStats(self.steps + other.steps, self.undrafted + other.undrafted,
                          self.seconds + other.seconds, plain, measured)


@dataclass
class _Occupancy:
    """Steps with b generating sequences."""

    plain_steps: float = 0.0  # sum of E / b: plain decodes of b sequences they stand for
    plain_features: np.ndarray = field(default_factory=lambda: np.zeros(len(FEATURES)))  # same, as features
    undrafted: int = 0
    undrafted_seconds: float = 0.0


class StepTimer:
    """An Engine seen through a stopwatch (every other attribute is the engine's)."""

    def __init__(self, engine, keep: int = 4096, clock=time.perf_counter):
        self.engine, self.keep, self.clock = engine, keep, clock
        self._layout = engine.ctx.cost_layout
        self._probe = DecodeCost(1.0, 0.0, 0.0, **self._layout)
        self._samples: list[tuple[list[Shape], float]] = []
        self._rng = random.Random(0)
        self._by_b: dict[int, _Occupancy] = defaultdict(_Occupancy)
        self.stats = SpeedStats()

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def step(self, seqs: Sequence, fold: bool = True) -> list:
        mask = [not s.done and not s.prefilling for s in seqs]
        active = [(s.seq_id, s.n_hist) for s, m in zip(seqs, mask) if m]
        t0 = self.clock()
        outs = self.engine.step(seqs, fold)
        dt = self.clock() - t0
        if active:
            self._record(active, [o for o, m in zip(outs, mask) if m], dt)
        return outs

    def _record(self, active: list[tuple[int, int]], outs: list, dt: float) -> None:
        occ = self._by_b[len(active)]
        k = max(o.decodes for o in outs)  # a folded run (engine/fold.py): k plain decodes
        per_plain = sum(o.accepted + o.decodes for o in outs) / len(active)
        occ.plain_steps += per_plain
        occ.plain_features += per_plain * self._probe.features(
            [Shape(sid, 1, 1, kv) for sid, kv in active])
        st = self.stats
        st.steps += k
        st.seconds += dt
        if all(o.drafted == 0 for o in outs):
            st.undrafted += k
            occ.undrafted += k
            occ.undrafted_seconds += dt
        shapes = [Shape(sid, 1 + o.drafted, 1 + o.drafted, kv) for (sid, kv), o in zip(active, outs)]
        if len(self._samples) < self.keep:
            self._samples.append((shapes, dt / k))
        else:
            j = self._rng.randrange(st.steps)
            if j < self.keep:
                self._samples[j] = (shapes, dt / k)

    def summary(self) -> SpeedStats:
        """The stats with plain decoding priced (see the module docstring)."""
        st = SpeedStats(self.stats.steps, self.stats.undrafted, self.stats.seconds)
        measured = sum(o.plain_steps * o.undrafted_seconds / o.undrafted
                       for o in self._by_b.values() if o.undrafted)
        rest = [o.plain_features for o in self._by_b.values() if not o.undrafted]
        if rest and st.steps < MIN_STEPS:
            return st  # too few steps to fit a price for the occupancies never measured
        fitted = (float(sum(rest) @ DecodeCost.fit(self._samples, **self._layout).coef)
                  if rest else 0.0)
        st.plain_seconds = measured + fitted
        st.plain_measured = measured / st.plain_seconds if st.plain_seconds else 0.0
        return st
