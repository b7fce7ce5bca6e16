"""Token probabilities as llama-server renders them (pure functions, no I/O).

Each emitted token (a `TokenOutput`: the text it made sendable + its `TokenProbs`)
becomes `{id, token, bytes, logprob, top_logprobs: [{id, token, bytes, logprob}]}`;
with `post_sampling_probs` the keys are `prob` and `top_probs` and the values are
probabilities. `/completion` puts the list in `completion_probabilities`, the OpenAI
endpoints in `choices[i].logprobs.content` (`/v1/completions` also gets OpenAI's
legacy `tokens`/`token_logprobs`/`top_logprobs`/`text_offset`). A probability of 0
has the lowest float as its log, so JSON never holds -inf.
"""
from __future__ import annotations

import math
from typing import Sequence

from ..generate import GenerationResponse, TokenOutput
from ..sampling import SamplingParams

LOWEST = -3.4028234663852886e38  # C++ std::numeric_limits<float>::lowest()


def logarithm(p: float) -> float:
    return math.log(p) if p > 0.0 else LOWEST


def _complete_utf8(b: bytes) -> str:
    """`b` without a trailing incomplete UTF-8 sequence, decoded (bad bytes replaced)."""
    cut = len(b)
    for k in range(1, min(4, len(b)) + 1):  # find the last lead byte in the final 4
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
    """OpenAI's /v1/completions fields; text offsets start at `offset` characters."""
    offsets, at = [], offset
    for o in outs:
        offsets.append(at)
        at += len(o.text)
    key, top_key = (("prob", "top_probs") if outs and outs[0].probs.post_sampling
                    else ("logprob", "top_logprobs"))
    return {"tokens": [r["token"] for r in rendered],
            "token_logprobs": [r[key] if key == "logprob" else logarithm(r[key])
                               for r in rendered],
            "top_logprobs": [{t["token"]: t[key] if key == "logprob" else logarithm(t[key])
                              for t in r[top_key]} for r in rendered],
            "text_offset": offsets}


def oai_logprobs(model, outs: Sequence[TokenOutput], legacy_offset: int | None = None) -> dict | None:
    """`choices[i].logprobs`: None when there is nothing to report (as llama-server)."""
    if not outs:
        return None
    rendered = probs_json(model, outs)
    out = {"content": rendered}
    if legacy_offset is not None:
        out.update(legacy_logprobs(outs, rendered, legacy_offset))
    return out


def final_outputs(model, outs: list[TokenOutput], r: GenerationResponse) -> list[TokenOutput]:
    """The tokens a non-streamed answer reports: after a stop string, llama-server drops as
    many trailing tokens as the stop string has."""
    if r.stop_type != "word" or not r.stopping_word:
        return outs
    n = len(model.tokenize(r.stopping_word, add_special=False, parse_special=False))
    return outs[:max(len(outs) - n, 0)]


def settings_json(sampling: SamplingParams, model) -> dict:
    """The probability and bias fields of llama-server's `generation_settings`."""
    return {"n_probs": sampling.n_probs, "post_sampling_probs": sampling.post_sampling_probs,
            "ignore_eos": sampling.ignore_eos,
            "logit_bias": [{"bias": b if math.isfinite(b) else None, "token": t}
                           for t, b in sampling.biases(model)]}
