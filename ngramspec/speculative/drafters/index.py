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
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..pool import HashPool, mix_salt

_epochs = itertools.count(1)


@dataclass
class _SeqState:
    salt: int
    n_indexed: int = 0  # next start position to insert
    resets_seen: int = 0


class SeqIndex:
    def __init__(self, pool: HashPool, n: int, keep: str, lag: int, namespace: int):
        self.pool, self.n, self.keep, self.lag, self.namespace = pool, n, keep, lag, namespace
        self._seqs: dict[int, _SeqState] = {}

    def begin(self, seq_id: int, prompt: np.ndarray) -> None:
        salt = mix_salt(self.namespace, self.n, self.lag, seq_id, next(_epochs))
        self._seqs[seq_id] = _SeqState(salt, 0, self.pool.resets)
        self.sync(seq_id, prompt)

    def end(self, seq_id: int) -> None:
        self._seqs.pop(seq_id, None)

    def salt(self, seq_id: int) -> int:
        return self._state(seq_id).salt

    def _state(self, seq_id: int) -> _SeqState:
        st = self._seqs.get(seq_id)
        if st is None:  # draft without begin: behave as if begin([]) had been called
            st = self._seqs[seq_id] = _SeqState(mix_salt(self.namespace, self.n, seq_id,
                                                         next(_epochs)), 0, self.pool.resets)
        return st

    def _fresh(self, seq_id: int, hist: np.ndarray) -> _SeqState:
        """The sequence's state, its index started over if the pool was cleared since or
        the history is shorter than what was indexed."""
        st = self._state(seq_id)
        if st.resets_seen != self.pool.resets or st.n_indexed > len(hist):
            st.n_indexed, st.resets_seen = 0, self.pool.resets
        return st

    def sync(self, seq_id: int, hist: np.ndarray) -> None:
        """Insert every not yet indexed start j with j + n + lag <= len(hist)."""
        st = self._fresh(seq_id, hist)
        stop = len(hist) - self.n - self.lag + 1  # exclusive bound on starts
        start = st.n_indexed
        if stop <= start:
            return
        self.pool.put_windows(hist, self.n, st.salt, value0=start, keep=self.keep, start=start,
                              end=stop + self.n - 1)
        st.n_indexed = stop

    def sync_find(self, seq_id: int, hist: np.ndarray, sampled: int) -> tuple[int, int]:
        """`sync`, then (position, key hash) of the key hist[-(n-1):] + [sampled]
        (len(hist) >= n - 1): an indexed start whose n tokens equal the key, or -1; in one
        call into the pool (HashPool.index_find)."""
        st = self._fresh(seq_id, hist)
        pos, h, st.n_indexed = self.pool.index_find(hist, sampled, self.n, st.salt, st.n_indexed,
                                                    self.lag, self.keep)
        return pos, h
