"""Logit rows of llama.cpp's output buffer as numpy views, each address's view made once.

`np.ctypeslib.as_array` builds a ctypes array type and an ndarray per call (~5 us,
several times that right after a decode has flushed the caches); a greedy step reads
one row per sequence per step. Here `llama_get_logits_ith` is called through a
prototype that returns the row's address, and the view of n_vocab floats at that
address is made the first time the address is seen.

Invariant: a view is returned only for the address llama.cpp has just given for that
row, so it reads the current buffer even after llama.cpp reallocated it (a view of an
old address is never handed out unless llama.cpp hands out that address again).
"""
from __future__ import annotations

import ctypes as C

import numpy as np

from .backend import _llama

#: views kept at most (a long run with a reallocated buffer drops them all, then refills)
MAX_VIEWS = 4096


class LogitRows:
    """`row(ctx_ptr, index)`: llama_get_logits_ith of one llama_context as a numpy view."""

    def __init__(self, n_vocab: int):
        fn = _llama().llama_get_logits_ith
        self._ith = C.CFUNCTYPE(C.c_void_p, C.c_void_p, C.c_int32)(C.cast(fn, C.c_void_p).value)
        self._views: dict[int, np.ndarray] = {}
        self.n_vocab = n_vocab

    def row(self, ctx_ptr, index: int) -> np.ndarray:
        """Logits of batch index `index` of the last decode (valid until the next one).
        ValueError where llama.cpp has no such row."""
        addr = self._ith(ctx_ptr, index)
        if not addr:
            raise ValueError(f"llama.cpp has no logits for batch index {index}")
        view = self._views.get(addr)
        if view is None:
            if len(self._views) >= MAX_VIEWS:
                self._views.clear()
            view = np.ctypeslib.as_array((C.c_float * self.n_vocab).from_address(addr))
            self._views[addr] = view
        return view
