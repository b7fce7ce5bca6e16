"""Whether a sequence's next step proposes drafts at all (`Rest`, one per sequence: `Rests`).

Proposing costs host time on every step (the drafters, the planner, the scoring), and it
pays back only through drafted decodes that save decode time. Where a decode is fast and
drafts seldom pay (a small model at several slots, novel text), that host time is the
whole difference to plain decoding. So the cost policy keeps two decayed sums over its
*active* steps (the steps that proposed):
- host: the seconds its own work took (measured around its calls);
- saved: the decode seconds drafting saved, per drafted decode (accepted draft tokens)
  x (the plain decode's seconds per sequence) - (measured - the plain decode's modelled
  seconds): what the same tokens would have cost in plain steps, less the verify's extra.
While saved < host (after WARMUP active steps), the policy rests: a step proposes nothing
(spec-off's host path) except one active step every `period()` steps, the period chosen
so that active steps cost at most SHARE of the (plain) decode time. Those keep both sums and the
acceptance statistics measured. A lone active step sees a copy only as a fresh match (a
short draft), not as the long drafts that following it earns, so when one of them has a
draft accepted whole, the policy is active for a trial of TRIAL steps; a trial after
which saved is still below host doubles the wait before the next one (up to MAX_GAP
steps), a trial that pays resets it. Between active steps a copy would be seen only a
period late, so each resting step still pays one lookup per sequence (its chain's watch:
the drafter keyed on the most tokens, `DrafterChain.watch`); where it matches, that
sequence proposes the watch's draft alone (the other drafters are not asked: at 4 slots
of the 4-block model the planner declined 690 of 703 such wakes, each of which had asked
all four) and the step is measured as an active one (`wake`), so a draft accepted whole
there starts a trial as well; not during the wait after a failed trial (`watching`),
where it would only start the trial that failed. A wake the planner declines (no draft
of it verified) doubles the steps before the watch looks again (up to MAX_WAKE_GAP); a
drafted one resets them: at several slots of a fast decode a lone draft costs an ubatch
of its own (per-sequence KV streams split decodes into equal ubatches), so the planner
declined 605 of 617 wakes of the 4-block model at 4 slots, each paying its proposal, its
plan and its scoring (~100 us in-run) for nothing. The same holds for an active step: one
whose proposals the planner declines (`proposed`, and no draft of them verified) makes
the sequence rest 1, 2, 4, ... steps (up to MAX_DECLINE_GAP) before its next active one,
whatever its sums say, and a drafted one ends that (`_backoff`, the wake's rule too): at
8 slots of the 4-block model a sequence whose copy had paid kept proposing for dozens of
steps after it, the planner declining nearly all of them (a verify row there costs what
a plain row does). Where the decode holds other sequences too, a resting sequence's period
step waits for that gap as well (the longer of the two): at 4 slots of the 4-block model
period steps were ~70% of auto's proposals, nearly all declined (a lone draft there costs
an ubatch). Alone in its decodes it does not: there a declined proposal says only that
this draft did not pay, and the period's steps find copies the watch does not see (the
policy simulator, 1 slot: 1.307 -> 1.295 with the wait).

Each sequence id (a slot) has a Rest of its own (`Rests`): at several slots a sequence that
copies its input keeps drafting while the others rest, and a resting sequence that follows
a copy (its last draft accepted whole) goes on proposing (Speculation._watched). A decode's
time is shared out: each sequence's plain share is the plain decode's seconds over its
sequences, and the verify's extra seconds go to the sequences that drafted, by draft
length; the host time of a step's shared work (the plan, the decode's bookkeeping) goes to
the sequences that worked in it.

Invariants: resting only decides whether a step proposes; emitted tokens never depend on
it. A run starts active. The sums decay per step (half-life HALF_LIFE steps), so what an
old phase of the run showed (a novel opening) fades within a few dozen steps.
"""
from __future__ import annotations

import math
from typing import Sequence

from .cost import Shape


def _backoff(gap: int, drafted: bool, cap: int) -> int:
    """The steps to wait after a step whose proposals the planner saw: none where it
    verified a draft of them, else the last wait doubled (1 at first), at most cap."""
    return 0 if drafted else min(cap, max(1, 2 * gap))


class Rest:
    __slots__ = ("_decay", "host", "saved", "decode_s", "n_active", "n_rested", "active",
                 "_since", "_open", "_accepted", "_step_host", "_trial", "_gap", "_wait",
                 "_whole", "_woken", "_wake_gap", "_since_wake", "_proposed", "_decline_gap",
                 "_since_decline")  # a step reads them per slot
    HALF_LIFE = 32.0  # steps
    WARMUP = 16  # active steps measured before the policy may rest
    SHARE = 0.01  # of the decode time, the most resting's active steps may cost
    MAX_PERIOD = 32
    TRIAL = 8  # active steps after a resting step's draft was accepted whole
    MAX_GAP = 256
    MAX_WAKE_GAP = 32  # steps the watch waits after declined wakes, at most
    MAX_DECLINE_GAP = 32  # steps an active sequence rests after declined proposals, at most

    def __init__(self) -> None:
        self._decay = 0.5 ** (1.0 / self.HALF_LIFE)
        self.host = 0.0  # decayed host seconds of active steps
        self.saved = 0.0  # decayed decode seconds saved by their drafts
        self.decode_s = 0.0  # decayed plain decode seconds of active steps (`decode`)
        self.n_active = 0
        self.n_rested = 0  # steps that proposed nothing because the policy rested
        self.active = True  # whether the current step proposes
        self._since = 0  # steps since the last active one
        self._open: tuple[float, float, int] | None = None  # plain s, measured s, sequences
        self._accepted = 0
        self._step_host = 0.0  # host seconds since the last decode
        self._trial = 0  # active steps left in a trial
        self._gap = 0  # steps to wait after a failed trial before the next
        self._wait = 0  # steps since the last trial ended
        self._whole = False  # a draft of the last drafted decode was accepted whole
        self._woken = False  # a resting step in which a sequence proposes (`wake`)
        self._wake_gap = 0  # steps the watch waits after the last wake (declined: doubled)
        self._since_wake = 0  # steps since the last wake
        self._proposed = False  # the planner was given this sequence's proposals this step
        self._decline_gap = 0  # steps an active sequence rests after a declined step (doubled)
        self._since_decline = 0  # steps since the last active step the planner declined

    def clone(self) -> "Rest":
        """An independent copy (`Fold._schedule` steps one through a run): its slots one by
        one, without copy.copy's reduce protocol (~30 us on the cold cache after a decode)."""
        new = object.__new__(Rest)
        for name in Rest.__slots__:
            setattr(new, name, getattr(self, name))
        return new

    @property
    def watching(self) -> bool:
        """Whether a resting step may look for a copy (`wake`): not while the wait after a
        failed trial lasts (a copy seen there would only start a trial that failed), nor
        within the wait after declined wakes (module docstring)."""
        return self._wait >= self._gap and self._since_wake >= self._wake_gap

    def wake(self) -> None:
        """A sequence proposes in this resting step (its chain's watch saw a copy begin):
        the step is measured as an active one (host, saved, a draft accepted whole)."""
        self._woken = True

    @property
    def worked(self) -> bool:
        """Whether host time was spent for this sequence since the last decode."""
        return self._step_host > 0

    def proposed(self) -> None:
        """The planner chose this step's lengths over proposals of this sequence (the
        decode says whether it verified a draft of them: `decode`'s drafted)."""
        self._proposed = True

    def spent(self, seconds: float) -> None:
        """Host seconds of the policy's own work (counted for the step whose decode ends
        next: its proposals and plan, the scoring of the step before, its observe_decode)."""
        self._step_host += seconds

    def decode(self, plain_s: float, measured_s: float, n_seqs: int, drafted: bool,
               crowded: bool = False) -> None:
        """A generation decode ended the current step (its plain version modelled at
        plain_s; `crowded`: it held other sequences' rows too); decide whether the next
        step proposes."""
        self._close()
        d = self._decay
        self.host, self.saved, self.decode_s = d * self.host, d * self.saved, d * self.decode_s
        woken, self._woken = self._woken, False
        proposed, self._proposed = self._proposed, False
        self._since_wake += 1
        self._since_decline += 1
        if self.active and proposed:
            self._since_decline = 0
            self._decline_gap = _backoff(self._decline_gap, drafted, self.MAX_DECLINE_GAP)
        if woken:
            self._since_wake = 0
            self._wake_gap = _backoff(self._wake_gap, drafted, self.MAX_WAKE_GAP)
        if self.active or woken:
            # what the step's decode costs plain, as the resting steps' decodes do: a
            # drafted decode's longer time would shorten the period below SHARE's
            self.decode_s += plain_s if drafted and plain_s > 0 else measured_s
            self.host += self._step_host
            self.n_active += 1
            if drafted and plain_s > 0 and n_seqs > 0:
                self._open = (plain_s, measured_s, n_seqs)
        else:
            self.n_rested += 1
        self._step_host = 0.0
        self._next(crowded)

    def accepted(self, n_accepted: int, n_drafted: int) -> None:
        """One sequence of the last drafted decode had n_accepted of its n_drafted
        draft tokens accepted."""
        if self._open is not None:
            self._accepted += n_accepted
            self._whole |= 0 < n_drafted == n_accepted

    def period(self) -> int:
        """Steps per active step while resting: its host cost within SHARE of decoding."""
        if self.decode_s <= 0:  # no active step measured yet
            return 2
        return max(2, min(self.MAX_PERIOD, math.ceil(self.host / (self.SHARE * self.decode_s))))

    def _close(self) -> None:
        if self._open is not None:
            plain_s, measured_s, n_seqs = self._open
            self.saved += self._accepted * plain_s / n_seqs - (measured_s - plain_s)
            self._open, self._accepted = None, 0

    def _next(self, crowded: bool) -> None:
        whole, self._whole = self._whole, False
        pays = self.n_active < self.WARMUP or self.saved >= self.host
        if self._trial > 0:
            self._trial -= 1
            if self._trial == 0:  # the trial's verdict
                self._gap = 0 if pays else min(self.MAX_GAP, max(2 * self._gap, self.period()))
                self._wait = 0
        elif whole and not pays and self._wait >= self._gap:
            self._trial = self.TRIAL
        self._wait += 1
        if (pays or self._trial > 0) and self._since_decline >= self._decline_gap:
            self.active, self._since = True, 0
            return
        self._since += 1  # the period's step; among other sequences not within the decline wait
        self.active = self._since >= self.period() and (
            not crowded or self._since_decline >= self._decline_gap)
        if self.active:
            self._since = 0


class Rests:
    """One Rest per sequence id, fed by the cost policy: host seconds per sequence or
    shared, each generation decode shared out (module docstring)."""

    def __init__(self) -> None:
        self._by: dict[int, Rest] = {}
        self._shared = 0.0  # host seconds of work shared by a step's sequences

    def of(self, seq_id: int) -> Rest:
        r = self._by.get(seq_id)
        if r is None:
            r = self._by[seq_id] = Rest()
        return r

    @property
    def n_rested(self) -> int:
        """Sequence steps that proposed nothing because proposing did not pay."""
        return sum(r.n_rested for r in self._by.values())

    def spent(self, seq_id: int | None, seconds: float) -> None:
        """Host seconds of one sequence's work (its proposals, its scoring), or with
        seq_id None of the step's shared work."""
        if seq_id is None:
            self._shared += seconds
        else:
            self.of(seq_id).spent(seconds)

    def decode(self, shapes: Sequence[Shape], plain_s: float, measured_s: float) -> None:
        """A generation decode of `shapes` (one per sequence; n_tokens - 1 draft tokens
        each; plain_s: the plain decode's modelled seconds where any drafted, else 0)
        took measured_s: each sequence's Rest gets its share (module docstring)."""
        rests = [self.of(s.seq_id) for s in shapes]
        shared, self._shared = self._shared, 0.0
        if shared:
            workers = [r for r in rests if r.worked] or rests
            for r in workers:
                r.spent(shared / len(workers))
        n = len(rests)
        total = sum(s.n_tokens for s in shapes) - n
        if not total:
            for r in rests:
                r.decode(0.0, measured_s / n, 1, False, n > 1)
            return
        extra = measured_s - plain_s
        for r, s in zip(rests, shapes):
            k = s.n_tokens - 1
            r.decode(plain_s / n, plain_s / n + extra * k / total, 1, k > 0, n > 1)
