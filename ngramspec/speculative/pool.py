"""The shared hash pool: one fixed-size table used by every drafter and every sequence.

Layout: `table` is a numpy uint64 array of 2**k slots (default 16 MiB = 2M slots).
A slot is 0 when empty, else `(tag << 32) | value` with a 32-bit non-zero tag and a
32-bit value (a token id or a history position). A key is a 64-bit n-gram hash
mixed with a namespace salt; the salt separates drafters, n-gram sizes, sequences
and generations, so they share the bytes without sharing meanings.

Invariants:
- `nbytes` is fixed at construction: it never depends on context length, the
  number of sequences or how much was inserted.
- `get` returns a value only if the slot's tag matches the key's tag. A lookup can
  still be wrong (two keys with the same slot and tag, ~2**-53 per pair, or a slot
  overwritten by another key); every user treats a hit as a *proposal* that the
  target model verifies, so a wrong hit costs speed, never correctness.
- `used` counts non-empty slots exactly; `clear()` empties all and bumps `resets`,
  which per-sequence indexes watch to rebuild themselves.
- The drafters' hot operations (`put_windows`, `follow_key`, `find_key`, and
  `index_find`: a position index's put and find in one call) run in C where
  native.kernel() has it, else in Python; both compute the same slots and values
  (tests/test_native_drafting.py).
"""
from __future__ import annotations

import numpy as np

from . import native
from .hashing import MASK64, P, key_of, ngram_hash, ngram_hashes, power

_GOLD = 0x9E3779B97F4A7C15
_GOLD64 = np.uint64(_GOLD)
_LOW32 = 0xFFFFFFFF
_SCALAR_MAX = 256  # Python path: below this many windows a loop beats numpy's set-up


def mix_salt(*parts: int) -> int:
    """A 64-bit namespace salt from small integers (splitmix64 over the parts)."""
    x = 0x243F6A8885A308D3
    for p in parts:
        x = (x ^ (p & MASK64)) & MASK64
        x = (x + _GOLD) & MASK64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
        x ^= x >> 31
    return x


class HashPool:
    """A constant-memory open table of (tag, value) slots, direct-mapped."""

    def __init__(self, nbytes: int = 16 << 20):
        slots = nbytes // 8
        if slots < 1024 or slots & (slots - 1):
            raise ValueError(f"pool size must be a power of two >= 8 KiB, got {nbytes} bytes")
        self.table = np.zeros(slots, dtype=np.uint64)
        self._mv = memoryview(self.table)  # fast scalar access from Python
        self.bits = slots.bit_length() - 1
        self._shift = 64 - self.bits
        self.used = 0
        self.resets = 0
        self._c = native.kernel()  # drafting.c, or None: the Python reference below
        self._ptr = self.table.ctypes.data
        self._out = np.zeros(256, dtype=np.int32)  # follow_key's result buffer (grows)
        self._out_ptr = self._out.ctypes.data
        self._hash = np.zeros(1, dtype=np.uint64)  # find_key's hash out-parameter
        self._hash_ptr = self._hash.ctypes.data
        self._state = np.zeros(2, dtype=np.int64)  # index_find's (starts indexed, filled)
        self._state_ptr = self._state.ctypes.data
        self._hist: np.ndarray | None = None  # the last history handed to C, and its address:
        self._hist_ptr = 0  # a step's drafters pass one history (`_address`)

    # ----------------------------------------------------------------- reporting
    @property
    def slots(self) -> int:
        return len(self.table)

    @property
    def nbytes(self) -> int:
        return self.table.nbytes

    @property
    def occupancy(self) -> float:
        return self.used / len(self.table)

    def clear(self) -> None:
        """Empty every slot (all namespaces) and bump `resets`."""
        self.table.fill(0)
        self.used = 0
        self.resets += 1

    # ----------------------------------------------------------------- scalar path
    def locate(self, h: int, salt: int) -> tuple[int, int]:
        """(slot index, tag) of key hash `h` in namespace `salt`."""
        x = ((h ^ salt) * _GOLD) & MASK64
        return x >> self._shift, ((x >> 8) & _LOW32) | 1

    def get(self, h: int, salt: int) -> int:
        """The value stored for the key, or -1."""
        x = ((h ^ salt) * _GOLD) & MASK64
        e = self._mv[x >> self._shift]
        if (e >> 32) == (((x >> 8) & _LOW32) | 1):
            return e & _LOW32
        return -1

    def put(self, h: int, salt: int, value: int) -> None:
        """Store `value` for the key, replacing whatever the slot held."""
        x = ((h ^ salt) * _GOLD) & MASK64
        i = x >> self._shift
        if self._mv[i] == 0:
            self.used += 1
        self._mv[i] = ((((x >> 8) & _LOW32) | 1) << 32) | (value & _LOW32)

    def follow(self, h: int, salt: int, window: list[int], p_old: int, n: int) -> list[int]:
        """Up to n tokens chained from key hash `h` (of the n-gram `window`, which grows):
        each stored value is the next token, and the key moves on by a rolling hash step
        (`p_old`: P to the n-gram's size, hashing.power). Stops at the first key the pool
        does not hold. ngram-mod's draft loop: HashPool.get inlined, its hot path."""
        mv, shift = self._mv, self._shift
        out: list[int] = []
        for i in range(n):
            x = ((h ^ salt) * _GOLD) & MASK64
            e = mv[x >> shift]
            if (e >> 32) != (((x >> 8) & _LOW32) | 1):
                break
            t = e & _LOW32
            out.append(t)
            h = ((h - window[i] * p_old) * P + t) & MASK64
            window.append(t)
        return out

    # ----------------------------------------------------------------- bulk path
    def _locate_many(self, hashes: np.ndarray, salt: int) -> tuple[np.ndarray, np.ndarray]:
        with np.errstate(over="ignore"):
            x = (hashes ^ np.uint64(salt)) * _GOLD64
        idx = (x >> np.uint64(self._shift)).astype(np.int64)
        tag = ((x >> np.uint64(8)) & np.uint64(_LOW32)) | np.uint64(1)
        return idx, tag

    def put_many(self, hashes: np.ndarray, salt: int, values: np.ndarray,
                 keep: str = "last") -> None:
        """Vectorised `put` of many keys in order.

        keep="last": a later key overwrites an earlier one in the same slot (as
        repeated `put` calls would). keep="first": the earliest key in the batch
        wins, and a slot already holding the same key keeps its old value.
        """
        if len(hashes) == 0:
            return
        idx, tag = self._locate_many(hashes, salt)
        vals = values.astype(np.uint64) & np.uint64(_LOW32)
        if keep == "last":
            # numpy assigns repeated indices in order, so the last key wins
            sel = slice(None)
        elif keep == "first":
            _, sel = np.unique(idx, return_index=True)
            same = (self.table[idx[sel]] >> np.uint64(32)) == tag[sel]
            sel = sel[~same]
        else:
            raise ValueError(f"keep must be 'first' or 'last', got {keep!r}")
        slots = idx[sel]
        empty = slots[self.table[slots] == 0]
        if len(empty):
            self.used += len(np.unique(empty))
        self.table[slots] = (tag[sel] << np.uint64(32)) | vals[sel]

    def put_ngrams(self, tokens: list[int], n: int, salt: int, values, keep: str = "last") -> None:
        """Scalar `put_many` for the n-gram windows of a short Python list.

        Window j (tokens[j:j+n]) gets values[j]. Rolling hash and insertion in one
        loop: for a few dozen windows this beats numpy's per-call set-up.
        """
        count = len(tokens) - n + 1
        if count <= 0:
            return
        h = ngram_hash(tokens[:n])
        p_old = power(n)
        mv, shift, first = self._mv, self._shift, keep == "first"
        for j in range(count):
            if j:
                h = ((h - tokens[j - 1] * p_old) * P + tokens[j + n - 1]) & MASK64
            x = ((h ^ salt) * _GOLD) & MASK64
            i = x >> shift
            tag = ((x >> 8) & _LOW32) | 1
            e = mv[i]
            if e == 0:
                self.used += 1
            elif first and (e >> 32) == tag:
                continue
            mv[i] = (tag << 32) | values[j]

    # ----------------------------------------------------------------- the drafters' calls
    def _address(self, hist: np.ndarray) -> int:
        """The address of an int32 contiguous array (`_int32`), remembered for the last
        one: numpy's `.ctypes.data` costs about a microsecond, and every drafter of a
        step reads the same history."""
        if hist is not self._hist:
            self._hist, self._hist_ptr = hist, hist.ctypes.data
        return self._hist_ptr

    def put_windows(self, tokens: np.ndarray, n: int, salt: int, values: np.ndarray | None = None,
                    value0: int = 0, keep: str = "last", start: int = 0,
                    end: int | None = None) -> None:
        """Window j = tokens[start + j:start + j + n] (windows within tokens[start:end])
        gets values[j] (values None: value0 + j), in order, as `put_ngrams` does
        (keep="first": a slot already holding the key keeps its value). Without C, a long
        run goes through `put_many`, which differs only in which of two keys that share a
        slot keeps it."""
        count = (len(tokens) if end is None else end) - start - n + 1
        if count <= 0:
            return
        if self._c is not None:
            tokens = _int32(tokens)
            vals = _int32(values) if values is not None else None
            self.used += self._c.ngs_put_ngrams(
                self._ptr, self._shift, salt, self._address(tokens) + 4 * start, count, n,
                vals.ctypes.data if vals is not None else None, value0, keep == "first")
            return
        tokens = tokens[start:end]
        vals = values if values is not None else np.arange(value0, value0 + count, dtype=np.int64)
        if count <= _SCALAR_MAX:
            self.put_ngrams(tokens.tolist(), n, salt, vals.tolist(), keep)
        else:
            self.put_many(ngram_hashes(tokens, n), salt, vals, keep)

    def follow_key(self, hist: np.ndarray, last: int, n: int, salt: int, max_n: int) -> np.ndarray:
        """`follow` from the key hist[-(n-1):] + [last] (len(hist) >= n - 1): the chained
        tokens as a new int32 array."""
        if self._c is not None:
            if len(self._out) < max_n:
                self._out = np.zeros(max_n, dtype=np.int32)
                self._out_ptr = self._out.ctypes.data
            hist = _int32(hist)
            k = self._c.ngs_follow(self._ptr, self._shift, salt, self._address(hist), len(hist),
                                   last, n, max_n, self._out_ptr)
            return self._out[:k].copy()
        window = key_of(hist, last, n)
        out = self.follow(ngram_hash(window), salt, window, power(n), max_n)
        return np.asarray(out, dtype=np.int32)

    def find_key(self, hist: np.ndarray, last: int, n: int, salt: int) -> tuple[int, int]:
        """(position, key hash) of the key hist[-(n-1):] + [last] (len(hist) >= n - 1):
        the value stored for it if the n tokens of `hist` there equal the key, else -1."""
        if self._c is not None:
            hist = _int32(hist)
            pos = self._c.ngs_find(self._ptr, self._shift, salt, self._address(hist), len(hist),
                                   last, n, self._hash_ptr)
            return pos, int(self._hash[0])
        key = key_of(hist, last, n)
        h = ngram_hash(key)
        pos = self.get(h, salt)
        ok = 0 <= pos and pos + n <= len(hist) and hist[pos:pos + n].tolist() == key
        return (pos if ok else -1), h

    def index_find(self, hist: np.ndarray, last: int, n: int, salt: int, indexed: int, lag: int,
                   keep: str) -> tuple[int, int, int]:
        """A position index's step in one call: the windows of `hist` starting at
        [indexed, len(hist) - n - lag + 1) put (value: the start, `put_windows`), then
        `find_key` of hist[-(n-1):] + [last]. Returns (position or -1, key hash, starts
        indexed now)."""
        stop = max(indexed, len(hist) - n - lag + 1)
        if self._c is None:
            self.put_windows(hist, n, salt, value0=indexed, keep=keep, start=indexed,
                             end=stop + n - 1)
            return (*self.find_key(hist, last, n, salt), stop)
        hist = _int32(hist)
        self._state[0] = indexed
        pos = self._c.ngs_index_find(self._ptr, self._shift, salt, self._address(hist), len(hist),
                                     last, n, lag, keep == "first", self._state_ptr,
                                     self._hash_ptr)
        self.used += int(self._state[1])
        return pos, int(self._hash[0]), stop


def _int32(a: np.ndarray) -> np.ndarray:
    """`a` as a contiguous int32 array (itself when it is one: the engine's buffers)."""
    if a.dtype == np.int32 and a.flags.c_contiguous:
        return a
    return np.ascontiguousarray(a, dtype=np.int32)
