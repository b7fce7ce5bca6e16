"""Per-sequence n-gram position index stored in the shared pool.

Maps the hash of an n-gram of one sequence's history to a position where that
n-gram starts. Used by ngram-simple (most recent start) and ngram-map-k/-k4v
(earliest start followed by a full m-gram, like llama.cpp's key_map).

Invariants:
- Every sequence gets a fresh salt at `begin`, so entries of an earlier request
  never answer a lookup of a later one (no state leaks between requests).
- After `sync(seq, hist)`, every start j with j + n + lag <= len(hist) is indexed
  (subject to slot collisions), unless the pool was cleared since, in which case
  `sync` re-indexes the whole history.
- `sync_find` returns a position whose n tokens equal the key, or -1 (HashPool.index_find).
- A sequence's state is a seq_row.py row, which drafting.c's `ngs_propose` updates as
  `sync_find` does (native_chain.py).
"""
from __future__ import annotations

import itertools

import numpy as np

from ..pool import HashPool, mix_salt
from . import seq_row as R

_epochs = itertools.count(1)


class SeqIndex:
    """The index of one drafter's n-grams, a state row (seq_row.py: SALT, INDEXED,
    RESETS) per sequence; `row` hands it to the drafter, which may keep fields of its
    own there."""

    def __init__(self, pool: HashPool, n: int, keep: str, lag: int, namespace: int):
        self.pool, self.n, self.keep, self.lag, self.namespace = pool, n, keep, lag, namespace
        self._seqs: dict[int, np.ndarray] = {}

    def begin(self, seq_id: int, prompt: np.ndarray) -> None:
        row = R.new_row(mix_salt(self.namespace, self.n, self.lag, seq_id, next(_epochs)))
        row[R.RESETS] = self.pool.resets
        self._seqs[seq_id] = row
        self.sync(seq_id, prompt)

    def end(self, seq_id: int) -> None:
        self._seqs.pop(seq_id, None)

    def salt(self, seq_id: int) -> int:
        return int(self.row(seq_id)[R.SALT])

    def row(self, seq_id: int) -> np.ndarray:
        """The sequence's state row (made as `begin([])` would where there is none)."""
        row = self._seqs.get(seq_id)
        if row is None:  # draft without begin: behave as if begin([]) had been called
            row = self._seqs[seq_id] = R.new_row(mix_salt(self.namespace, self.n, seq_id,
                                                          next(_epochs)))
            row[R.RESETS] = self.pool.resets
        return row

    def _fresh(self, seq_id: int, hist: np.ndarray) -> tuple[np.ndarray, int]:
        """The sequence's row and its next start to index, the index started over if the
        pool was cleared since or the history is shorter than what was indexed."""
        row = self.row(seq_id)
        indexed = int(row[R.INDEXED])
        if int(row[R.RESETS]) != self.pool.resets or indexed > len(hist):
            row[R.INDEXED] = indexed = 0
            row[R.RESETS] = self.pool.resets
        return row, indexed

    def sync(self, seq_id: int, hist: np.ndarray) -> None:
        """Insert every not yet indexed start j with j + n + lag <= len(hist)."""
        row, start = self._fresh(seq_id, hist)
        stop = len(hist) - self.n - self.lag + 1  # exclusive bound on starts
        if stop <= start:
            return
        self.pool.put_windows(hist, self.n, int(row[R.SALT]), value0=start, keep=self.keep,
                              start=start, end=stop + self.n - 1)
        row[R.INDEXED] = stop

    def sync_find(self, seq_id: int, hist: np.ndarray, sampled: int) -> tuple[int, int]:
        """`sync`, then (position, key hash) of the key hist[-(n-1):] + [sampled]
        (len(hist) >= n - 1): an indexed start whose n tokens equal the key, or -1; in one
        call into the pool (HashPool.index_find)."""
        row, start = self._fresh(seq_id, hist)
        pos, h, row[R.INDEXED] = self.pool.index_find(hist, sampled, self.n, int(row[R.SALT]),
                                                      start, self.lag, self.keep)
        return pos, h

    def params(self, kind: int, m: int, minimum: int = 0) -> np.ndarray:
        """The parameter row (seq_row.params) of a drafter of `kind` on this index."""
        return R.params(kind, self.n, m, self.lag, self.keep == "first", minimum)
