"""Draft policies: how long a draft to verify this step, and from which drafter.

- `FixedPolicy`: llama.cpp's behaviour. The chain's first non-empty draft, at
  the drafter's own length (capped by --draft-max and the room left).
- `CostPolicy`: per step, for each proposal choose K maximising expected tokens
  per second, E[tokens | K] / marginal t(K) (see cost.py), and verify the best
  one, or nothing when plain decoding is faster. With `compare_all` (auto mode)
  every drafter proposes each step (they cost microseconds; a verify costs
  milliseconds) and the best wins.
- Both learn only from what the target emitted: after each step, every
  proposal of that step (verified or not) is scored against the emitted tokens
  ("shadow" drafts), so a policy that stopped drafting notices when drafting
  would pay again without spending a verify on it.

Invariant: a policy only chooses *which* tokens are verified; every emitted
token still comes from the target's sampler, so output never depends on it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .cost import MAX_DRAFT, AcceptanceStats, VerifyCost, best_length
from .drafters import EMPTY

SEQ_PRIOR_WEIGHT = 0.3  # a new sequence starts from the drafter's global stats, scaled down


class DraftPolicy(Protocol):
    def plan(self, st, room: int, base: int) -> np.ndarray: ...

    def observe(self, st, emitted: list[int], n_accepted: int) -> None: ...

    def end(self, seq_id: int) -> None: ...


class FixedPolicy:
    """llama.cpp: the first drafter's draft at its own length."""

    name = "fixed"

    def plan(self, st, room: int, base: int) -> np.ndarray:
        return st.chain.draft(st.seq_id, st.tokens[:st.n_hist], st.sampled, room)

    def observe(self, st, emitted: list[int], n_accepted: int) -> None:
        pass

    def end(self, seq_id: int) -> None:
        pass


@dataclass
class _Pending:
    proposals: list[tuple[str, np.ndarray]] = field(default_factory=list)
    committed: str | None = None
    k: int = 0


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


class CostPolicy:
    """Choose draft length (and, with compare_all, the drafter) from cost and acceptance."""

    def __init__(self, cost: VerifyCost, compare_all: bool = False):
        self.cost = cost
        self.compare_all = compare_all
        self.name = "auto" if compare_all else "cost"
        self.global_stats: dict[str, AcceptanceStats] = {}
        self._seq: dict[tuple[int, str], AcceptanceStats] = {}
        self._pending: dict[int, _Pending] = {}
        self.steps_drafted = 0
        self.steps_plain = 0

    # ------------------------------------------------------------ statistics
    def stats(self, seq_id: int, name: str) -> AcceptanceStats:
        key = (seq_id, name)
        s = self._seq.get(key)
        if s is None:
            g = self.global_stats.setdefault(name, AcceptanceStats(decay=0.995))
            s = AcceptanceStats()
            s.offered = g.offered * SEQ_PRIOR_WEIGHT
            s.accepted = g.accepted * SEQ_PRIOR_WEIGHT
            self._seq[key] = s
        return s

    def _update(self, seq_id: int, name: str, offered: int, accepted: int) -> None:
        self.stats(seq_id, name).update(offered, accepted)
        self.global_stats.setdefault(name, AcceptanceStats(decay=0.995)).update(offered, accepted)

    # ------------------------------------------------------------ policy
    def _marginal(self, base: int, k_max: int) -> np.ndarray:
        """Cost of adding this sequence's 1 + K tokens to a batch already holding `base`."""
        t0 = self.cost.t(base) if base > 0 else 0.0
        floor = 1e-3 * self.cost.t(1)  # a flat curve segment still costs something
        return np.maximum([self.cost.t(base + 1 + k) - t0 for k in range(k_max + 1)], floor)

    def plan(self, st, room: int, base: int) -> np.ndarray:
        chain, seq = st.chain, st.seq_id
        props = chain.propose(seq, st.tokens[:st.n_hist], st.sampled, min(room, MAX_DRAFT),
                              first_only=not self.compare_all)
        pend = self._pending[seq] = _Pending([(d.name, dr) for d, dr in props])
        if not props:
            self.steps_plain += 1
            return EMPTY
        k_max = max(len(dr) for _, dr in props)
        cost = self._marginal(base, k_max)
        best = (0, 1.0 / cost[0], None, EMPTY)
        for d, dr in majority(props):
            k, rate = best_length(self.stats(seq, d.name), cost[:len(dr) + 1], len(dr))
            if k > 0 and rate > best[1]:
                best = (k, rate, d, dr)
        k, _, d, dr = best
        if d is None:
            self.steps_plain += 1
            return EMPTY
        self.steps_drafted += 1
        pend.committed, pend.k = d.name, k
        return chain.commit(seq, d, dr[:k])

    def observe(self, st, emitted: list[int], n_accepted: int) -> None:
        """Score this step's proposals against the tokens the target emitted."""
        pend = self._pending.pop(st.seq_id, None)
        if pend is None:
            return
        em = np.asarray(emitted, dtype=np.int32)
        for name, dr in pend.proposals:
            if name == pend.committed:
                self._update(st.seq_id, name, pend.k, n_accepted)
                continue
            n = min(len(dr), len(em))
            neq = np.flatnonzero(dr[:n] != em[:n])
            m = int(neq[0]) if len(neq) else n
            if m < n:  # a miss at m: positions 0..m seen, m accepted
                self._update(st.seq_id, name, len(dr), m)
            elif m > 0:  # all known tokens matched: censored at m
                self._update(st.seq_id, name, m, m)

    def end(self, seq_id: int) -> None:
        self._pending.pop(seq_id, None)
        for key in [k for k in self._seq if k[0] == seq_id]:
            del self._seq[key]
