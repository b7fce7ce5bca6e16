"""Request -> job preparation: parse and check the body, tokenize the prompt(s), clamp
to the slot's context, build the sampling and speculation settings (`prepare`), and the
scheduler `Job` from that (`make_job`). No response rendering and no routes here.

Client mistakes raise ConfigError / TokenError / APIError / ContextOverflow, which
`errors.to_api_error` turns into 4xx bodies.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from fastapi import Request

from .probs import request_probs
from .sampling_request import sampler_fields
from .slot_actions import context_shift
from ..settings import strict_json
from ..errors import ConfigError
from ..llama.model import ContextOverflow
from ..settings.sampling import RANDOM_SEED, SamplingParams
from ..jobs.chat import chat_prompt, continues_final
from .errors import APIError
from ..jobs.build import JobDefaults, build_job, request_sampling
from ..jobs.prediction import vocab_ids
from ..jobs.scheduler import Job
from .state import ServerState
from ..jobs.types import ChatCompletionRequest, PromptObject, _Generation

SPEC_HEADER = "X-Ngramspec-Speculative"
OFF_VALUES = {"off", "disabled", "false", "0", "none", "no"}
ON_VALUES = {"on", "enabled", "true", "1", "yes", ""}


@dataclass
class Prepared:
    """A request made ready to run: its scheduler Job (the sink is set when it is
    submitted, `make_job`), and what only the response needs."""

    job: Job
    prompt_text: str
    timings_per_token: bool = False


def _no_sink(event) -> None:  # a prepared job's sink until `make_job` gives it one
    raise RuntimeError("a prepared job ran before make_job gave it a sink")


def _spec_header(request: Request) -> bool:
    """Whether the request's X-Ngramspec-Speculative header lets it speculate (absent:
    yes); ConfigError for a value that is neither on nor off."""
    hdr = request.headers.get(SPEC_HEADER)
    if hdr is None:
        return True
    v = hdr.strip().lower()
    if v in OFF_VALUES:
        return False
    if v not in ON_VALUES:
        raise ConfigError(f"header {SPEC_HEADER} must be 'on' or 'off', got {hdr!r}")
    return True


def _sampling(state: ServerState, req: _Generation) -> SamplingParams:
    """`request_sampling` (jobs/build.py, batch's too) with the server's own fields."""
    return request_sampling(state.settings.sampling, req, state.n_ctx_slot,
                            **sampler_fields(state.engine.model, req, state.settings.sampling),
                            **request_probs(req, state.engine.model.n_vocab))


def check_tokens(state: ServerState, tokens: list[int]) -> np.ndarray:
    return vocab_ids(tokens, state.engine.model.n_vocab, "prompt")

def split_prompts(prompt: Any) -> list:
    """llama-server's rule: a list with no number at its top level is a batch of prompts
    (each a string, token ids, a mixed list or {prompt_string}); anything else is one."""
    batch = (prompt if isinstance(prompt, list) and prompt
             and not any(isinstance(p, int) for p in prompt) else [prompt])
    for p in batch:
        if isinstance(p, PromptObject) and p.multimodal_data:
            raise APIError("multimodal_data: this model takes text only", "invalid_request_error")
    return [p.prompt_string if isinstance(p, PromptObject) else p for p in batch]

def mixed_tokens(model, parts: list, add_special: bool = True,
                 parse_special: bool = True) -> list[int]:
    """llama.cpp's mixed list of text and token ids -> token ids: each text part
    tokenized (BOS only for a first part, with `add_special`), ids kept as they are
    (unchecked); ConfigError for any other element."""
    out: list[int] = []
    for i, p in enumerate(parts):
        if isinstance(p, str):
            out.extend(model.tokenize(p, add_special=add_special and i == 0,
                                      parse_special=parse_special).tolist())
        elif isinstance(p, int):
            out.append(p)
        else:
            raise ConfigError("a prompt holding token ids may contain only token ids and "
                              "strings")
    return out


def tokenize_prompt(state: ServerState, prompt: Any) -> tuple[np.ndarray, str]:
    """A string, token ids, or llama.cpp's mixed list -> (tokens, prompt text)."""
    model = state.engine.model
    if isinstance(prompt, str):
        if not prompt:
            raise ConfigError("the prompt is empty")
        return model.tokenize(prompt, add_special=True, parse_special=True), prompt
    if not prompt:
        raise ConfigError("the prompt is empty")
    tokens = check_tokens(state, mixed_tokens(model, prompt))
    if len(tokens) == 0:
        raise ConfigError("the prompt is empty")
    return tokens, model.detokenize(tokens)

def prepare(state: ServerState, req: _Generation, request: Request, tokens: np.ndarray,
            prompt_text: str, n_predict: int | None) -> Prepared:
    """The request's Job (`jobs.build.build_job`, batch records' path too) with the
    server's own parts: the speculation header, context shift, slot and progress."""
    wanted = _spec_header(request)
    defaults = JobDefaults(state.n_ctx_slot, state.settings.n_predict, state.settings.spec,
                           state.settings.cache_prompt)
    try:
        job = build_job(state.engine, defaults, req, tokens, lambda: _sampling(state, req),
                        _no_sink, wanted=wanted, n_predict=n_predict,
                        context_shift=context_shift(state.settings, req),
                        id_slot=-1 if req.id_slot < 0 else req.id_slot % state.settings.n_parallel,
                        return_progress=req.return_progress and req.stream)
    except ContextOverflow as err:
        err.args = (f"the request exceeds the available context size: the prompt has "
                    f"{err.n_prompt_tokens} tokens and a slot holds {state.n_ctx_slot} (-c "
                    f"{state.settings.n_ctx} shared by {state.settings.n_parallel} slots)",)
        raise
    return Prepared(job, prompt_text, req.timings_per_token)


def n_choices(state: ServerState, req: _Generation) -> int:
    """How many choices per prompt (`n_cmpl`, else `n`, else 1): 1 up to the slot
    count, as llama-server (400 otherwise)."""
    n = req.n_cmpl if req.n_cmpl is not None else 1 if req.n is None else req.n
    hi = state.settings.n_parallel
    if not 1 <= n <= hi:
        name = "n_cmpl" if req.n_cmpl is not None else "n"
        raise APIError(f"{name}: the number of choices must be between 1 and {hi} (the "
                       f"server's slots, -np), got {n}", "invalid_request_error")
    return n


def expand_choices(preps: list[Prepared], n: int) -> list[Prepared]:
    """`n` jobs per prompt, choice j of prompt p at index p * n + j (llama-server's
    order). Choice j > 0 may run in any slot and samples with seed + j (a random seed
    stays random), so sampled choices differ and greedy ones are equal."""
    out = []
    for p in preps:
        out.append(p)
        for j in range(1, n):
            s = p.job.sampling
            seed = s.seed if s.seed == RANDOM_SEED else (s.seed + j) & 0xFFFFFFFF
            out.append(replace(p, job=replace(p.job, id_slot=-1, sampling=replace(s, seed=seed))))
    return out


def render_messages(state: ServerState, body: ChatCompletionRequest) -> str:
    """The chat request's prompt text (assistant prefill and its checks as llama-server)."""
    cont = continues_final([m.role for m in body.messages], body.add_generation_prompt,
                           body.continue_final_message)
    return chat_prompt(state.engine.model, body.messages, state.settings, continue_final=cont)


async def parse_body(request: Request, model: type):
    """The JSON body validated as `model`, whatever the Content-Type (as llama-server)."""
    return model.model_validate(await read_json(request))


async def read_json(request: Request) -> dict:
    """The JSON object of the body: 400 if it is not one, holds a lone surrogate, a
    non-finite number or nesting deeper than strict_json.MAX_DEPTH."""
    raw = await request.body()
    data = strict_json.loads(raw, "JSON body") if raw.strip() else None
    if not isinstance(data, dict):
        raise APIError("the request body must be a JSON object", "invalid_request_error")
    if _SURROGATE_ESCAPE.search(raw):
        _check_unicode(data)
    return data


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _check_unicode(value: Any, where: str = "body") -> None:
    """400 for a string holding a lone surrogate (valid JSON, e.g. "\\ud800", but not
    text: it cannot be tokenized); a proper escaped pair decodes to one character."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise APIError(f"{where}: the string holds a lone UTF-16 surrogate, which is not "
                           "valid Unicode", "invalid_request_error") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_unicode(k, where)
            _check_unicode(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_unicode(v, f"{where}[{i}]")

def make_job(prep: Prepared, sink) -> Job:
    """The prepared request's Job with its sink: a new job each call (its own id)."""
    return replace(prep.job, sink=sink)
