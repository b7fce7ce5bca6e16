"""Drafts from a client's predicted output (OpenAI's "predicted outputs").

A request may send the text it expects the answer to be close to (a file to
edit, the previous version of a document). While the output follows the
prediction, the drafter proposes the prediction's next tokens; after the output
leaves it (an edit), it re-aligns on the last `n_key` output tokens: the
continuation after their first occurrence in the prediction at or after the
current alignment (the prediction's next match), else their last one anywhere.
An output that left the prediction before it had `n_key` tokens is not re-aligned
until it has them (a shorter key matches almost anywhere: a wrong prediction would
draft from chance matches). Given the exact output as prediction, it is the oracle
drafter of the benchmarks.

One instance serves one sequence (it holds that request's prediction). As every
drafter, it only proposes: the target verifies every token.
"""
from __future__ import annotations

import numpy as np

from .base import EMPTY, as_tokens


class PredictionDrafter:
    name = "prediction"

    def __init__(self, prediction, n_key: int = 4):
        self.pred = as_tokens(prediction, "prediction")
        self.n_key = n_key
        self.n_prompt = 0
        self.at = 0  # the output's next token is expected at pred[at]

    def begin(self, seq_id: int, prompt: np.ndarray) -> None:
        self.n_prompt, self.at = len(prompt), 0

    def _align(self, out: np.ndarray) -> int | None:
        """Index in pred of the token expected after `out`, or None."""
        if len(out) <= len(self.pred) and np.array_equal(self.pred[:len(out)], out):
            return len(out)  # still on the prediction
        k = self.n_key
        P = self.pred
        if len(out) < k or len(P) < k:
            return None
        key = out[-k:]
        win = np.lib.stride_tricks.sliding_window_view(P, k)
        hits = np.flatnonzero((win == key).all(axis=1))
        if not len(hits):
            return None
        after = hits[hits + k >= self.at]
        return int((after[0] if len(after) else hits[-1]) + k)

    def draft(self, seq_id: int, history: np.ndarray, sampled: int, max_len: int) -> np.ndarray:
        out = np.concatenate([history[self.n_prompt:], np.asarray([sampled], dtype=np.int32)])
        nxt = self._align(out)
        if nxt is None or nxt >= len(self.pred) or max_len <= 0:
            return EMPTY
        self.at = nxt
        return self.pred[nxt:nxt + max_len]

    def accept(self, seq_id: int, n_accepted: int) -> None:
        pass

    def end(self, seq_id: int) -> None:
        pass
