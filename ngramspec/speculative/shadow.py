"""Declined proposals followed along the output (`Shadows`, one per sequence).

Every proposal of a step is scored against the tokens the target emitted (policy.py).
A proposal the planner declined meets only that step's token, so it used to count as
a draft of one token, all accepted (censored at 1): the statistics learnt nothing of
its later positions. Where a copy goes on while the planner declines it (its
statistics pessimistic after an early miss, or a short draft of another drafter
preferred), the drafter keeps proposing the right continuation step after step, the
statistics never see it, and the planner keeps declining: measured on the story
fixture (the 4-block model, 1 slot), a 64-token copy of ngram-mod declined, or drafted
2 tokens at a time (another drafter's short draft preferred), for about 20 steps. So
such a proposal becomes a *shadow*: recorded at once as a censored draft (the tokens it
has matched, all accepted), then followed along the next steps' tokens, its record moved
(`AcceptanceStats.revise`, at its own weight and age) as it matches more, until it
misses (a draft of its length with that many accepted) or is matched whole.

Invariants: at most one shadow per drafter and sequence; while it lasts, that drafter's
later declined proposals are scored at their own step only, as before (censored at its
tokens), not followed; a draft the drafter commits ends its shadow where it stands (the
verify scores the copy from there). Following only adds what a declined proposal was
shown to be worth later: a scoring that instead followed each copy once for its whole
length (one record per copy, not one per step) drafted less than censoring alone, in a
simulation of the policy on the 4-block model's recorded streams. A shadow only moves
statistics: emitted tokens never depend on it. The records move in the statistics they
were made in (the sequence's and the global ones of the drafter and run state of the
step that proposed it).
"""
from __future__ import annotations

from typing import Sequence


class Shadow:
    """One declined proposal being followed: its tokens, how many matched, its records
    ((AcceptanceStats, record) pairs from `AcceptanceStats.update`)."""

    __slots__ = ("draft", "matched", "records")

    def __init__(self, draft: list[int], matched: int, records: list) -> None:
        self.draft, self.matched, self.records = draft, matched, records

    def follow(self, emitted: Sequence[int]) -> bool:
        """Compare the next emitted tokens; move the records; True while it goes on."""
        m, draft = self.matched, self.draft
        n = min(len(draft) - m, len(emitted))
        j = 0
        while j < n and draft[m + j] == emitted[j]:
            j += 1
        self.matched = m + j
        missed = j < n
        offered = len(draft) if missed or self.matched == len(draft) else self.matched
        moved = []
        for stats, rec in self.records:
            rec = stats.revise(rec, offered, self.matched)
            if rec is not None:
                moved.append((stats, rec))
        self.records = moved
        return bool(moved) and not missed and self.matched < len(draft)


class Shadows:
    """A sequence's shadows by drafter name."""

    __slots__ = ("_by",)

    def __init__(self) -> None:
        self._by: dict[str, Shadow] = {}

    def __bool__(self) -> bool:
        return bool(self._by)

    def __contains__(self, name: str) -> bool:
        return name in self._by

    def follow(self, emitted: Sequence[int]) -> None:
        """Every shadow along the tokens a step emitted (before its proposals are scored)."""
        for name in [n for n, s in self._by.items() if not s.follow(emitted)]:
            del self._by[name]

    def add(self, name: str, draft: list[int], matched: int, records: list) -> None:
        self._by[name] = Shadow(draft, matched, records)

    def drop(self, name: str | None = None) -> None:
        """End one drafter's shadow (None: all) where it stands."""
        if name is None:
            self._by.clear()
        else:
            self._by.pop(name, None)
