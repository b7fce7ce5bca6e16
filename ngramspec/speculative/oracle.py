"""The oracle drafter: drafts the recorded spec-off continuation (an upper bound).

If history + sampled is a prefix of the recorded sequence, it proposes the next
recorded tokens, so every draft is fully accepted and only the cost of
verifying long batches limits the speed-up. It exists for benchmarks only.
"""
from __future__ import annotations

import numpy as np

from .drafters import EMPTY


class OracleDrafter:
    name = "oracle"

    def __init__(self, truth: np.ndarray, n_max: int = 64):
        self.truth = np.asarray(truth, dtype=np.int32)
        self.n_max = n_max

    def begin(self, seq_id: int, prompt: np.ndarray) -> None:
        pass

    def draft(self, seq_id: int, history: np.ndarray, sampled: int, max_len: int) -> np.ndarray:
        L = len(history)
        if L >= len(self.truth) or self.truth[L] != sampled:
            return EMPTY
        return self.truth[L + 1:L + 1 + min(max_len, self.n_max)]

    def accept(self, seq_id: int, n_accepted: int) -> None:
        pass

    def end(self, seq_id: int) -> None:
        pass
