"""Request fields that go into the sampler chain: `logit_bias`, `ignore_eos`, `n_probs`.

`logit_bias` is read as llama-server reads it:
- a list of `[token, bias]` pairs, where `token` is an id or a string (every token of
  the string, tokenized without BOS and without parsing special tokens, gets the bias);
- an object `{"token id" or string: bias}` (OpenAI's form, strings as above);
- `bias` is a number, or `false` to ban the token (-inf). Anything else in an entry,
  and ids outside the vocabulary, are skipped.

`n_probs` per endpoint (llama-server's aliases):
- `/completion`, `/v1/completions`: `n_probs`, else `logprobs` (an integer);
- `/v1/chat/completions`: `logprobs: true` means `top_logprobs` (20 when unset);
  `top_logprobs` without `logprobs: true` is a client error.
"""
from __future__ import annotations

import math
import re
from typing import Any

from ..errors import ConfigError

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


def n_probs(req: Any) -> int:
    """How many top probabilities a request wants per generated token (0: none)."""
    logprobs = getattr(req, "logprobs", None)
    if isinstance(logprobs, bool) or hasattr(req, "top_logprobs"):  # chat
        top = getattr(req, "top_logprobs", None)
        if logprobs:
            return 20 if top is None else top
        if top is not None:
            raise ConfigError("top_logprobs requires logprobs to be set to true")
        return req.n_probs or 0
    if req.n_probs is not None:
        return req.n_probs
    return logprobs or 0


def sampler_fields(model, req: Any) -> dict:
    """The SamplingParams fields these request fields set."""
    return {"logit_bias": parse_logit_bias(model, req.logit_bias), "ignore_eos": req.ignore_eos,
            "n_probs": n_probs(req), "post_sampling_probs": req.post_sampling_probs}
