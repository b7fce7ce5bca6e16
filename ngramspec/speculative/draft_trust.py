"""How much of a drafted decode's predicted speed is realized, per batch size.

The planner (planner.py) drafts when its model says a decode's tokens per second
rise: sum_i E_i[tokens | K_i] / t(decode). Two things make that prediction
optimistic exactly where drafting is worth least:
- the planner keeps the drafts its statistics rate best, so their expected tokens
  are biased upwards (the winner's curse: a fresh match rated at the prior);
- in a decode of many sequences a verify row costs about what a sequence's plain
  row does (8 slots on a 2-core CPU: ~7 ms either way), so a draft is predicted
  to gain a few percent, and the cost model's few-percent errors decide.
Measured on the held-out pipeline (docs/benchmarks-history.md): at 8 slots the drafted
decodes realized less than their predicted rate and the default lost to plain
decoding; at 1 slot the predicted gains are 1.5-3x and a few percent do not matter.

So every drafted decode is scored: predicted rate = (the planner's expected tokens
of the decode) / (its modelled seconds), realized rate = (tokens emitted) /
(measured seconds). Per bucket of batch size (1, 2-3, 4-7, 8-15, 16+ sequences) a
decayed mean of log(realized / predicted), shrunk towards 0 by PRIOR pseudo-decodes,
gives `factor(n)`, at most 1: the planner drafts only when the predicted rate times
the factor still beats plain decoding (`planner.plan`'s `trust`).

The same records also measure the expected tokens alone: per bucket, decayed sums of
the draft tokens the planner expected (E_i[K_i] - 1, before any shrink) and of those
accepted. The expectations run high at every batch size (the planner keeps the drafts
its statistics rate best; measured on the held-out documents, the 4-block model and
Gemma: 0.90 of them accepted at 1 slot, 0.80-0.89 at 4 and 8), and unlike the gate this
changes the lengths, not only whether to draft: `shrink(n)`, their ratio (within
[SHRINK_MIN, 1], TOKEN_PRIOR pseudo-tokens at 1), scales every expected extra token
before the planner sees it (`CostPolicy.options`: E' = 1 + shrink x (E - 1)); the rate
ratio above then measures what is left (the decode's time, the shrink's own error).

Invariants: the factors only decide which drafts are verified, never which tokens are
emitted. Every decode of a bucket decays its sums, drafted or not (the expected
tokens' sums too), so a bucket that stopped drafting returns towards trust 1 within a
few dozen decodes, and towards shrink 1 as its evidence fades below the prior's
(half-life ~35 decodes), and measures again: a shrink that only drafted decodes
decayed held a bucket whose drafts had run high at 0.58 for as long as it declined (the
summarize fixture, 4-block model: 100 steps without a draft while a copy went by).
Records are opened by `decode` (once per generation decode) and filled by `sequence`
(once per sequence of that decode, after it), as the engine calls the policy:
observe_decode, then observe per sequence.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

N_BUCKETS = 5
DECAY = 0.97  # per decode of the bucket (half-life ~23 decodes)
PRIOR = 3.0  # pseudo-decodes at realized = predicted
CLIP = 4.0  # one decode's ratio counts within [1/CLIP, CLIP] (a preempted decode)
TOKEN_DECAY = 0.98  # per decode of the bucket, drafted or not: the expected tokens' evidence
TOKEN_PRIOR = 16.0  # pseudo draft tokens, accepted as expected
SHRINK_MIN = 0.5


def bucket(n_seqs: int) -> int:
    """1 -> 0, 2-3 -> 1, 4-7 -> 2, 8-15 -> 3, 16+ -> 4."""
    return min(max(n_seqs, 1).bit_length() - 1, N_BUCKETS - 1)


@dataclass
class _Record:
    n_seqs: int
    predicted_s: float
    measured_s: float
    predicted_extra: float = 0.0  # sum of E_i[K_i] - 1 over the decode's sequences
    realized_extra: int = 0  # draft tokens accepted
    raw_extra: float = 0.0  # predicted_extra before the shrink (`shrink`)


@dataclass
class DraftTrust:
    """Per batch-size bucket: decayed sum of log(realized / predicted rate) and its weight;
    decayed sums of the draft tokens expected (raw) and accepted."""

    total: list[float] = field(default_factory=lambda: [0.0] * N_BUCKETS)
    weight: list[float] = field(default_factory=lambda: [0.0] * N_BUCKETS)
    expected: list[float] = field(default_factory=lambda: [0.0] * N_BUCKETS)  # raw, decayed
    accepted: list[float] = field(default_factory=lambda: [0.0] * N_BUCKETS)  # decayed
    _open: _Record | None = None

    def factor(self, n_seqs: int) -> float:
        """How far to trust a predicted drafted rate for a decode of n_seqs sequences (<= 1)."""
        self._close()
        b = bucket(n_seqs)
        return min(1.0, math.exp(self.total[b] / (self.weight[b] + PRIOR)))

    def shrink(self, n_seqs: int) -> float:
        """The share of the expected draft tokens that decodes of n_seqs sequences had
        accepted lately (module docstring; [SHRINK_MIN, 1])."""
        self._close()
        b = bucket(n_seqs)
        ratio = (self.accepted[b] + TOKEN_PRIOR) / (self.expected[b] + TOKEN_PRIOR)
        return min(1.0, max(SHRINK_MIN, ratio))

    def decode(self, n_seqs: int, predicted_s: float, measured_s: float, drafted: bool) -> None:
        """A generation decode happened; a drafted one is scored once its sequences report."""
        self._close()
        b = bucket(n_seqs)
        self.total[b] *= DECAY
        self.weight[b] *= DECAY
        self.expected[b] *= TOKEN_DECAY
        self.accepted[b] *= TOKEN_DECAY
        if drafted and predicted_s > 0 and measured_s > 0:
            self._open = _Record(n_seqs, predicted_s, measured_s)

    def sequence(self, expected: float, accepted: int, scale: float = 1.0) -> None:
        """One sequence of the open decode: the planner's E[tokens | K] for its draft
        (its extra tokens shrunk by `scale`: DraftOptions.scale) and the draft tokens
        the target accepted."""
        if self._open is not None:
            self._open.predicted_extra += expected - 1.0
            self._open.raw_extra += (expected - 1.0) / scale
            self._open.realized_extra += accepted

    def _close(self) -> None:
        r, self._open = self._open, None
        if r is None or r.predicted_extra <= 0:
            return
        b = bucket(r.n_seqs)
        self.expected[b] += r.raw_extra
        self.accepted[b] += r.realized_extra
        predicted = (r.n_seqs + r.predicted_extra) / r.predicted_s
        realized = (r.n_seqs + r.realized_extra) / r.measured_s
        ratio = min(max(realized / predicted, 1.0 / CLIP), CLIP)
        self.total[b] += math.log(ratio)
        self.weight[b] += 1.0
