"""Draft policies: which drafts a sequence could verify, and what each is worth.

- `FixedPolicy`: llama.cpp's behaviour. The chain's first non-empty draft, at
  the drafter's own length (capped by --draft-max and the room left).
- `CostPolicy`: per step, every proposal's expected tokens E[tokens | K] for each
  length K (cost.py); the batch planner (planner.py) then chooses every
  sequence's K together against the decode cost, K = 0 when plain decoding is
  faster. With `compare_all` (auto mode) every drafter proposes each step.
- Both learn only from what the target emitted: after each step, every
  proposal of that step (verified or not) is scored against the emitted tokens
  ("shadow" drafts), so a policy that stopped drafting notices when drafting
  would pay again without spending a verify on it.
- `CostPolicy` keeps its statistics per drafter AND per run state: "copy" when
  the sequence's previous step verified a draft and accepted all of it (the
  output is following a copy), "fresh" otherwise (after novel text or a broken
  draft). A copy that is being followed tends to go on; a match found afresh,
  often by a short key, breaks far sooner (measured on held-out recorded
  streams: mean accepted length 34 vs 13 tokens), and one set of statistics for
  both drafted the fresh matches far too long.
- `CostPolicy` shrinks every expected extra token by the share of them accepted lately
  at the batch size (`DraftTrust.shrink`: the planner's pick of the best-rated drafts
  makes them run high, ~10-20% measured), so the lengths it chooses are priced on
  calibrated tokens.

Invariant: a policy only chooses *which* tokens are verified; every emitted
token still comes from the target's sampler, so output never depends on it.
"""
from __future__ import annotations

import functools
import time
from typing import Callable, Protocol, Sequence

import numpy as np

from . import planner
from .acceptance import AcceptanceStats, best_expected
from .cost import MAX_DRAFT, DecodeCost, Shape
from .draft_trust import DraftTrust
from .probe import Probe
from .rest import Rest, Rests
from .tracker import CostTracker
from .speculation import NO_OPTIONS, DraftOptions, Speculation

SEQ_PRIOR_WEIGHT = 0.3  # a new sequence starts from the drafter's global stats, scaled down


class DraftPolicy(Protocol):
    """Turns a sequence's proposals into DraftOptions; learns from what was emitted."""

    name: str
    cost: DecodeCost | None
    n_rested: int  # sequence steps that proposed nothing because it did not pay (rest.py)

    def rest_of(self, seq_id: int) -> Rest | None:
        """Whether sequence seq_id proposes (rest.py), or None: it always does
        (Speculation._watched)."""

    def options(self, sp: Speculation, history: np.ndarray, sampled: int, room: int,
                found: list | None = None) -> DraftOptions:
        """What `sp` could verify this step: the chain's proposals, or `found` where the
        step's proposals were already made (the chain's watch, Speculation._watched)."""

    def plan(self, options: Sequence[DraftOptions], base: Sequence[Shape], per_seq_max: int,
             total_max: int) -> list[int]:
        """Every sequence's draft length for one decode (planner.py)."""

    def observe(self, sp: Speculation, emitted: list[int], n_accepted: int) -> None: ...

    def observe_decode(self, shapes: Sequence[Shape], seconds: float) -> None:
        """A generation decode of `shapes` took `seconds` (the cost model learns from it)."""

    def trust(self, n_seqs: int) -> float:
        """The share of a drafted decode's predicted speed to count on (draft_trust.py)."""

    def flush(self) -> None:
        """Write what the policy learnt (between steps; never inside one)."""


class FixedPolicy:
    """llama.cpp: the first drafter's draft at its own length."""

    name = "fixed"
    cost = None
    n_rested = 0  # llama.cpp's policy always proposes

    def rest_of(self, seq_id: int) -> Rest | None:
        return None

    def options(self, sp: Speculation, history: np.ndarray, sampled: int, room: int,
                found: list | None = None) -> DraftOptions:
        if found is None:
            found = sp.chain.propose(sp.seq_id, history, sampled, room, first_only=True,
                                     extra=sp.own)
        return DraftOptions(proposals=found) if found else NO_OPTIONS

    def plan(self, options: Sequence[DraftOptions], base: Sequence[Shape], per_seq_max: int,
             total_max: int) -> list[int]:
        return planner.plan(options, base, None, per_seq_max, total_max)

    def observe(self, sp: Speculation, emitted: list[int], n_accepted: int) -> None:
        pass

    def observe_decode(self, shapes: Sequence[Shape], seconds: float) -> None:
        pass

    def trust(self, n_seqs: int) -> float:
        return 1.0

    def flush(self) -> None:
        pass


def majority(props: list) -> list:
    """The proposals whose first token a strict majority of (3 or more) proposals
    share; otherwise all of them. Drafters that agree found the same copy through
    different keys, so a lone dissenter (usually a short key that matched a
    different occurrence) is the one likely to be wrong at its first token."""
    if len(props) < 3:
        return props
    firsts = [int(dr[0]) for _, dr in props]
    top = max(set(firsts), key=firsts.count)
    if 2 * firsts.count(top) <= len(props):
        return props
    return [p for p, f in zip(props, firsts) if f == top]


def _state_key(sp: Speculation, drafter) -> tuple[str, object]:
    """(drafter name, run state) of a proposal's statistics (`CostPolicy.stats`)."""
    agreement = getattr(drafter, "agreement", None)
    return drafter.name, sp.copying if agreement is None else agreement


def _timed(method: Callable) -> Callable:
    """A CostPolicy method whose wall time is the policy's own host time (`Rests.spent`):
    a sequence's when its first argument is that sequence's Speculation, else the step's."""
    @functools.wraps(method)
    def timed(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            sp = args[0] if args else None
            self.rests.spent(sp.seq_id if isinstance(sp, Speculation) else None,
                             time.perf_counter() - t0)
    return timed


class CostPolicy:
    """Expected tokens per draft length from acceptance statistics; the planner
    (planner.py) weighs them against the decode cost. With compare_all (auto) every
    drafter proposes each step (they cost microseconds; a verify costs milliseconds)."""

    #: decodes after which a curve learnt from a default start is cached (`save`)
    SAVE_AFTER = 128

    def __init__(self, cost: DecodeCost, compare_all: bool = False,
                 save: Callable[[DecodeCost], None] | None = None):
        self.cost = cost  # the tracker's current model: refined from the run's decodes
        self.tracker = CostTracker(cost)
        self._save = save
        self._learnt: DecodeCost | None = None  # the curve to save at the next `flush`
        self.compare_all = compare_all
        self.name = "auto" if compare_all else "cost"
        self.global_stats: dict[tuple[str, object], AcceptanceStats] = {}  # (drafter, state)
        self.realized = DraftTrust()  # drafted decodes' realized vs predicted speed
        self.probe = Probe()  # short drafts while the curve has seen no verify (probe.py)
        self.rests = Rests()  # per sequence: whether proposing pays for its host time
        self._n_seqs = 1  # sequences in the last generation decode (DraftTrust.shrink's bucket)

    @property
    def n_rested(self) -> int:
        return self.rests.n_rested

    def rest_of(self, seq_id: int) -> Rest:
        return self.rests.of(seq_id)

    @_timed
    def plan(self, options: Sequence[DraftOptions], base: Sequence[Shape], per_seq_max: int,
             total_max: int) -> list[int]:
        """The planner's lengths against the current curve and DraftTrust; where they
        draft nothing while the curve has seen no multi-row verify, a probe (probe.py)."""
        self.probe.close()
        ks = planner.plan(options, base, self.cost, per_seq_max, total_max,
                          trust=self.trust(len(base)))
        if not any(ks) and not self.tracker.slope_seen():
            ks = self.probe.choose(options, base, self.cost, per_seq_max, total_max) or ks
        for o, b in zip(options, base):
            if o.proposals:
                self.rests.of(b.seq_id).proposed()
        return ks

    def stats(self, sp: Speculation, drafter) -> AcceptanceStats:
        """The sequence's stats for `drafter` in the sequence's current run state: for an
        n-gram drafter `Speculation.copying`; for a request's prediction how long the
        output has agreed with it (`PredictionDrafter.agreement`), so a prediction is
        priced apart from the n-gram drafters and by that agreement. They start from the
        global stats of that drafter and state, scaled down; while those have seen
        nothing (a cold server), an n-gram drafter's start from what this sequence learnt
        of it in the other state, so the first copy ramps up as fast as with one set of
        statistics."""
        key = _state_key(sp, drafter)
        s = sp.stats.get(key)
        if s is None:
            g = self._global(key)
            other = sp.stats.get((key[0], not sp.copying)) if isinstance(key[1], bool) else None
            if g.n_updates == 0 and other is not None:
                s = AcceptanceStats(offered=other.offered, accepted=other.accepted)
            else:
                s = AcceptanceStats(offered=g.offered * SEQ_PRIOR_WEIGHT,
                                    accepted=g.accepted * SEQ_PRIOR_WEIGHT)
            sp.stats[key] = s
        return s

    def _global(self, key: tuple[str, object]) -> AcceptanceStats:
        """The server-wide stats of (drafter, copying), created on first use."""
        g = self.global_stats.get(key)
        if g is None:
            g = self.global_stats[key] = AcceptanceStats(decay=0.995)
        return g

    def _update(self, sp: Speculation, drafter, offered: int, accepted: int) -> list:
        """Record a draft in the sequence's and the global statistics of its drafter and
        run state; their records ((stats, record) pairs: a shadow moves them)."""
        return [(s, s.update(offered, accepted))
                for s in (self.stats(sp, drafter), self._global(_state_key(sp, drafter)))]

    @_timed
    def options(self, sp: Speculation, history: np.ndarray, sampled: int, room: int,
                found: list | None = None) -> DraftOptions:
        props = found if found is not None else sp.chain.propose(
            sp.seq_id, history, sampled, min(room, MAX_DRAFT), first_only=not self.compare_all,
            extra=sp.own)
        if props and sp.budget is not None:  # a request's prediction: its record's credit
            cap = sp.budget.cap(self.cost)
            props = [p for p in ((d, dr[:cap] if d in sp.own else dr) for d, dr in props)
                     if len(p[1])]
        if not props:
            return NO_OPTIONS
        eligible = {id(p) for p in majority(props)}
        rows = [i for i, p in enumerate(props) if id(p) in eligible]
        scale = self.realized.shrink(self._n_seqs)  # E' = 1 + scale x (E - 1), in the table
        table = sp.table
        top = best_expected([self.stats(sp, props[i][0]) for i in rows],
                            [len(props[i][1]) for i in rows], rows, table, scale)
        return DraftOptions(props, table.expected[:top + 1], table.pick[:top + 1], scale,
                            table.at[0])

    def observe(self, sp: Speculation, emitted: list[int], n_accepted: int) -> None:
        """Score this step's proposals against the tokens the target emitted (`_score`);
        a sequence that proposed nothing (resting) only leaves its copy, untimed: a
        resting step costs no more host time than it must."""
        if sp.committed is None and not sp.options.proposals:
            sp.copying = False
            if sp.shadows:
                sp.shadows.follow(emitted)
            return
        self._score(sp, emitted, n_accepted)

    @_timed
    def _score(self, sp: Speculation, emitted: list[int], n_accepted: int) -> None:
        if sp.committed is not None:
            self.probe.accepted(sp.seq_id, n_accepted)
            self.rests.of(sp.seq_id).accepted(n_accepted, sp.committed[1])
            e = sp.options.expected
            if e is not None:
                self.realized.sequence(float(e[min(sp.committed[1], len(e) - 1)]), n_accepted,
                                       sp.options.scale)
        shadows = sp.shadows
        if shadows:
            shadows.follow(emitted)
        for d, dr in sp.options.proposals:
            if sp.committed is not None and d.name == sp.committed[0]:
                shadows.drop(d.name)  # the verify scores its copy from here
                self._update(sp, d, sp.committed[1], n_accepted)
                if sp.budget is not None and d in sp.own:
                    sp.budget.settle(self.cost, sp.committed[1], n_accepted)
                continue
            n, m = min(len(dr), len(emitted)), 0
            if n:  # the agreeing run, on Python ints (a numpy scalar compares ~10x slower)
                ours, theirs = dr[:n].tolist(), emitted[:n]
                if ours == theirs:
                    m = n
                else:
                    while ours[m] == theirs[m]:
                        m += 1
            if sp.budget is not None and d in sp.own:
                sp.budget.settle(self.cost, 0, m)  # right (or not), whoever drafted
            if m < n:  # a miss at m: positions 0..m seen, m accepted
                self._update(sp, d, len(dr), m)
            elif m > 0:  # all known tokens matched: censored at m (followed: shadow.py)
                records = self._update(sp, d, m, m)
                if m < len(dr) and d.name not in shadows:
                    shadows.add(d.name, dr.tolist(), m, records)
        sp.copying = sp.committed is not None and n_accepted == sp.committed[1]

    @_timed
    def observe_decode(self, shapes: Sequence[Shape], seconds: float) -> None:
        """Refine the cost model from a generation decode (CostTracker) and score a
        drafted decode against the model that planned it (DraftTrust; a probe is not
        scored); once, after SAVE_AFTER decodes and once the curve has seen multi-row
        verifies (a curve that never saw one is the scaled prior's guess, not worth
        caching), keep the learnt curve for `flush` to save (no file I/O in a step)."""
        verified = any(s.n_tokens > 1 for s in shapes)
        predicted = plain = 0.0
        if verified:
            kvs = [s.n_kv for s in shapes]
            plain = self.cost.price(tuple((s.seq_id, 1, 1) for s in shapes), kvs)
            if not self.probe.open:
                predicted = self.cost.price(
                    tuple((s.seq_id, s.n_tokens, s.n_logits) for s in shapes), kvs)
        drafted = predicted > 0.0
        self._n_seqs = len(shapes)
        self.rests.decode(shapes, plain, seconds)
        self.cost = self.tracker.observe(shapes, seconds)
        self.probe.decode(seconds)
        self.realized.decode(len(shapes), predicted, seconds, drafted)
        if (self._save is not None and self._learnt is None
                and self.tracker.n_observed >= self.SAVE_AFTER and self.tracker.slope_seen()):
            self._learnt = self.cost

    def flush(self) -> None:
        """Hand the curve `observe_decode` kept to `save` (cost.Calibration.save), once
        per policy: called between steps (`Engine.finish`), never inside one."""
        if self._save is not None and self._learnt is not None:
            save, self._save = self._save, None
            save(self._learnt)

    def trust(self, n_seqs: int) -> float:
        """DraftTrust.factor: how much of a drafted decode's predicted rate was realized
        lately at this batch size (<= 1)."""
        return self.realized.factor(n_seqs)
