"""ngram-map-k and ngram-map-k4v: n-gram lookup with per-key statistics.

Both find the key (last n-1 history tokens + sampled) through a per-sequence
index of n-grams that are followed by a full m-gram, keeping the earliest
occurrence (llama.cpp's 2**18-entry key_map keeps the first one too). Per-key
statistics live in the shared pool, salted per sequence:
- hits: how many times the key was found in this request; no draft until
  hits >= min_hits;
- n_accepted: tokens accepted the last time this key (map-k) or this key and
  value (map-k4v) drafted; the next draft is at most that long (starts at m).
  As in llama.cpp, a key whose draft was fully rejected drafts nothing again.

ngram-map-k drafts the m tokens after the found occurrence.
ngram-map-k4v counts the distinct m-gram continuations ("values") of every
earlier occurrence of the key, keeping the first 4 distinct ones, and drafts
the most frequent value only if it occurs at least twice as often as all the
other values together (or is the only one).

Differences from llama.cpp (documented, tested):
- llama.cpp applies min_hits only to k4v; we apply it to both (default 1: same).
- llama.cpp k4v recounts values only up to the matched (earliest) occurrence
  and recounts that one on every call, so its counts drift; we count every
  occurrence that has a full continuation, each once, and draft the dominant
  value's own tokens (llama.cpp drafts the matched occurrence's tokens).
- Per-key statistics are bounded by the pool (lost on collision or pool reset),
  instead of a vector that grows with the number of keys.
"""
from __future__ import annotations

import numpy as np
import xxhash

from ...settings.config import NgramMapParams
from ..hashing import key_of
from ..pool import HashPool, mix_salt
from .base import EMPTY
from . import seq_row as R
from .index import SeqIndex

NS_FIRST = 0x52
NS_STATS_K = 0x53
NS_STATS_K4V = 0x54
NS_ACC_K4V = 0x55
MAX_VALUES = 4
MAX_COUNT = 16380  # llama.cpp's cap on counters


def value_counts(history: np.ndarray, key: list[int], n: int, m: int,
                 max_values: int = MAX_VALUES) -> list[tuple[int, int]]:
    """Distinct m-gram continuations of `key` in `history`: [(first start, count)].

    Pure kernel. Considers every occurrence of the n-gram `key` at start j with
    j + n + m <= len(history); values are ordered by first appearance and only
    the first `max_values` distinct ones are counted (later new ones are ignored).
    `first start` is the position where that value's m tokens begin.
    The scan is `bytes.find` over the int32 history (C speed, no per-token Python).
    """
    hb = np.ascontiguousarray(history, dtype=np.int32).tobytes()
    kb = np.asarray(key, dtype=np.int32).tobytes()
    end = (len(history) - m) * 4  # occurrences must leave m tokens after the key
    values: dict[bytes, list[int]] = {}
    i = hb.find(kb, 0, end)
    while i >= 0:
        if i % 4:  # not token-aligned: a byte-level false match
            i = hb.find(kb, i + 1, end)
            continue
        v0 = i // 4 + n
        v = hb[v0 * 4:(v0 + m) * 4]
        slot = values.get(v)
        if slot is not None:
            slot[1] = min(slot[1] + 1, MAX_COUNT)
        elif len(values) < max_values:
            values[v] = [v0, 1]
        i = hb.find(kb, i + 4, end)
    return [(s, c) for s, c in values.values()]


def dominant(counts: list[tuple[int, int]]) -> int:
    """Index of the value to draft under the k4v rule, or -1.

    The most frequent value drafts if no other value was seen, or if it occurs at
    least twice as often as all the others together.
    """
    if not counts:
        return -1
    best = max(range(len(counts)), key=lambda i: counts[i][1])
    rest = sum(c for i, (_, c) in enumerate(counts) if i != best)
    return best if rest == 0 or counts[best][1] >= 2 * rest else -1


class _MapBase:
    """Shared lookup and statistics of ngram-map-k and -k4v. A sequence's state is its
    index's row (seq_row.py), with STATS_SALT and the last draft's key (LAST_H, LAST_SET)."""

    name = ""
    _ns_stats = 0

    def __init__(self, params: NgramMapParams, pool: HashPool):
        self.n, self.m, self.min_hits = params.size_n, params.size_m, params.min_hits
        self.pool = pool
        self.index = SeqIndex(pool, self.n, keep="first", lag=self.m, namespace=NS_FIRST)

    def begin(self, seq_id: int, prompt: np.ndarray) -> None:
        self.index.begin(seq_id, prompt)

    def row(self, seq_id: int) -> np.ndarray:
        """The sequence's state row (seq_row.py), STATS_SALT set."""
        row = self.index.row(seq_id)
        if not row[R.STATS_SALT]:
            row[R.STATS_SALT] = mix_salt(self._ns_stats, int(row[R.SALT]))
        return row

    def native_params(self) -> np.ndarray:
        """This drafter's parameter row for drafting.c (seq_row.params)."""
        return self.index.params(R.PY, self.m, self.min_hits)

    def _salt(self, seq_id: int, ns: int) -> int:
        """Per-request salt of statistics namespace `ns`."""
        if ns == self._ns_stats:
            return int(self.row(seq_id)[R.STATS_SALT])
        return mix_salt(ns, self.index.salt(seq_id))

    def end(self, seq_id: int) -> None:
        self.index.end(seq_id)

    def _find(self, seq_id: int, history: np.ndarray, sampled: int):
        """(key hash, match position) or None."""
        self.row(seq_id)[R.LAST_SET] = 0
        n, m = self.n, self.m
        if len(history) < 2 * n + m:
            self.index.sync(seq_id, history)
            return None
        pos, kh = self.index.sync_find(seq_id, history, sampled)
        if pos < 0 or pos + n + m > len(history):
            return None
        return kh, pos

    def _hit(self, seq_id: int, history: np.ndarray, sampled: int, max_len: int):
        """`_find`'s (key hash, match position) when max_len > 0 and the key's hit count,
        counted here, reached min_hits; else None."""
        found = self._find(seq_id, history, sampled)
        if found is None or max_len <= 0 or self._hits(seq_id, found[0]) < self.min_hits:
            return None
        return found

    def _hits(self, seq_id: int, kh: int) -> int:
        """Increment and return the key's hit count (stored in the pool)."""
        salt = self._salt(seq_id, self._ns_stats)
        v = self.pool.get(kh, salt)
        hits, acc = (v >> 16, v & 0xFFFF) if v >= 0 else (0, self.m)
        hits = min(hits + 1, MAX_COUNT)
        self.pool.put(kh, salt, (hits << 16) | acc)
        return hits

    def _capped(self, seq_id: int, h: int, salt: int, value: np.ndarray,
                max_len: int) -> np.ndarray:
        """`value` (m tokens) cut to max_len and to what its statistics key (h, salt)
        last had accepted (m at first), remembered for `accept`; EMPTY at 0 (a draft
        rejected whole drafts nothing again, as in llama.cpp)."""
        length = min(self.m, self._n_accepted(h, salt), max_len)
        if length <= 0:
            return EMPTY
        row = self.row(seq_id)
        row[R.LAST_H], row[R.LAST_SET] = h, 1
        return value[:length]

    def _n_accepted(self, h: int, salt: int) -> int:
        v = self.pool.get(h, salt)
        return v & 0xFFFF if v >= 0 else self.m

    def _set_accepted(self, h: int, salt: int, n_accepted: int) -> None:
        v = self.pool.get(h, salt)
        hits = v >> 16 if v >= 0 else 0
        self.pool.put(h, salt, (hits << 16) | min(n_accepted, 0xFFFF))

    _accept_ns = 0  # the namespace of the key `accept` updates (each drafter's)

    def accept(self, seq_id: int, n_accepted: int) -> None:
        row = self.index._seqs.get(seq_id)
        if row is not None and row[R.LAST_SET]:
            row[R.LAST_SET] = 0
            self._set_accepted(int(row[R.LAST_H]),
                               self._salt(seq_id, self._accept_ns), n_accepted)


class NgramMapK(_MapBase):
    name = "ngram-map-k"
    _ns_stats = _accept_ns = NS_STATS_K

    def native_params(self) -> np.ndarray:
        return self.index.params(R.MAPK, self.m, self.min_hits)

    def draft(self, seq_id: int, history: np.ndarray, sampled: int, max_len: int) -> np.ndarray:
        found = self._hit(seq_id, history, sampled, max_len)
        if found is None:
            return EMPTY
        kh, pos = found
        return self._capped(seq_id, kh, self._salt(seq_id, self._ns_stats),
                            history[pos + self.n:pos + self.n + self.m], max_len)


class NgramMapK4V(_MapBase):
    name = "ngram-map-k4v"
    _ns_stats = NS_STATS_K4V
    _accept_ns = NS_ACC_K4V

    def draft(self, seq_id: int, history: np.ndarray, sampled: int, max_len: int) -> np.ndarray:
        found = self._hit(seq_id, history, sampled, max_len)
        if found is None:
            return EMPTY
        kh, _ = found
        counts = value_counts(history, key_of(history, sampled, self.n), self.n, self.m)
        best = dominant(counts)
        if best < 0:
            return EMPTY
        start = counts[best][0]
        value = history[start:start + self.m]
        vh = kh ^ xxhash.xxh64_intdigest(value.tobytes())
        return self._capped(seq_id, vh, self._salt(seq_id, NS_ACC_K4V), value, max_len)
