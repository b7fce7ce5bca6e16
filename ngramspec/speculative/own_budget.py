"""How long a request's own prediction may draft: a loss budget per record (issue 53).

A prediction that is right from its first token makes a record up to ~2.4x faster
(docs/batch.md, "Re-runs"); one that the output leaves at once costs verifies whose
rows the target rejects, and on a CPU a 17-row verify costs about five plain steps. The
acceptance statistics price a prediction by how long it has agreed (policy.py), but at a
record's start, and after a divergence, they are the server's average, so a record whose
output diverges can pay for the others' right predictions. So each record holds a credit
in seconds:

- it starts at START x the plain step's seconds x the prediction's length (about
  START of the prediction's spec-off time);
- a verify of k prediction tokens spends t(k+1) - t(1), the cost model's price of its
  extra rows, and earns (accepted tokens) x t(1), the plain steps they replace; a step
  that verified another drafter's draft earns the prediction what its own proposal would
  have had accepted (the emitted tokens it matched: it was right, whoever drafted);
- the prediction's draft is capped at the longest k whose extra rows the credit covers,
  and at 1 while the credit is positive but covers no row (a probe: a whole accepted
  draft always earns more than its extra rows cost, t(k+1) < (k+1) t(1)).

A right prediction earns a long draft within a step or two; a wrong one stops drafting
once it has spent about START of the record. Where extra rows cost nothing (a fixed-shape
context, llama/fixed_shape.py) nothing is capped.

Invariant: only caps draft lengths, never what is emitted; one instance per sequence.
"""
from __future__ import annotations

import numpy as np

START = 0.015


class OwnBudget:
    """One record's credit for its own prediction's drafts."""

    def __init__(self, n_pred: int):
        self.n_pred = n_pred
        self.credit: float | None = None  # seconds; set at the first cap (the curve known)

    def _seconds(self, cost) -> np.ndarray:
        """The curve's t(K+1) for K = 0..MAX_DRAFT; starts the credit on first use."""
        sec = cost.alone()[0]
        if self.credit is None:
            self.credit = START * float(sec[0]) * self.n_pred
        return sec

    def cap(self, cost) -> int:
        """The longest prediction draft the credit pays for (0: none)."""
        sec = self._seconds(cost)
        if self.credit <= 0:
            return 0
        return max(1, int(np.searchsorted(sec - sec[0], self.credit, side="right")) - 1)

    def settle(self, cost, k: int, accepted: int) -> None:
        """A verify of k prediction tokens (0: the prediction was not verified), `accepted`
        of them accepted (or of its proposal, matched by the emitted tokens)."""
        sec = self._seconds(cost)
        k = min(k, len(sec) - 1)
        self.credit += accepted * float(sec[0]) - float(sec[k] - sec[0])
