"""A llama_batch written through numpy views (a field write costs a third of ctypes').

llama_batch_init allocates every row's sequence-id array apart (n_seq_max ids each);
a decode here gives each row one sequence, so the rows' `seq_id` pointers are pointed
into one int32 array of ours, written a slice at a time, and put back before
llama_batch_free frees them (`free`).

Invariants: every row's n_seq_id is 1; the views are valid from `__init__` to `free`
(they point into llama.cpp's allocation); `free` is the only release and runs once.
"""
from __future__ import annotations

import ctypes as C

import numpy as np


class BatchViews:
    """`batch` (a llama_batch of `rows` rows) and numpy views of its arrays: `token`,
    `pos`, `seq` (each row's one sequence id) and `logits` (int8: 1 = a logit row);
    `ramp` is 0, 1, ... rows - 1 (positions are written as ramp + the first)."""

    def __init__(self, lc, rows: int, n_seq_max: int):
        self.lc = lc
        self.batch = b = lc.llama_batch_init(rows, 0, n_seq_max)
        self.token = np.ctypeslib.as_array(b.token, (rows,))
        self.pos = np.ctypeslib.as_array(b.pos, (rows,))
        self.logits = np.ctypeslib.as_array(b.logits, (rows,))
        np.ctypeslib.as_array(b.n_seq_id, (rows,))[:] = 1
        self.seq = np.zeros(rows, np.int32)
        self.ramp = np.arange(rows, dtype=np.int32)
        self._theirs = [C.cast(b.seq_id[i], C.c_void_p).value for i in range(rows)]
        at = self.seq.ctypes.data
        for i in range(rows):
            b.seq_id[i] = C.cast(at + 4 * i, C.POINTER(C.c_int32))

    def free(self) -> None:
        """llama_batch_free, with llama.cpp's own sequence-id arrays put back first."""
        if self.batch is None:
            return
        for i, addr in enumerate(self._theirs):
            self.batch.seq_id[i] = C.cast(addr, C.POINTER(C.c_int32))
        self.lc.llama_batch_free(self.batch)
        self.batch = None
