"""The `Drafter` protocol every speculation method implements, token coercion, and how
far a draft agrees with what was emitted (`common_prefix`).

A drafter serves many sequences at once (one per server slot), keyed by `seq_id`:

    begin(seq_id, prompt)                  once per request, before any draft
    draft(seq_id, history, sampled, max_len) -> int32 array, len <= max_len (may be empty)
    accept(seq_id, n_accepted)             after a draft was verified; 0 <= n_accepted <= len(draft)
    end(seq_id)                            when the request finishes or is cancelled

`history` is every token of the sequence so far *excluding* `sampled`, the token
the target just produced (llama.cpp's `prompt` and `id_last`). Within one request
`history` only grows, and grows by exactly the tokens emitted since the last call.
Drafts are proposals: the caller verifies every token, so a drafter may be wrong
but must never fail on well-formed input.
"""
from __future__ import annotations

from typing import Iterable, Protocol, runtime_checkable

import numpy as np

from ...errors import TokenError

EMPTY = np.zeros(0, dtype=np.int32)


@runtime_checkable
class Drafter(Protocol):
    name: str

    def begin(self, seq_id: int, prompt: np.ndarray) -> None: ...

    def draft(self, seq_id: int, history: np.ndarray, sampled: int, max_len: int) -> np.ndarray: ...

    def accept(self, seq_id: int, n_accepted: int) -> None: ...

    def end(self, seq_id: int) -> None: ...


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens `a` and `b` share (a draft's accepted run against the
    tokens emitted; a cached prompt's reusable prefix)."""
    n = min(len(a), len(b))
    neq = np.flatnonzero(a[:n] != b[:n])
    return int(neq[0]) if len(neq) else n


def as_tokens(tokens: Iterable[int] | np.ndarray, what: str = "tokens") -> np.ndarray:
    """Coerce to a 1-D int32 array of non-negative token ids, or raise TokenError.

    Fast path: an int32 ndarray is returned as is (the engine's own buffers).
    """
    if isinstance(tokens, np.ndarray) and tokens.dtype == np.int32 and tokens.ndim == 1:
        return tokens
    seq = list(tokens) if not isinstance(tokens, np.ndarray) else tokens.tolist()
    for i, t in enumerate(seq):
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
            raise TokenError(f"{what} must be non-negative integers; item {i} is {t!r}")
        if t < 0 or t > 0x7FFFFFFF:
            raise TokenError(f"{what} must be non-negative 32-bit integers; item {i} is {t}")
    return np.asarray(seq, dtype=np.int32).reshape(-1)


def as_token(t: object, what: str = "sampled token") -> int:
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
        raise TokenError(f"{what} must be a non-negative integer, got {t!r}")
    return int(t)
