"""A second (smaller) GGUF model as a drafter, used after the draftless chain.

Invariants:
- The draft model must share the target's vocabulary (checked at load: same
  size and the same pieces at a spread of token ids), else `ModelError`.
- Per sequence, the draft context's KV cache holds a prefix of the target's
  accepted history; `draft` first feeds what is missing (history + sampled),
  then drafts greedily one token at a time, then drops the drafted entries.
- Drafting stops early when the draft model's top probability falls below
  `p_min` (llama.cpp's --draft-p-min), or the sequence's own value (a request's
  `speculative.p_min`, `set_p_min`); 0 disables the check.
"""
from __future__ import annotations

import numpy as np

from .drafters import EMPTY
from ..llama.context import Context, ContextParams
from ..llama.model import Model, ModelError


class DraftModelDrafter:
    name = "draft-model"

    def __init__(self, model: Model, ctx: Context, n_max: int = 16, p_min: float = 0.0):
        self.model, self.ctx, self.n_max, self.p_min = model, ctx, n_max, p_min
        self._n_kv: dict[int, int] = {}
        self._p_min: dict[int, float] = {}  # per-sequence overrides of p_min

    @classmethod
    def load(cls, path: str, target: Model, n_ctx: int, n_seq: int, threads: int,
             n_max: int = 16, p_min: float = 0.0, verbose: bool = False) -> "DraftModelDrafter":
        model = Model(path, verbose=verbose)
        check_same_vocab(target, model)
        # drafts are proposals the target verifies: the draft context needs no batch invariance
        ctx = Context(model, ContextParams(n_ctx=n_ctx, n_batch=512, n_seq_max=n_seq,
                                           n_threads=threads, batch_invariant=False))
        return cls(model, ctx, n_max=n_max, p_min=p_min)

    def set_p_min(self, seq_id: int, p_min: float | None) -> None:
        """Sequence `seq_id`'s p_min from now on (None: the drafter's own)."""
        if p_min is None:
            self._p_min.pop(seq_id, None)
        else:
            self._p_min[seq_id] = p_min

    def begin(self, seq_id: int, prompt: np.ndarray) -> None:
        self.ctx.clear(seq_id)
        self._n_kv[seq_id] = 0

    def _feed(self, seq_id: int, tokens: np.ndarray, pos0: int) -> int:
        """Decode `tokens` from pos0 in n_batch chunks; return the last row index."""
        row = -1
        for i in range(0, len(tokens), self.ctx.n_batch):
            chunk = tokens[i:i + self.ctx.n_batch]
            row = self.ctx.decode([(seq_id, chunk, pos0 + i, False)])[0][-1]
        return row

    def _pick(self, row: int, p_min: float) -> tuple[int, bool]:
        logits = self.ctx.logits_at(row)
        tok = int(np.argmax(logits))
        if p_min <= 0:
            return tok, True
        z = np.exp(logits - logits[tok])
        return tok, 1.0 / z.sum() >= p_min

    def draft(self, seq_id: int, history: np.ndarray, sampled: int, max_len: int) -> np.ndarray:
        n = min(max_len, self.n_max)
        if n <= 0:
            return EMPTY
        n_kv = self._n_kv.get(seq_id, 0)
        if n_kv > len(history):  # history was rewound: start over
            self.ctx.clear(seq_id)
            n_kv = 0
        todo = np.concatenate([history[n_kv:], np.asarray([sampled], dtype=np.int32)])
        row = self._feed(seq_id, todo, n_kv)
        base = len(history) + 1
        out: list[int] = []
        p_min = self._p_min.get(seq_id, self.p_min)
        for i in range(n):
            tok, confident = self._pick(row, p_min)
            if not confident or self.model.is_eog(tok):
                break
            out.append(tok)
            if i + 1 < n:
                row = self.ctx.decode([(seq_id, [tok], base + i, False)])[0][-1]
        self.ctx.truncate(seq_id, base)  # keep history + sampled only
        self._n_kv[seq_id] = base
        return np.asarray(out, dtype=np.int32) if out else EMPTY

    def accept(self, seq_id: int, n_accepted: int) -> None:
        pass

    def end(self, seq_id: int) -> None:
        self.ctx.clear(seq_id)
        self._n_kv.pop(seq_id, None)


def check_same_vocab(target: Model, draft: Model) -> None:
    """Raise ModelError unless the two models share a vocabulary."""
    if target.n_vocab != draft.n_vocab:
        raise ModelError(f"draft model {draft.path} has a vocabulary of {draft.n_vocab} tokens, "
                         f"the target {target.path} has {target.n_vocab}: they must be the same")
    if target.vocab_fingerprint() != draft.vocab_fingerprint():
        raise ModelError(f"draft model {draft.path} has a different vocabulary from the target "
                         f"{target.path} (same size, different tokens)")
