"""Request fields that go into the sampler chain: `logit_bias`, `ignore_eos` (the
other samplers: jobs/samplers.py, shared with batch records).

`logit_bias` is read as llama-server reads it:
- a list of `[token, bias]` pairs, where `token` is an id or a string (every token of
  the string, tokenized without BOS and without parsing special tokens, gets the bias);
- an object `{"token id" or string: bias}` (OpenAI's form, strings as above);
- `bias` is a number, or `false` to ban the token (-inf). Anything else in an entry,
  and ids outside the vocabulary, are skipped.
"""
from __future__ import annotations

import math
import re
from typing import Any


_INT = re.compile(r"\s*[+-]?\d+")


def _bias(v: Any) -> float | None:
    """A bias value: a number, or false (-inf); None for anything else."""
    if v is False:
        return -math.inf
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return None


def _tokens(model, key: Any) -> list[int]:
    """Token ids an entry's key names (an id in range, or a string's tokens)."""
    if isinstance(key, int) and not isinstance(key, bool):
        return [key] if 0 <= key < model.n_vocab else []
    if isinstance(key, str):
        if _INT.fullmatch(key):
            return _tokens(model, int(key))
        return model.tokenize(key, add_special=False, parse_special=False).tolist()
    return []


def parse_logit_bias(model, raw: Any) -> tuple[tuple[int, float], ...]:
    """A request's `logit_bias` (list or object form) -> ((token, bias), ...) in request order."""
    if raw is None:
        return ()
    if isinstance(raw, dict):
        entries = list(raw.items())
    else:
        entries = [tuple(e) for e in raw if isinstance(e, (list, tuple)) and len(e) == 2]
    out = []
    for key, value in entries:
        bias = _bias(value)
        if bias is not None:
            out.extend((t, bias) for t in _tokens(model, key))
    return tuple(out)


def sampler_fields(model, req: Any, default) -> dict:
    """The SamplingParams fields `logit_bias` and `ignore_eos` set (each unset one: the
    server's default, `default`: -l/--logit-bias, --ignore-eos)."""
    return {"logit_bias": default.logit_bias if req.logit_bias is None
            else parse_logit_bias(model, req.logit_bias),
            "ignore_eos": default.ignore_eos if req.ignore_eos is None else req.ignore_eos}
