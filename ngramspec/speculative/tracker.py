"""A run's decode-cost model, learnt from the decodes the run makes (`CostTracker`).

Invariants: observing a decode allocates no window and does no fitting (a list
append); a refit's cost does not grow with the run's length (measured: 50-90 us on a warm
cache, ~0.45 ms right after a decode, once per 16 or 64 decodes); every
model it returns keeps DecodeCost's invariants (coefficients >= 0, per-ubatch > 0).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .cost import COEF_FIELDS, DecodeCost, Shape, calibration_shapes, nonneg_active_set


class CostTracker:
    """A run's decode-cost model, refined from the decodes the run makes.

    Each observed decode (its entries, its seconds) is a measurement of the model.
    After FIRST_REFITS observations, then every REFIT_EVERY (every REFIT_EVERY_LATER
    once SETTLED decodes were seen: a refit is a step's largest host cost), the coefficients are
    refitted by weighted least squares on relative error over the run's decodes, older
    ones fading (half-life HALF_LIFE decodes), plus the prior curve's own predictions
    for the calibration shapes (PRIOR_WEIGHT decodes' worth each), **scaled** by how
    the run's decodes compare with the prior (a decayed mean of log(measured /
    predicted)): a backend ten times faster than the prior's machine keeps the prior's
    shape at a tenth of its price, instead of a one-token time fitted to the decodes
    and multi-row verifies priced at the prior's 2-core constants (which then look ten
    times too dear and are never tried). So a machine that becomes slower or faster, or
    a prior measured under other conditions, is corrected within the run, while a
    direction the decodes do not show (long drafts never tried) keeps the scaled prior's
    value; `slope_seen` says whether the last WINDOW decodes show multi-row verifies at
    all (the policy explores while they do not).

    The fit is incremental: a decode is recorded as it comes (its shape and seconds),
    and a refit first folds the decodes recorded since the last one into decayed
    normal equations (a 6x6 matrix), then solves them; so a step pays a list append,
    and a refit a bounded cost (module docstring), whatever the run's length. A decode far off
    the model of the last refit (more than 4x the decayed mean relative residual: a
    preempted one) counts with its weight cut in proportion. Coefficients stay >= 0
    with a positive per-ubatch cost (DecodeCost's invariant)."""

    WINDOW = 256  # decodes `slope_seen` looks back over
    HALF_LIFE = 64.0
    REFIT_EVERY = 16
    REFIT_EVERY_LATER = 64  # after SETTLED decodes: the curve moves slowly (half-life 64)
    SETTLED = 256
    FIRST_REFITS = (1, 4, 8)  # early refits: a start-up measures nothing, the run corrects the prior
    PRIOR_WEIGHT = 0.05
    SLOPE_SAMPLES = 4  # multi-row decodes in the window for the slope to count as seen

    def __init__(self, prior: DecodeCost):
        self.prior = prior
        self.current = prior
        n = len(COEF_FIELDS)
        self._decay = 0.5 ** (1.0 / self.HALF_LIFE)
        self._xtx = np.zeros((n, n))  # decayed sum of w x x^T over the run's decodes
        self._xty = np.zeros(n)  # decayed sum of w y x
        self._log_ratio = np.zeros(2)  # decayed sum of log(measured / prior's), its weight
        self._resid = np.zeros(2)  # decayed sum of relative residuals, its weight
        self._pending: list[tuple[Sequence[Shape], float]] = []  # (a decode's shapes, seconds)
        self._multi = bytearray(self.WINDOW)  # 1: a decode with a multi-token entry
        self._n_multi = 0
        self._since = 0
        self.n_observed = 0  # decodes observed
        self.scale = 1.0  # the prior's price against the run's decodes (at the last refit)
        shapes = calibration_shapes(prior.per_seq_streams, 4, 4096, max(prior.n_ubatch, 512),
                                    prior.pad)
        px = np.array([prior.features(sh) for sh in shapes])
        py = px @ prior.coef
        w = self.PRIOR_WEIGHT / py ** 2  # relative error: each row weighs 1/y^2
        self._prior_xtx = (px * w[:, None]).T @ px  # at scale s: / s^2
        self._prior_xty = (px * (w * py)[:, None]).sum(axis=0)  # at scale s: / s
        self._prior_coef = prior.coef

    def observe(self, shapes: Sequence[Shape], seconds: float) -> DecodeCost:
        """Record one decode (its `shapes` are kept until the next refit: the caller makes
        a new sequence per decode and never changes it); the (possibly refitted) current
        model."""
        self._pending.append((shapes, float(seconds)))  # `_absorb`: DecodeCost.features
        slot = self.n_observed % self.WINDOW
        multi = any(s.n_tokens > 1 for s in shapes)
        self._n_multi += multi - self._multi[slot]
        self._multi[slot] = multi
        self.n_observed += 1
        self._since += 1
        every = self.REFIT_EVERY if self.n_observed < self.SETTLED else self.REFIT_EVERY_LATER
        if self._since >= every or self.n_observed in self.FIRST_REFITS:
            self._since = 0
            self.current = self.refit()
        return self.current

    def _absorb(self) -> None:
        """Fold the decodes recorded since the last refit into the normal equations."""
        rows, self._pending = self._pending, []
        if not rows:
            return
        m = len(rows)
        x = np.empty((m, len(COEF_FIELDS)))
        y = np.empty(m)
        for j, (shapes, sec) in enumerate(rows):
            x[j] = self.prior.features(shapes)
            y[j] = max(sec, 1e-9)
        r = np.abs(x @ self.current.coef - y) / y
        limit = 4.0 * (self._resid[0] / self._resid[1] if self._resid[1] else 1.0) + 1e-3
        age = self._decay ** np.arange(m - 1, -1, -1)  # the newest weighs 1
        w = age * np.minimum(1.0, limit / np.maximum(r, 1e-12)) / y ** 2
        fade = self._decay ** m
        self._xtx = fade * self._xtx + (x * w[:, None]).T @ x
        self._xty = fade * self._xty + x.T @ (w * y)
        ratio = np.clip(y / np.maximum(x @ self._prior_coef, 1e-12), 1e-4, 1e4)
        self._log_ratio = fade * self._log_ratio + [age @ np.log(ratio), age.sum()]
        self._resid = fade * self._resid + [age @ np.minimum(r, 1.0), age.sum()]

    def slope_seen(self) -> bool:
        """Whether the last WINDOW decodes hold SLOPE_SAMPLES with a multi-token entry:
        the fitted slope is the machine's, not the scaled prior's."""
        return self._n_multi >= self.SLOPE_SAMPLES

    def refit(self) -> DecodeCost:
        """The weighted fit described in the class docstring."""
        self._absorb()
        lr, n = self._log_ratio
        s = self.scale = math.exp(lr / n) if n else 1.0
        coef = _nonneg_solve(self._xtx + self._prior_xtx / (s * s), self._xty + self._prior_xty / s)
        return self.prior.with_coef(coef)


def _nonneg_solve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The least-squares coefficients of the normal equations a c = b, each >= 0
    (`cost.nonneg_active_set`); a feature no row has (zero diagonal) stays 0."""
    return nonneg_active_set([bool(a[i, i] > 0) for i in range(len(b))],
                             lambda cols: _solve(a[np.ix_(cols, cols)], b[cols]))


def _solve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a c = b for a square a: by LU (a few us, where lstsq's SVD costs ~50), or by
    least squares where a is singular or the solution is not finite."""
    try:
        c = np.linalg.solve(a, b)
        if np.all(np.isfinite(c)):
            return c
    except np.linalg.LinAlgError:
        pass
    return np.linalg.lstsq(a, b, rcond=None)[0]
