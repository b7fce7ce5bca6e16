"""A drafter's per-sequence state as one row of uint64 fields, and its constant parameters
as one row of int64: what drafting.c's `ngs_propose` reads and writes (native_chain.py),
and what the drafters' Python code reads and writes where there is no C.

Invariants: a drafter makes a sequence's row once, at `begin` (or at its first draft
without one) and keeps that same array until `end`, so an address taken after `begin`
stays the row's; every field is a non-negative integer below 2**64. The field numbers
are drafting.c's NGS_S_* and NGS_P_* enums.
"""
from __future__ import annotations

import numpy as np

# state fields (uint64), per drafter and sequence
SALT = 0  # SeqIndex: the sequence's index salt; ngram-mod: the table's current salt
INDEXED = 1  # SeqIndex: the next start to index; ngram-mod: i_last
RESETS = 2  # SeqIndex: HashPool.resets when the index was last (re)started
STATS_SALT = 3  # ngram-map-k: the salt of its per-key statistics
LAST_H = 4  # ngram-map-k(4v): the statistics key of the last draft
LAST_SET = 5  # ngram-map-k(4v): 1 while LAST_H awaits `accept`; ngram-mod: n_draft_last
START = 6  # ngram-mod: the window start of the last draft's first lookup
S_FIELDS = 8

# parameter fields (int64), per drafter
KIND, N, M, LAG, FIRST, MIN = range(6)  # M: ngram-mod's n_max; MIN: min_hits / n_min
P_FIELDS = 8
PY, SIMPLE, MAPK, MOD = range(4)  # KIND: drafted in Python, or by drafting.c


def new_row(salt: int = 0) -> np.ndarray:
    """A fresh state row, SALT set."""
    row = np.zeros(S_FIELDS, dtype=np.uint64)
    row[SALT] = salt
    return row


def params(kind: int, n: int, m: int = 0, lag: int = 0, first: bool = False,
           minimum: int = 0) -> np.ndarray:
    """A drafter's parameter row."""
    p = np.zeros(P_FIELDS, dtype=np.int64)
    p[[KIND, N, M, LAG, FIRST, MIN]] = kind, n, m, lag, int(first), minimum
    return p
