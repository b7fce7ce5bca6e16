"""The speedup over plain decoding, measured on a run's own verify steps.

`StepTimer` wraps an Engine (the scheduler calls it like the engine) and times
every `engine.step`: one verify decode of every generating sequence, drafting,
planning and sampling included. From the timed steps it fits llama.cpp's decode
cost (`cost.DecodeCost.fit`, the same model the engine is calibrated with, on
this run's own steps: its undrafted steps are plain decodes) and predicts what
plain decoding would have spent on the same tokens: each step that produced E
tokens for b sequences stands for E / b plain decodes of those b sequences at
their KV lengths (each emitted token costs its sequence one plain step).

    speedup = predicted plain seconds / measured step seconds

Invariants: `seconds` is the summed wall time of the timed steps; only the
scheduler thread calls `step`; at most `keep` steps are held for the fit
(a deterministic reservoir sample), so memory stays bounded on any job.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..cost import DecodeCost, Shape

MIN_STEPS = 8  # fewer timed steps: no estimate


@dataclass
class SpeedStats:
    """A run's verify steps: measured seconds and what plain decoding would have taken."""

    steps: int = 0
    undrafted: int = 0
    seconds: float = 0.0
    plain_seconds: float = 0.0  # 0: no estimate

    @property
    def speedup(self) -> float | None:
        return self.plain_seconds / self.seconds if self.plain_seconds and self.seconds else None

    def __add__(self, other: "SpeedStats") -> "SpeedStats":
        """Several engines (Ray actors): seconds add up; each was fitted on its own steps."""
        both = bool(self.plain_seconds or not self.steps) and bool(other.plain_seconds
                                                                    or not other.steps)
        return SpeedStats(self.steps + other.steps, self.undrafted + other.undrafted,
                          self.seconds + other.seconds,
                          self.plain_seconds + other.plain_seconds if both else 0.0)


class StepTimer:
    """An Engine seen through a stopwatch (every other attribute is the engine's)."""

    def __init__(self, engine, keep: int = 4096):
        self.engine, self.keep = engine, keep
        c = engine.ctx
        self._layout = {"per_seq_streams": c.per_seq_streams, "n_ubatch": c.n_ubatch,
                        "pad": c.invariant}
        self._probe = DecodeCost(1.0, 0.0, 0.0, **self._layout)
        self._samples: list[tuple[list[Shape], float]] = []
        self._rng = random.Random(0)
        self._plain = np.zeros(len(self._probe.coef))  # sum of (E / b) * plain features
        self.stats = SpeedStats()

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def step(self, seqs: Sequence) -> list:
        mask = [not s.done and not s.prefilling for s in seqs]
        active = [(s.seq_id, s.n_hist) for s, m in zip(seqs, mask) if m]
        t0 = time.perf_counter()
        outs = self.engine.step(seqs)
        dt = time.perf_counter() - t0
        if active:
            self._record(active, [o for o, m in zip(outs, mask) if m], dt)
        return outs

    def _record(self, active: list[tuple[int, int]], outs: list, dt: float) -> None:
        shapes = [Shape(sid, 1 + o.drafted, 1 + o.drafted, kv) for (sid, kv), o in zip(active, outs)]
        produced = sum(o.accepted + 1 for o in outs)
        plain = [Shape(sid, 1, 1, kv) for sid, kv in active]
        self._plain += produced / len(active) * self._probe.features(plain)
        st = self.stats
        st.steps += 1
        st.seconds += dt
        st.undrafted += all(o.drafted == 0 for o in outs)
        if len(self._samples) < self.keep:
            self._samples.append((shapes, dt))
        else:
            j = self._rng.randrange(st.steps)
            if j < self.keep:
                self._samples[j] = (shapes, dt)

    def summary(self) -> SpeedStats:
        """The stats with the plain-decoding estimate (fitted now, on the kept steps)."""
        st = SpeedStats(self.stats.steps, self.stats.undrafted, self.stats.seconds)
        if st.steps >= MIN_STEPS:
            cost = DecodeCost.fit(self._samples, **self._layout)
            st.plain_seconds = float(self._plain @ cost.coef)
        return st
