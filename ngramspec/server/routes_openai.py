"""OpenAI's endpoints: /v1/models, /v1/completions (`n` choices per prompt of a batch),
/v1/chat/completions, /v1/chat/completions/input_tokens. Routes get the server state
through FastAPI dependencies, as in routes_native."""
from __future__ import annotations

import time
import uuid
from typing import AsyncIterator

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from . import probs, render
from .errors import APIError, error_body, to_api_error
from .prepare import (
    Prepared,
    expand_choices,
    n_choices,
    parse_body,
    prepare,
    render_messages,
    split_prompts,
    tokenize_prompt,
)
from .routes_native import native_final_json
from .run import Collected, Run, RunStreamingResponse, sse, start_run
from .state import ServerState, ready_state, require_key
from ..jobs.types import ChatCompletionRequest, CompletionRequest, _OpenAI

public = APIRouter()
router = APIRouter(dependencies=[Depends(require_key)])


@public.get("/v1/models")
@public.get("/models")
async def models(state: ServerState = Depends(ready_state)):
    m = state.engine.model
    return {"object": "list", "data": [{
        "id": state.model_id, "aliases": list(state.settings.alias),
        "tags": list(state.settings.tags), "object": "model", "created": state.created,
        "owned_by": "ngramspec",
        "meta": {"n_vocab": m.n_vocab, "n_ctx_train": m.n_ctx_train,
                 "n_ctx": state.engine.ctx.n_ctx, "n_ctx_slot": state.n_ctx_slot,
                 "total_slots": state.settings.n_parallel}}]}


@router.post("/v1/completions")
async def v1_completions(request: Request, state: ServerState = Depends(ready_state)):
    body = await parse_body(request, CompletionRequest)
    prompts = [tokenize_prompt(state, p) for p in split_prompts(body.prompt)]
    return await oai_run(state, body, request, prompts, chat=False)


@router.post("/v1/chat/completions")
@router.post("/chat/completions")
async def v1_chat(request: Request, state: ServerState = Depends(ready_state)):
    body = await parse_body(request, ChatCompletionRequest)
    if body.tools:
        raise APIError("tools are not supported by this server", "not_supported_error")
    text = render_messages(state, body)
    tokens = state.engine.model.tokenize(text, add_special=True, parse_special=True)
    return await oai_run(state, body, request, [(tokens, text)], chat=True)


@router.post("/v1/chat/completions/input_tokens")
@router.post("/chat/completions/input_tokens")
async def chat_input_tokens(request: Request, state: ServerState = Depends(ready_state)):
    body = await parse_body(request, ChatCompletionRequest)
    text = render_messages(state, body)
    n = len(state.engine.model.tokenize(text, add_special=True, parse_special=True))
    return {"input_tokens": n, "object": "response.input_tokens"}


async def oai_run(state: ServerState, body: _OpenAI, request: Request,
                  prompts: list[tuple[np.ndarray, str]], chat: bool):
    """Run `n` jobs per prompt; answer one choice per job (index p * n + j), streamed or
    not."""
    n_predict = getattr(body, "max_completion_tokens", None)
    n_predict = body.max_tokens if n_predict is None else n_predict
    n = n_choices(state, body)
    preps = expand_choices([prepare(state, body, request, t, x, n_predict) for t, x in prompts],
                           n)
    started = await start_run(state, request, preps, body.stream)
    if started is None:
        return Response(status_code=499)
    run, _firsts = started
    base = render.oai_base(("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
                           int(time.time()), body.model or state.model_id)
    if body.stream:
        return RunStreamingResponse(oai_stream(state, run, preps, body, base, chat, n), run,
                                    headers=render.spec_headers(run.jobs[0].speculative))
    got = await run.collect()
    if got is None:
        return Response(status_code=499)
    results = [c.final.response for c in got]
    out = {**base, "object": "chat.completion" if chat else "text_completion",
           "choices": oai_choices(state, body, preps, got, chat),
           "usage": render.usage(results, n), "timings": results[-1].timings()}
    if state.settings.verbose if body.verbose is None else body.verbose:
        c = got[0]
        out["__verbose"] = native_final_json(state, preps[0], run.jobs[0], 0, c.text, c.tokens,
                                             c.final, False)
    return JSONResponse(out, headers=render.spec_headers(run.jobs[0].speculative, results[0]))


def _echo_offset(body, chat: bool, prep: Prepared) -> int | None:
    """Where a choice's text starts: legacy `text_offset`s count from there
    (/v1/completions only; None for chat, which has no legacy fields)."""
    if chat:
        return None
    return len(prep.prompt_text) if getattr(body, "echo", False) else 0


def oai_choices(state: ServerState, body, preps: list[Prepared], got: list[Collected],
                chat: bool) -> list[dict]:
    """The non-streamed choices, with their `logprobs` when asked for."""
    echo = getattr(body, "echo", False)
    model = state.engine.model
    choices = []
    for i, (got_i, p) in enumerate(zip(got, preps)):
        r = got_i.final.response
        c = render.oai_choice(chat, i, (p.prompt_text if echo else "") + got_i.text,
                              r.finish_reason)
        if p.job.sampling.n_probs > 0:
            listed = probs.final_outputs(model, got_i.probs, r)
            c["logprobs"] = probs.oai_logprobs(model, listed, _echo_offset(body, chat, p))
        choices.append(c)
    return choices


def text_chunks(state: ServerState, base: dict, chat: bool, i: int, r, per_token: bool,
                offsets: list) -> list[dict]:
    """A response's streamed text chunks: one, or with probabilities one per token with
    its `logprobs` (as llama-server); `offsets[i]` runs along the choice's text."""
    steps = probs.token_steps(r) if r.probs else ([r] if r.text else [])
    out = []
    for step in steps:
        c = render.oai_chunk(base, chat, i, text=step.text)
        if step.probs:
            c["choices"][0]["logprobs"] = probs.oai_logprobs(state.engine.model, step.probs,
                                                             offsets[i])
            if offsets[i] is not None:
                offsets[i] += len(step.text)
        if per_token:
            c["timings"] = r.timings()
        out.append(c)
    return out


async def oai_stream(state: ServerState, run: Run, preps: list[Prepared], body, base: dict,
                     chat: bool, n: int = 1) -> AsyncIterator[str]:
    """OpenAI SSE for every choice (index p * n + j): chat opens each choice with a role
    delta; text chunks (one per token, with its logprobs, when probabilities are asked
    for); each choice ends with a finish_reason chunk; then the usage chunk
    (stream_options.include_usage); `timings` on the very last chunk; [DONE]."""
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    for i, p in enumerate(preps):
        if chat:
            yield sse(render.oai_chunk(base, chat, i, role=True))
        elif getattr(body, "echo", False):
            yield sse(render.oai_chunk(base, chat, i, text=p.prompt_text))
    offsets = [_echo_offset(body, chat, p) for p in preps]
    finals: list = [None] * len(preps)
    async for i, ev in run.events():
        if ev.error is not None:
            yield sse(error_body(to_api_error(ev.error)))
            return
        if ev.progress is not None:
            if body.return_progress:
                c = render.oai_chunk(base, chat, i, role=chat)
                c["prompt_progress"] = ev.progress
                yield sse(c)
            continue
        r = ev.response
        if r is None:
            continue
        for c in text_chunks(state, base, chat, i, r, body.timings_per_token, offsets):
            yield sse(c)
        if ev.final:
            finals[i] = r
            last = render.oai_chunk(base, chat, i, finish=r.finish_reason)
            if all(f is not None for f in finals):
                tail = render.oai_usage_chunk(base, chat, finals, n) if include_usage else None
                (tail or last)["timings"] = r.timings()
                yield sse(last)
                if tail is not None:
                    yield sse(tail)
                yield "data: [DONE]\n\n"
            else:
                yield sse(last)
