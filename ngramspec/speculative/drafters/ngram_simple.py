"""ngram-simple: draft what followed the most recent earlier occurrence of the last n tokens.

Semantics (llama.cpp common/ngram-map.cpp, `common_ngram_simple_draft`):
- key = last n-1 history tokens + the sampled token;
- needs len(history) > n + m + 1;
- finds the most recent earlier occurrence of the key and drafts up to m tokens
  that followed it; a continuation shorter than n tokens is not drafted.
Difference: llama.cpp scans the history backwards on every call (O(history));
we look the key up in a per-sequence position index in the shared pool (O(1)
amortised), then confirm the tokens. llama.cpp's scan skips position 0 and the
occurrence ending one token before the key; ours does not (it can only find a
match llama.cpp would also accept, or none).
"""
from __future__ import annotations

import numpy as np

from ...settings.config import NgramMapParams
from ..pool import HashPool
from . import seq_row as R
from .base import EMPTY
from .index import SeqIndex

NS_RECENT = 0x51


class NgramSimple:
    name = "ngram-simple"

    def __init__(self, params: NgramMapParams, pool: HashPool):
        self.n, self.m = params.size_n, params.size_m
        self.index = SeqIndex(pool, self.n, keep="last", lag=0, namespace=NS_RECENT)

    def begin(self, seq_id: int, prompt: np.ndarray) -> None:
        self.index.begin(seq_id, prompt)

    def row(self, seq_id: int) -> np.ndarray:
        """The sequence's state row (seq_row.py): its index's."""
        return self.index.row(seq_id)

    def native_params(self) -> np.ndarray:
        """This drafter's parameter row for drafting.c (seq_row.params)."""
        return self.index.params(R.SIMPLE, self.m)

    def draft(self, seq_id: int, history: np.ndarray, sampled: int, max_len: int) -> np.ndarray:
        n, m, L = self.n, self.m, len(history)
        if L <= n + m + 1 or max_len <= 0:
            self.index.sync(seq_id, history)
            return EMPTY
        pos, _ = self.index.sync_find(seq_id, history, sampled)
        if pos < 0:
            return EMPTY
        copy = min(m, L - (pos + n))
        if copy < n:
            return EMPTY
        return history[pos + n:pos + n + min(copy, max_len)]

    def accept(self, seq_id: int, n_accepted: int) -> None:
        pass  # stateless, as in llama.cpp

    def end(self, seq_id: int) -> None:
        self.index.end(seq_id)
