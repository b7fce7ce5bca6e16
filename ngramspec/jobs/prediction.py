"""A request's or a record's predicted output -> the token ids its drafter proposes.

One rule for the server (`prediction` of OpenAI's chat and completion requests) and
for batch records (`prediction`, or the text an earlier run gave the same id,
`ngramspec batch --previous`): text is tokenized as output text (no BOS, special
tokens not parsed, since the model would emit them as their own ids); token ids
are taken as they are, each checked against the vocabulary.
"""
from __future__ import annotations

from typing import Union

import numpy as np

from ..errors import TokenError
from .types import Prediction

PredictionInput = Union[Prediction, str, None]


def vocab_ids(tokens: list[int], n_vocab: int, what: str) -> np.ndarray:
    """`tokens` as int32 ids; TokenError naming the first outside [0, n_vocab) (`what`:
    "prompt", "prediction")."""
    for i, t in enumerate(tokens):
        if not 0 <= t < n_vocab:
            raise TokenError(f"{what} token {i} is {t}, outside the vocabulary [0, {n_vocab})")
    return np.asarray(tokens, dtype=np.int32)


def prediction_tokens(model, p: PredictionInput) -> np.ndarray | None:
    """Token ids of `p` (None: no prediction). Raises TokenError for an id outside the
    vocabulary."""
    if p is None:
        return None
    c = p.content if isinstance(p, Prediction) else p
    if isinstance(c, list) and c and isinstance(c[0], int):
        return vocab_ids(c, model.n_vocab, "prediction")
    text = c if isinstance(c, str) else "".join(part.text or "" for part in c)
    return model.tokenize(text, add_special=False, parse_special=False)
