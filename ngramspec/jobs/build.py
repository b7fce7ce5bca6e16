"""A request or a batch record -> the scheduler `Job`: one path for the server and batch.

`build_job` takes what both have (prompt tokens, the request's `speculative`,
`prediction`, `stop`, `n_predict`) with the defaults of the command that serves them
(`JobDefaults`); what differs stays with the caller: how the prompt is tokenized, the
server's header that turns speculation off, its context shift, slot pinning and
progress chunks, and the sampling parameters (both through `grammar_of`, the one
grammar rule).

Invariants:
- A prompt that leaves no room in a slot raises ContextOverflow before anything else.
- n_predict within the slot is `engine.request.output_budget`, the rule `Engine.start` applies.
- A record and a request with the same fields give the same Job.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from .prediction import prediction_tokens
from .samplers import other_samplers
from .scheduler import Job
from ..engine.request import output_budget
from ..settings.grammar import json_grammar, schema_grammar
from ..settings.sampling import SamplingParams, seed_or_random
from ..errors import ConfigError
from ..llama.model import ContextOverflow
from ..settings.config import SpecConfig


@dataclass(frozen=True)
class JobDefaults:
    """What a job gets for a field its request does not set (the command's flags), and
    the slot it runs in."""

    n_ctx_slot: int
    n_predict: int  # -1: until end of text or the slot is full
    spec: SpecConfig  # the command's speculation (a request's `speculative` overrides it)
    cache_prompt: bool = True


def one_grammar(req: Any) -> None:
    """ConfigError unless a request or record sets at most one of `grammar`,
    `json_schema` and (OpenAI) a `response_format` other than text (batch checks a
    record with it as it reads it)."""
    rf = getattr(req, "response_format", None)
    given = [n for n, v in (("grammar", req.grammar), ("json_schema", req.json_schema),
                            ("response_format", rf if rf is not None and rf.type != "text"
                             else None)) if v is not None]
    if len(given) > 1:
        raise ConfigError("use only one of " + ", ".join(given))


def request_sampling(default: SamplingParams, req: Any, n_ctx_slot: int,
                     **extra: Any) -> SamplingParams:
    """The SamplingParams of a request or a batch record, for the server and batch alike:
    each field it sets, else `default`'s (the command's flags), read as llama-server
    reads them: repeat_last_n (or penalty_last_n, not both) -1 is the slot's context, a
    negative seed random, its grammar (`grammar_of`) or the default's, the other samplers
    (`other_samplers`). A field the request's type lacks (a record has no top_k) is the
    default's. `extra`: fields only the server's requests carry (logit_bias, n_probs).
    The ranges are checked once: SamplingParams' own check (engine/sampling.py)."""
    get = lambda name: getattr(req, name, None)  # noqa: E731
    pick = lambda name: getattr(default, name) if get(name) is None else get(name)  # noqa: E731
    if get("repeat_last_n") is not None and get("penalty_last_n") is not None:
        raise ConfigError("use only one of repeat_last_n and penalty_last_n")
    last_n = get("repeat_last_n") if get("repeat_last_n") is not None else get("penalty_last_n")
    last_n = default.repeat_last_n if last_n is None else last_n
    return replace(default, temperature=float(pick("temperature")), top_k=pick("top_k"),
                   top_p=float(pick("top_p")), min_p=float(pick("min_p")),
                   repeat_penalty=float(pick("repeat_penalty")),
                   repeat_last_n=n_ctx_slot if last_n == -1 else last_n,
                   frequency_penalty=float(pick("frequency_penalty")),
                   presence_penalty=float(pick("presence_penalty")),
                   seed=seed_or_random(pick("seed")), grammar=grammar_of(req) or default.grammar,
                   **other_samplers(default, req, n_ctx_slot), **extra)


def grammar_of(req: Any) -> str | None:
    """The grammar a request or record asks for: `grammar`, `json_schema` or (OpenAI)
    `response_format` (`one_grammar` first)."""
    one_grammar(req)
    if req.grammar is not None:
        return req.grammar
    if req.json_schema is not None:
        return schema_grammar(req.json_schema or {"type": "object"})
    rf = getattr(req, "response_format", None)
    if rf is None or rf.type == "text":
        return None
    schema = rf.schema_
    if rf.type == "json_schema":
        schema = (rf.json_schema.schema_ if rf.json_schema is not None else None) or schema
        if schema is None:
            raise ConfigError("response_format.json_schema.schema is required for "
                              "type 'json_schema'")
    return schema_grammar(schema) if schema is not None else json_grammar()


def speculation(engine, base: SpecConfig, req: Any, wanted: bool,
                prediction: bool) -> tuple[bool, SpecConfig | None]:
    """(speculate?, the request's SpecConfig, or None where it is the engine's): `base`
    with the request's `speculative` override, decided by `Engine.speculates` (a
    prediction drafts even where the spec types are off)."""
    cfg = base
    if req.speculative is not None:
        cfg = req.speculative.apply(base, engine.draft_drafter is not None)
    return engine.speculates(cfg, wanted, prediction), (None if cfg == engine.spec else cfg)


def build_job(engine, defaults: JobDefaults, req: Any, tokens: np.ndarray,
              sampling: Callable[[], SamplingParams], sink: Callable, *, wanted: bool = True,
              n_predict: int | None = None, context_shift: tuple[int, int] | None = None,
              **job_fields: Any) -> Job:
    """The Job of `req` (a request body or a batch record) on prompt `tokens`.
    `sampling` builds its SamplingParams (called after the prompt fits); `wanted`:
    whether the client lets it speculate; `n_predict`: the tokens asked for (None: the
    default); `job_fields`: the server's extra Job fields (id_slot,
    return_progress). Raises ContextOverflow, ConfigError or TokenError."""
    n = len(tokens)
    if n >= defaults.n_ctx_slot:
        raise ContextOverflow(n, defaults.n_ctx_slot)
    want = defaults.n_predict if n_predict is None else n_predict
    prediction = prediction_tokens(engine.model, req.prediction)
    speculative, spec = speculation(engine, defaults.spec, req, wanted, prediction is not None)
    budget, truncated = output_budget(want, defaults.n_ctx_slot - n, bool(context_shift))
    cache = req.cache_prompt if getattr(req, "cache_prompt", None) is not None \
        else defaults.cache_prompt
    return Job(prompt=tokens, sampling=sampling(), n_predict=budget,
               truncate_at_length=truncated, context_shift=context_shift,
               speculative=speculative, spec=spec, stop=req.stop_list(), cache_prompt=cache,
               prediction=prediction, sink=sink, **job_fields)
