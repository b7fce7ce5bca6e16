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
- `find` returns a candidate position only; callers compare tokens before use.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..hashing import ngram_hash, ngram_hashes
from ..pool import HashPool, mix_salt

_SCALAR_MAX = 256  # below this many new positions, a Python loop beats numpy set-up
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

    def sync(self, seq_id: int, hist: np.ndarray) -> None:
        """Insert every not yet indexed start j with j + n + lag <= len(hist)."""
        st = self._state(seq_id)
        if st.resets_seen != self.pool.resets or st.n_indexed > len(hist):
            st.n_indexed, st.resets_seen = 0, self.pool.resets
        stop = len(hist) - self.n - self.lag + 1  # exclusive bound on starts
        start = st.n_indexed
        if stop <= start:
            return
        n, pool, salt = self.n, self.pool, st.salt
        if stop - start <= _SCALAR_MAX:
            pool.put_ngrams(hist[start:stop + n - 1].tolist(), n, salt, range(start, stop),
                            keep=self.keep)
        else:
            hashes = ngram_hashes(hist[start:stop + n - 1], n)
            pool.put_many(hashes, salt, np.arange(start, stop, dtype=np.int64), keep=self.keep)
        st.n_indexed = stop

    def find(self, seq_id: int, key_hash: int) -> int:
        return self.pool.get(key_hash, self._state(seq_id).salt)


def key_of(hist: np.ndarray, sampled: int, n: int) -> list[int]:
    """The current key: the last n tokens of history + sampled."""
    key = hist[len(hist) - n + 1:].tolist() if n > 1 else []
    key.append(sampled)
    return key


def matches_at(hist: np.ndarray, pos: int, key: list[int]) -> bool:
    return 0 <= pos and pos + len(key) <= len(hist) and hist[pos:pos + len(key)].tolist() == key


__all__ = ["SeqIndex", "key_of", "matches_at", "ngram_hash"]
