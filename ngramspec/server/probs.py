"""Per-token probabilities at the server: the request fields that ask for them, and their
rendering in llama-server's shapes (pure functions, no I/O), for the native and the
OpenAI routes alike.

Request: `n_probs` (llama-server; its alias `logprobs` on the completion endpoints, which
is also OpenAI's legacy /v1/completions form), chat's `logprobs: true` + `top_logprobs`
(n_probs = top_logprobs, 20 when absent), `post_sampling_probs`.

Rendering: each emitted token (a `TokenOutput`: the text it made sendable + its
`TokenProbs`, computed by the engine from the very logits row that sampled it, so the
numbers do not depend on speculation) becomes
`{id, token, bytes, logprob, top_logprobs: [{id, token, bytes, logprob}]}`; with
`post_sampling_probs` the keys are `prob` / `top_probs` and the values probabilities.
/completion puts the list in `completion_probabilities`, the OpenAI endpoints in
`choices[i].logprobs.content` (/v1/completions also gets OpenAI's legacy `tokens`,
`token_logprobs`, `top_logprobs`, `text_offset`). A probability of 0 has the lowest
float as its log, so JSON never holds -inf. The tokens' `token` texts concatenate to
the generated text.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Sequence

from ..engine.generate import GenerationResponse, TokenOutput
from .errors import APIError
from ..jobs.types import MAX_N_PROBS, ChatCompletionRequest

LOWEST = -3.4028234663852886e38  # the lowest float32 (what llama-server writes for log 0)
CHAT_DEFAULT_TOP = 20  # chat's n_probs when `logprobs: true` comes without `top_logprobs`


def _count(name: str, v: Any) -> int:
    """A probability count from the body: an integer (a bool as 0/1) in [0, MAX_N_PROBS]."""
    n = int(v)
    if not 0 <= n <= MAX_N_PROBS:
        raise APIError(f"{name} must be between 0 and {MAX_N_PROBS}, got {n}",
                       "invalid_request_error")
    return n


def request_probs(req: Any, n_vocab: int) -> dict:
    """The SamplingParams fields (`n_probs`, `post_sampling_probs`) a request sets; 400
    for out-of-range counts and for chat's `top_logprobs` without `logprobs: true`."""
    if isinstance(req, ChatCompletionRequest):
        if req.logprobs:
            n = CHAT_DEFAULT_TOP if req.top_logprobs is None else req.top_logprobs
        elif req.top_logprobs is not None:
            raise APIError("top_logprobs requires logprobs to be set to true",
                           "invalid_request_error")
        else:
            n = req.n_probs or 0
    elif req.n_probs is not None:
        n = req.n_probs
    else:
        alias = getattr(req, "logprobs", None)
        n = 0 if alias is None else _count("logprobs", alias)
    return {"n_probs": min(n, n_vocab), "post_sampling_probs": req.post_sampling_probs}


def logarithm(p: float) -> float:
    return math.log(p) if p > 0.0 else LOWEST


def _complete_utf8(b: bytes) -> str:
    """`b` decoded without a trailing incomplete UTF-8 sequence (bad bytes replaced)."""
    cut = len(b)
    for k in range(1, min(4, len(b)) + 1):  # the last lead byte among the final 4
        c = b[-k]
        if c & 0xC0 == 0x80:
            continue
        need = 2 if c & 0xE0 == 0xC0 else 3 if c & 0xF0 == 0xE0 else 4 if c & 0xF8 == 0xF0 else 1
        if need > k:
            cut = len(b) - k
        break
    return b[:cut].decode("utf-8", "replace")


def _value(p: float, post: bool) -> tuple[str, float]:
    return ("prob", p) if post else ("logprob", logarithm(p))


def token_json(model, o: TokenOutput) -> dict:
    """One emitted token: its text, bytes, (log)probability and the top candidates."""
    post = o.probs.post_sampling
    top = []
    for tok, p in o.probs.top:
        piece = model.piece(tok)
        k, v = _value(p, post)
        top.append({"id": tok, "token": _complete_utf8(piece), "bytes": list(piece), k: v})
    k, v = _value(o.probs.prob, post)
    return {"id": o.probs.token, "token": o.text, "bytes": list(o.text.encode()), k: v,
            "top_probs" if post else "top_logprobs": top}


def probs_json(model, outs: Sequence[TokenOutput]) -> list[dict]:
    """llama-server's `completion_probabilities` / `logprobs.content` list."""
    return [token_json(model, o) for o in outs]


def legacy_logprobs(outs: Sequence[TokenOutput], rendered: list[dict], offset: int) -> dict:
    """OpenAI's legacy /v1/completions fields (log-probabilities whatever
    post_sampling_probs says); text offsets start at `offset` characters."""
    offsets, at = [], offset
    for o in outs:
        offsets.append(at)
        at += len(o.text)
    post = bool(outs) and outs[0].probs.post_sampling
    key, top_key = ("prob", "top_probs") if post else ("logprob", "top_logprobs")
    log = logarithm if post else float
    return {"tokens": [r["token"] for r in rendered],
            "token_logprobs": [log(r[key]) for r in rendered],
            "top_logprobs": [{t["token"]: log(t[key]) for t in r[top_key]} for r in rendered],
            "text_offset": offsets}


def oai_logprobs(model, outs: Sequence[TokenOutput],
                 legacy_offset: int | None = None) -> dict | None:
    """`choices[i].logprobs`: None when there is nothing to report (as llama-server);
    with `legacy_offset` (/v1/completions) OpenAI's legacy fields as well."""
    if not outs:
        return None
    rendered = probs_json(model, outs)
    out: dict = {"content": rendered}
    if legacy_offset is not None:
        out.update(legacy_logprobs(outs, rendered, legacy_offset))
    return out


def final_outputs(model, outs: list[TokenOutput], r: GenerationResponse) -> list[TokenOutput]:
    """The tokens a non-streamed answer reports: after a stop string, llama-server leaves
    out as many trailing tokens as the stop string has."""
    if r.stop_type != "word" or not r.stopping_word:
        return outs
    n = len(model.tokenize(r.stopping_word, add_special=False, parse_special=False))
    return outs[:max(len(outs) - n, 0)]


def token_steps(r: GenerationResponse) -> list[GenerationResponse]:
    """A response that carries probabilities, split into one non-final response per
    token (text, token, probabilities, tokens predicted so far), as llama-server streams
    them: one chunk per token. The totals stay those of `r`."""
    n = len(r.probs)
    return [replace(r, text=o.text, tokens=[o.probs.token], finish_reason=None, probs=[o],
                    generation_tokens=r.generation_tokens - (n - 1 - k))
            for k, o in enumerate(r.probs)]
