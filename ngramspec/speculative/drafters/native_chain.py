"""One sequence's drafters asked in one C call a step (drafting.c `ngs_propose`).

A chain's drafters of the kinds drafting.c knows (ngram-simple, ngram-map-k, ngram-mod:
seq_row.KINDS) draft there, each as its Python `draft` would, on its own per-sequence
state row (seq_row.py); a drafter of another kind (ngram-map-k4v, the draft model), or an
ngram-mod whose table takes its next chunk of n-grams, drafts in Python between two calls.
So where a step cost four Python drafters' calls (~65 us after a decode at 1 slot of the
4-block model), it costs one call and the proposals it returns.

Invariants: the proposals, the pool's slots and counts, and every drafter's state are
those of the drafters' `draft` called in order (tests/test_native_drafting.py); a
`NativeChain` is made after its drafters' `begin` for the sequence and dropped at `end`,
and it holds the rows it points C at, so a pointer never outlives its array.
"""
from __future__ import annotations

import ctypes as C
from typing import Sequence

import numpy as np

from ..pool import HashPool, _int32
from . import seq_row as R


def chain_params(pool: HashPool, drafters: Sequence) -> np.ndarray | None:
    """The parameter rows of a chain's drafters (kind PY where a drafter has none or
    drafts on another pool), or None where no drafter drafts in C or the pool has no C
    (HashPool._c)."""
    if pool._c is None:
        return None
    rows = [d.native_params() if hasattr(d, "native_params") and _pool_of(d) is pool
            else R.params(R.PY, 0) for d in drafters]
    if not rows or all(r[R.KIND] == R.PY for r in rows):
        return None
    return np.ascontiguousarray(np.stack(rows))


def _pool_of(d) -> HashPool | None:
    """The pool a drafter drafts on (C drafts it only on its chain's)."""
    return getattr(d, "pool", None) or getattr(getattr(d, "index", None), "pool", None)


class NativeChain:
    """The buffers of one sequence's `ngs_propose` calls: its drafters' state rows
    (addresses), their draft lengths, starts in the history and ngram-mod's tokens."""

    def __init__(self, pool: HashPool, drafters: Sequence, params: np.ndarray, seq_id: int,
                 buffer: np.ndarray | None = None):
        self.pool, self.drafters, self.params = pool, list(drafters), params
        # a history whose numpy base is `buffer` is its prefix (DrafterChain.begin): read
        # at this address, taken once (`.ctypes.data` costs ~15 us after a decode)
        self.buffer = buffer if buffer is not None and buffer is _int32(buffer) else None
        self._buffer_at = 0 if self.buffer is None else self.buffer.ctypes.data
        self.rows = [d.row(seq_id) if p[R.KIND] != R.PY else R.new_row()
                     for d, p in zip(drafters, params)]
        self.states = np.array([r.ctypes.data for r in self.rows], dtype=np.uintp)
        kinds = params[:, R.KIND]
        self.stride = int(max([1, *(max(p[R.M], p[R.MIN]) for p in params[kinds == R.MOD])]))
        self.out = np.zeros((len(drafters), self.stride), dtype=np.int32)
        self.lens = np.zeros(len(drafters), dtype=np.int32)
        self.starts = np.zeros(len(drafters), dtype=np.int64)
        self.filled = np.zeros(1, dtype=np.int64)
        self._args = tuple(C.c_void_p(a.ctypes.data) for a in (
            params, self.states, self.out, self.lens, self.starts, self.filled))
        self._lib = pool._c
        self._preset: tuple | None = None  # `preset`'s (call, resume index)

    def preset(self, call: tuple, resume: int) -> None:
        """A folded run (engine/fold.py) made the first ngs_propose of the `ask` whose
        (L, sampled, max_len, min_len, first_only, lo, hi) is `call`, into these buffers,
        and it returned `resume`: that ask goes on from there (so no drafter is asked twice
        for one step: ngram-map-k counts its key's hits per call). Any other ask drops it."""
        self._preset = (call, resume)

    def ask(self, seq_id: int, history: np.ndarray, sampled: int, max_len: int, min_len: int,
            first_only: bool, lo: int, hi: int) -> tuple[list, int]:
        """Drafters [lo, hi) asked in order: ([(index, draft)] for each draft of min_len
        tokens or more, the index after the last drafter asked); with first_only, up to
        the first such draft."""
        pool, lib, (p, s, o, ln, st, fl) = self.pool, self._lib, self._args
        if self.buffer is not None and history.base is self.buffer:
            ptr = self._buffer_at
        else:
            ptr = pool._address(_int32(history))
        L, py = len(history), {}
        i, preset, self._preset = lo, self._preset, None
        made = preset is not None and preset[0] == (L, sampled, max_len, min_len, first_only, lo, hi)
        while i < hi:
            if made:
                i, made = preset[1], False
            else:
                i = lib.ngs_propose(pool._ptr, pool._shift, pool.resets, ptr, L, sampled, max_len,
                                    min_len, first_only, hi, i, p, s, o, self.stride, ln, st, fl)
            if i >= hi:
                break
            py[i] = d = self.drafters[i].draft(seq_id, history, sampled, max_len)[:max_len]
            self.lens[i] = len(d)
            i += 1
            if first_only and len(d) >= min_len:  # later lengths: 0 (the call zeroed them)
                break
        pool.used += int(self.filled[0])
        self.filled[0] = 0
        return self._found(history, min_len, first_only, lo, hi, py)

    def _found(self, history: np.ndarray, min_len: int, first_only: bool, lo: int, hi: int,
               py: dict) -> tuple[list, int]:
        """`ask`'s result from the buffers C filled (a draft of the history is a view of
        it, ngram-mod's a copy of its buffer: the next call overwrites it) and `py`, the
        drafts made in Python, by index."""
        found, lens, starts = [], self.lens.tolist(), self.starts.tolist()
        for j in range(lo, hi):
            n = lens[j]
            if n < min_len or n == 0:
                continue
            d = py.get(j)
            if d is None:
                d = history[starts[j]:starts[j] + n] if starts[j] >= 0 else self.out[j, :n].copy()
            found.append((j, d))
            if first_only:
                return found, j + 1
        return found, hi
