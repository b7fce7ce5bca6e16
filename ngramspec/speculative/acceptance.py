"""Acceptance statistics -> expected tokens per draft length, and the best length.

A verify step that evaluates `sampled` + K draft tokens emits 1 + A tokens, A = the
accepted draft tokens. With p_i the probability that draft token i is accepted given
tokens 1..i-1 were, E[tokens | K] = 1 + sum_{i<=K} prod_{j<=i} p_j.

Invariant: `AcceptanceStats` estimates p_i from decayed counts with a Beta prior, so an
unseen position is neither certain nor hopeless, and old evidence fades.
"""
from __future__ import annotations

import ctypes as C
import threading
from typing import Sequence

import numpy as np

from . import native
from .cost import MAX_DRAFT

_PRODUCTS, _SUMS = np.multiply.accumulate, np.add.accumulate


def _differences(counts: np.ndarray) -> np.ndarray:
    """r, last position first, with counts[i] = sum(r[:len - i]) (`_suffix_sums`)."""
    d = counts.copy()
    d[:-1] -= counts[1:]
    return d[::-1].copy()


def _suffix_sums(r: np.ndarray) -> np.ndarray:
    """The counts of differences r (`_differences`): one accumulate, read backwards (a view)."""
    return _SUMS(r)[::-1]


class AcceptanceStats:
    """Decayed per-position acceptance counts of one drafter (optionally per sequence).

    offered[i]: drafts whose position i was verified (all earlier accepted);
    accepted[i]: of those, how many accepted position i. Each update multiplies the old
    counts by `decay` and adds the new draft with weight 1; kept lazily (the raw counts
    grow by 1/decay per update and are divided out when read), and as differences (a
    draft that verified positions 0..s-1 adds its weight at s-1 only; the counts are the
    suffix sums), so an update touches two numbers whatever the draft's length.
    """

    # Beta prior of the pooled rate: a cold drafter is trusted at 1/1.1 = 0.91 per
    # token, and one unaccepted pseudo-token of 0.1 keeps the hazard estimate
    # positive but lets a drafter that is never wrong (a copy) reach the long
    # drafts where verification is cheapest per token within a few steps.
    prior_accept = 1.0
    prior_reject = 0.1
    shrink = 1.0  # pseudo-observations pulling each position towards the pool

    def __init__(self, decay: float = 0.97, offered: np.ndarray | None = None,
                 accepted: np.ndarray | None = None):
        self.decay = decay
        self._w = 1.0  # the weight the next update adds, relative to the raw counts
        off = np.zeros(MAX_DRAFT) if offered is None else np.array(offered, dtype=float)
        acc = np.zeros(MAX_DRAFT) if accepted is None else np.array(accepted, dtype=float)
        self._off_sum, self._acc_sum = float(off.sum()), float(acc.sum())
        self._doff, self._dacc = _differences(off), _differences(acc)  # raw, as differences
        self.n_updates = 0
        self._epoch = 0  # rescales of the raw counts (`update`): a record's weight is of its epoch
        self._expected: np.ndarray | None = None
        self._lib = native.kernel()  # C expected tokens (drafting.c), or None: numpy's
        self._ptrs = (self._dacc.ctypes.data, self._doff.ctypes.data) if self._lib else None

    @property
    def offered(self) -> np.ndarray:
        return _suffix_sums(self._doff) / self._w

    @property
    def accepted(self) -> np.ndarray:
        return _suffix_sums(self._dacc) / self._w  # new arrays: the divisions copy

    def update(self, n_offered: int, n_accepted: int) -> tuple:
        """Record a verified draft of length n_offered with n_accepted accepted; returns
        the record (its raw weight, positions seen, accepted, epoch) for `revise`."""
        self._expected = None
        w = self._w = self._w / self.decay
        if w > 1e100:  # fold the scale back into the counts
            self._doff, self._dacc = self._doff / w, self._dacc / w
            self._off_sum, self._acc_sum = self._off_sum / w, self._acc_sum / w
            w = self._w = 1.0
            self._epoch += 1
            if self._lib:
                self._ptrs = (self._dacc.ctypes.data, self._doff.ctypes.data)
        self.n_updates += 1
        return self._move((w, 0, 0, self._epoch), n_offered, n_accepted)

    def revise(self, record: tuple, n_offered: int, n_accepted: int) -> tuple | None:
        """Move an earlier draft (`update`'s record) to n_offered / n_accepted, at its
        own weight (its age unchanged): a declined proposal followed along the output
        (shadow.py). None where the counts were rescaled since: the record stays."""
        if record[3] != self._epoch:
            return None
        self._expected = None
        return self._move(record, n_offered, n_accepted)

    def _move(self, record: tuple, n_offered: int, n_accepted: int) -> tuple:
        w, seen0, acc0, epoch = record
        n_offered = min(n_offered, MAX_DRAFT)
        n_accepted = min(n_accepted, n_offered)
        seen = min(n_accepted + 1, n_offered)  # positions verified: accepted ones + first miss
        for d, old, new in ((self._doff, seen0, seen), (self._dacc, acc0, n_accepted)):
            if old:  # position old - 1, stored last first
                d[MAX_DRAFT - old] -= w
            if new:
                d[MAX_DRAFT - new] += w
        self._off_sum += (seen - seen0) * w  # the counts' sums, kept as they grow (`p`)
        self._acc_sum += (n_accepted - acc0) * w
        return (w, seen, n_accepted, epoch)

    def _pooled(self) -> float:
        """The drafter's pooled acceptance rate over all positions (Beta prior)."""
        w = self._w
        return (self._acc_sum / w + self.prior_accept) / (
            self._off_sum / w + self.prior_accept + self.prior_reject)

    def p(self) -> np.ndarray:
        """Conditional acceptance probability per position (posterior mean).

        Each position shrinks towards the drafter's pooled rate over all positions
        (itself shrunk towards the Beta prior), so positions never offered yet
        inherit what the drafter shows elsewhere: a drafter that is always right
        gets tried at lengths it has not reached before.
        """
        sw = self.shrink * self._w  # the raw counts are w times the decayed ones
        out = _suffix_sums(self._dacc) + sw * self._pooled()
        out /= _suffix_sums(self._doff) + sw
        return out

    def native_terms(self) -> tuple[int, int, float, float]:
        """What drafting.c's ngs_expected takes: the addresses of the count differences
        (accepted, offered), sw and sw x the pooled rate (the C library is loaded)."""
        sw = self.shrink * self._w
        return (*self._ptrs, sw, sw * self._pooled())

    def expected_tokens(self) -> np.ndarray:
        """E[tokens emitted | draft length K] for K = 0..MAX_DRAFT (computed once per
        update; callers must not write into it; a step's options table computes its rows
        in C itself, `best_expected`, and reads this only without the library): by
        drafting.c's `ngs_expected` where the C library is loaded (~2.5 us instead of ~6
        hot), else by numpy; the same values (tests/test_native_drafting.py)."""
        if self._expected is None:
            e = np.empty(MAX_DRAFT + 1)
            if self._lib:
                dacc, doff, sw, prior = self.native_terms()
                self._lib.ngs_expected(dacc, doff, MAX_DRAFT, sw, prior, e.ctypes.data,
                                       MAX_DRAFT + 1)
            else:
                e[0] = 1.0
                _PRODUCTS(self.p(), out=e[1:])  # the ufuncs' own accumulate: np.cumprod and
                _SUMS(e, out=e)  # np.cumsum add ~2 us of wrapping each
            self._expected = e
        return self._expected


_BUFS = threading.local()  # `best_expected`'s ctypes arrays, made once per thread


class OptionsTable:
    """One sequence's buffers that `best_expected` writes: `expected` (float64) and `pick`
    (int64), MAX_DRAFT + 1 each, and their addresses `at`, taken once (numpy's
    `.ctypes.data` costs ~10 us on the cold cache after a decode). A step's DraftOptions
    views them until `Speculation.settle`."""

    __slots__ = ("expected", "pick", "at")

    def __init__(self) -> None:
        self.expected = np.empty(MAX_DRAFT + 1)
        self.pick = np.empty(MAX_DRAFT + 1, dtype=np.int64)
        self.at = (self.expected.ctypes.data, self.pick.ctypes.data)


def best_expected(stats: Sequence[AcceptanceStats], lens: Sequence[int], idx: Sequence[int],
                  table: OptionsTable, scale: float = 1.0) -> int:
    """CostPolicy.options' table of one or several proposals: candidate r (its statistics
    stats[r], its draft's length lens[r], its proposal index idx[r]) offers E[tokens | K]
    for K = 0..lens[r]; per K = 0..top (top = max(lens), at most MAX_DRAFT) the first
    candidate with the most: table.expected[K] its value, table.pick[K] = its idx (pick[0]
    = -1); then, with scale < 1, every value's extra tokens shrunk by it: (E - 1) x scale
    + 1 (DraftTrust.shrink). Writes [:top + 1] of both; returns top. By drafting.c's
    `ngs_best_expected` (one call for the whole table) where the library is loaded, else
    by numpy: the same values (tests/test_native_drafting.py)."""
    lib = native.kernel()
    m = len(stats)
    if lib is None or m > MAX_DRAFT:
        return _best_expected_numpy(stats, lens, idx, table.expected, table.pick, scale)
    b = getattr(_BUFS, "b", None)
    if b is None:
        b = _BUFS.b = tuple((t * (MAX_DRAFT + 1))() for t in (
            C.c_void_p, C.c_void_p, C.c_double, C.c_double, C.c_int32, C.c_int64))
    dacc, doff, sw, prior, ln, ix = b
    for r, s in enumerate(stats):
        dacc[r], doff[r], sw[r], prior[r] = s.native_terms()
    ln[:m] = lens
    ix[:m] = idx
    return lib.ngs_best_expected(dacc, doff, sw, prior, ln, ix, m, *table.at, scale)


def _best_expected_numpy(stats, lens, idx, expected, pick, scale: float = 1.0) -> int:
    """`best_expected` by a numpy table (its reference), into the arrays expected, pick."""
    top = min(max(lens), MAX_DRAFT)
    table = np.full((len(stats), top + 1), -np.inf)  # E[tokens | K] per proposal
    for r, s in enumerate(stats):
        n = min(lens[r], top) + 1
        table[r, :n] = s.expected_tokens()[:n]
    best = table.argmax(axis=0)  # the first of equals: the earlier proposal
    pick[:top + 1] = np.asarray(idx)[best]
    pick[0] = -1
    expected[:top + 1] = table[best, np.arange(top + 1)]
    if scale < 1.0:  # as drafting.c: (E - 1) x scale + 1, in that order
        e = expected[:top + 1]
        np.subtract(e, 1.0, out=e)
        e *= scale
        e += 1.0
    return top


def best_length(stats: AcceptanceStats, cost: np.ndarray, max_len: int) -> tuple[int, float]:
    """(K, tokens per second) maximising E[tokens | K] / t(K+1) over K in 0..max_len.

    `cost` is DecodeCost.table(): cost[K] = t(K+1).
    """
    k_max = int(min(max_len, len(cost) - 1, MAX_DRAFT))
    if k_max <= 0:
        return 0, 1.0 / cost[0]
    rate = stats.expected_tokens()[:k_max + 1] / cost[:k_max + 1]
    k = int(np.argmax(rate))
    return k, float(rate[k])
