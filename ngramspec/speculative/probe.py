"""Bounded exploration: a short draft verified now and then while the cost curve has
seen no multi-row verify, so that a planner whose prior prices verifies too dear
cannot lock itself out.

Why: the decode-cost curve (cost.CostTracker) is learnt from the decodes the run
makes. A run that never verifies a draft only ever shows one-token decodes, from
which no slope can be learnt; if the prior's slope is too steep for this backend
(a GPU, a small model, a big CPU: verifying 8 rows costs about what 1 does), the
planner declines every draft and never learns otherwise. So while the tracker's
window holds fewer than SLOPE_SAMPLES multi-row decodes (`CostTracker.slope_seen`),
a step whose plan drafts nothing but that has a proposal verifies one: the proposal
most likely to be accepted at its first token, at the next of LENGTHS (capped by
the proposal and the room left).

Budget: a probe's net cost is its measured seconds minus what plain decoding would
have spent on the tokens it emitted (the current model's price of the plain decode,
times (sequences + accepted tokens) / sequences). A probe is made only while the
probes' net cost so far plus the next one's modelled extra cost stays within
SHARE of the run's decode time, so exploring costs at most ~2% of a run where
drafts never pay, and nothing where they do (an accepted probe pays for itself).

Invariants: a probe only chooses which tokens are verified, never which are emitted
(exactness is the verify's); `choose` returns None rather than exceed the budget or
the room a step has; a record is opened by `choose` and settled by `close`, which
the policy calls before every plan.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .cost import DecodeCost, Shape
from .speculation import DraftOptions

SHARE = 0.02  # of the run's decode time that probes may cost, net
LENGTHS = (3, 7, 1)  # draft lengths probed in turn: 4, 8 and 2 rows with the sampled token


@dataclass
class _Open:
    seq_id: int
    plain_s: float  # the model's price of the decode without the probe
    n_seqs: int
    measured_s: float | None = None
    accepted: int = 0


@dataclass
class Probe:
    """The probes of one policy (one engine): their budget and the open record."""

    share: float = SHARE
    decode_s: float = 0.0  # every generation decode's measured seconds
    spent_s: float = 0.0  # the probes' net cost (negative where they paid)
    n_probes: int = 0
    _open: _Open | None = None

    def choose(self, options: Sequence[DraftOptions], base: Sequence[Shape], cost: DecodeCost,
               per_seq_max: int, total_max: int) -> list[int] | None:
        """Draft lengths for a probe of this decode (one sequence drafts), or None.
        Call `close` first, once per decode."""
        pick = max((i for i, o in enumerate(options) if o.expected is not None and o.k_max > 0),
                   key=lambda i: options[i].expected[1], default=None)
        if pick is None:
            return None
        room = min(per_seq_max - base[pick].n_tokens, total_max - sum(s.n_tokens for s in base))
        k = min(LENGTHS[self.n_probes % len(LENGTHS)], options[pick].k_max, room)
        if k <= 0:
            return None
        kvs = [s.n_kv for s in base]
        plain = cost.price(tuple((s.seq_id, s.n_tokens, s.n_logits) for s in base), kvs)
        probed = cost.price(tuple((s.seq_id, s.n_tokens + k * (j == pick), s.n_logits + k * (j == pick))
                                  for j, s in enumerate(base)), kvs)
        if self.spent_s + (probed - plain) > self.share * self.decode_s:
            return None
        self._open = _Open(base[pick].seq_id, plain, len(base))
        self.n_probes += 1
        ks = [0] * len(options)
        ks[pick] = k
        return ks

    @property
    def open(self) -> bool:
        """Whether the decode being made (or just made) is a probe."""
        return self._open is not None

    def decode(self, seconds: float) -> None:
        """A generation decode took `seconds` (every one counts towards the budget)."""
        self.decode_s += seconds
        if self._open is not None and self._open.measured_s is None:
            self._open.measured_s = seconds

    def accepted(self, seq_id: int, n_accepted: int) -> None:
        """A sequence of the last decode accepted n_accepted draft tokens."""
        if self._open is not None and self._open.seq_id == seq_id:
            self._open.accepted += n_accepted

    def close(self) -> None:
        """Settle the last decode's probe, if it was one (before the next plan)."""
        r, self._open = self._open, None
        if r is None or r.measured_s is None:
            return
        self.spent_s += r.measured_s - r.plain_s * (r.n_seqs + r.accepted) / r.n_seqs
