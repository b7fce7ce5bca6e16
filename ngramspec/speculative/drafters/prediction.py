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

from collections import Counter

import numpy as np

from .base import EMPTY, as_tokens


def unused_tokens(prediction: np.ndarray, completion: list[int]) -> int:
    """The prediction's tokens that do not appear in the completion (OpenAI's
    `rejected_prediction_tokens`): its length less the tokens the two have in common,
    counted as multisets (linear time at a request's end, whatever the lengths). A
    prediction never drafted from, or that the output left at once, counts whole
    unless the completion still repeats its tokens."""
    common = Counter(prediction.tolist()) & Counter(completion)
    return len(prediction) - sum(common.values())


#: agreement buckets (`PredictionDrafter.agreement`): output tokens that agree with the
#: prediction just before the draft; measured on re-runs of edited documents, a draft
#: after 20+ agreeing tokens is almost never rejected at its first token, one after
#: 4-19 is in 9-22% of cases (docs/batch.md, "Re-runs")
AGREEMENT_EDGES = (4, 20)
_LOOKBACK = 32  # agreeing tokens counted at most (past the last edge, the count is moot)


class PredictionDrafter:
    name = "prediction"

    def __init__(self, prediction, n_key: int = 4):
        self.pred = as_tokens(prediction, "prediction")
        self.n_key = n_key
        self.n_prompt = 0
        self.at = 0  # the output's next token is expected at pred[at]
        self.on_pred = 0  # output tokens known to equal the prediction's prefix (-1: left it)
        self.agreement = 0  # bucket of the last draft's agreeing run (AGREEMENT_EDGES)

    def begin(self, seq_id: int, prompt: np.ndarray) -> None:
        self.n_prompt, self.at, self.on_pred, self.agreement = len(prompt), 0, 0, 0

    def _align(self, out: np.ndarray) -> int | None:
        """Index in pred of the token expected after `out`, or None. While the output is
        the prediction's prefix only its new tokens are compared (`on_pred`)."""
        if self.on_pred >= 0 and len(out) <= len(self.pred) and np.array_equal(
                self.pred[self.on_pred:len(out)], out[self.on_pred:]):
            self.on_pred = len(out)
            return len(out)  # still on the prediction
        self.on_pred = -1
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

    def _agreeing(self, out: np.ndarray, nxt: int) -> int:
        """Output tokens just before the draft that equal the prediction's just before
        `nxt` (at most _LOOKBACK), as a bucket index."""
        n = min(_LOOKBACK, len(out), nxt)
        same = out[len(out) - n:][::-1] == self.pred[nxt - n:nxt][::-1]
        run = int(np.argmin(same)) if not same.all() else n
        return sum(run >= e for e in AGREEMENT_EDGES)

    def draft(self, seq_id: int, history: np.ndarray, sampled: int, max_len: int) -> np.ndarray:
        out = np.concatenate([history[self.n_prompt:], np.asarray([sampled], dtype=np.int32)])
        nxt = self._align(out)
        if nxt is None or nxt >= len(self.pred) or max_len <= 0:
            return EMPTY
        self.at = nxt
        self.agreement = self._agreeing(out, nxt)
        return self.pred[nxt:nxt + max_len]

    def accept(self, seq_id: int, n_accepted: int) -> None:
        pass

    def end(self, seq_id: int) -> None:
        pass
