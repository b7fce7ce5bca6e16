"""llama-server's own endpoints: /health, /props, /slots, /metrics, /completion,
/tokenize, /detokenize, /apply-template. Routes get the server state through FastAPI
dependencies (`ready_state`: 503 while the model loads; `require_key`: --api-key)."""
from __future__ import annotations

from typing import AsyncIterator

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from . import metrics as metrics_mod
from . import probs, render
from ..jobs.chat import chosen_template
from .errors import APIError, error_body, to_api_error
from .prepare import (
    Prepared,
    check_tokens,
    expand_choices,
    mixed_tokens,
    n_choices,
    parse_body,
    prepare,
    render_messages,
    split_prompts,
    tokenize_prompt,
)
from .run import Run, RunStreamingResponse, sse, start_run
from ..jobs.scheduler import Event, Job
from .state import ServerState, ready_state, require_key
from ..jobs.types import (
    ChatCompletionRequest,
    DetokenizeRequest,
    NativeCompletionRequest,
    TokenizeRequest,
)

public = APIRouter()
router = APIRouter(dependencies=[Depends(require_key)])


@public.api_route("/health", methods=["GET", "HEAD"])
@public.api_route("/v1/health", methods=["GET", "HEAD"])
async def health(state: ServerState = Depends(ready_state)):
    return {"status": "ok"}


def idle_params(state: ServerState) -> dict:
    s = state.settings
    return render.params_json(s.sampling, s.n_predict, [], s.spec,
                              state.engine.speculates(s.spec),
                              model=state.engine.model)


@router.get("/props")
async def props(state: ServerState = Depends(ready_state)):
    m, s = state.engine.model, state.settings
    params = idle_params(state)
    default = {"id": 0, "id_task": -1, "n_ctx": state.n_ctx_slot,
               "speculative": params["speculative"], "is_processing": False,
               "params": params, "prompt": "",
               "next_token": [{"has_next_token": True, "has_new_line": False,
                               "n_remain": -1, "n_decoded": 0, "stopping_word": ""}]}
    return {"default_generation_settings": default, "total_slots": s.n_parallel,
            "model_path": str(m.path), "model_alias": state.model_id,
            "chat_template": chosen_template(s) or m.chat_template or "",
            "chat_template_caps": {}, "modalities": {"vision": False, "audio": False},
            "build_info": render.system_fingerprint(), "is_sleeping": False,
            "n_ctx": state.engine.ctx.n_ctx, "queue_size": s.queue_size,
            "speculative": {"types": list(s.spec.types), "draft_min": s.spec.draft_min,
                            "draft_max": s.spec.draft_max,
                            "pool_bytes": state.engine.pool.nbytes,
                            "draft_model": s.model_draft}}


@router.get("/slots")
async def slots(fail_on_no_slot: int = 0, state: ServerState = Depends(ready_state)):
    if not state.settings.slots:
        raise APIError("This server does not support slots endpoint. Start it with `--slots`",
                       "not_supported_error")
    idle = idle_params(state)
    out = [render.slot_json(s, state.n_ctx_slot, idle, state.settings.spec, state.engine.model)
           for s in state.scheduler.slots]
    if fail_on_no_slot and all(s["is_processing"] for s in out):
        raise APIError("no slot available", "unavailable_error")
    return out


@router.get("/metrics")
async def metrics(state: ServerState = Depends(ready_state)):
    if not state.settings.metrics:
        raise APIError("This server does not support metrics endpoint. Start it with "
                       "`--metrics`", "not_supported_error")
    r = PlainTextResponse(metrics_mod.render(state.scheduler, state.engine),
                          media_type="text/plain; version=0.0.4")
    # raw, to keep llama-server's spelling (Starlette lowercases names it is given)
    r.raw_headers.append((b"Process-Start-Time-Unix", str(state.created).encode()))
    return r


@router.post("/completion")
@router.post("/completions")
async def completion(request: Request, state: ServerState = Depends(ready_state)):
    """One result: one object; several (a batch of prompts, `n_cmpl` choices each):
    a list of them (index p * n_cmpl + j)."""
    body = await parse_body(request, NativeCompletionRequest)
    n = n_choices(state, body)
    preps = expand_choices([prepare(state, body, request, *tokenize_prompt(state, p),
                                    body.n_predict) for p in split_prompts(body.prompt)], n)
    started = await start_run(state, request, preps, body.stream)
    if started is None:
        return Response(status_code=499)
    run, _firsts = started
    if body.stream:
        return RunStreamingResponse(native_stream(state, run, preps, body), run,
                                    headers=render.spec_headers(run.jobs[0].speculative))
    got = await run.collect()
    if got is None:
        return Response(status_code=499)
    outs = []
    for i, (c, prep, job) in enumerate(zip(got, preps, run.jobs)):
        ev = c.final
        out = native_final_json(state, prep, job, i, c.text,
                                c.tokens if body.return_tokens else [], ev, False)
        listed = probs.final_outputs(state.engine.model, c.probs, ev.response)
        if listed:
            out["completion_probabilities"] = probs.probs_json(state.engine.model, listed)
        outs.append(render.pick_fields(body.response_fields, out) if body.response_fields
                    else out)
    headers = render.spec_headers(run.jobs[0].speculative, got[0].final.response)
    return JSONResponse(outs if len(outs) > 1 else outs[0], headers=headers)


def native_final_json(state: ServerState, prep: Prepared, job: Job, index: int, content: str,
                      tokens: list[int], ev: Event, stream: bool) -> dict:
    spec = job.spec or state.settings.spec
    settings = render.params_json(prep.job.sampling, prep.job.n_predict, prep.job.stop, spec,
                                  job.speculative, stream, prep.timings_per_token,
                                  model=state.engine.model)
    return render.native_final(index, content, tokens, ev.response, state.model_id, settings,
                               render.prompt_text(state.engine.model, prep.job.prompt))


def native_partials(state: ServerState, i: int, r, n_prompt: int, slot_id: int,
                    with_timings: bool) -> list[dict]:
    """A response's streamed chunks: one, or with probabilities one per token, each with
    its `completion_probabilities` (as llama-server)."""
    if not r.probs:
        return [render.native_partial(i, r, n_prompt, slot_id, with_timings)]
    out = []
    for step in probs.token_steps(r):
        c = render.native_partial(i, step, n_prompt, slot_id, with_timings)
        c["completion_probabilities"] = probs.probs_json(state.engine.model, step.probs)
        out.append(c)
    return out


async def native_stream(state: ServerState, run: Run, preps: list[Prepared],
                        body) -> AsyncIterator[str]:
    """/completion's SSE, every job's chunks carrying its index: progress chunks
    (return_progress), one chunk per emitted text (per token with probabilities), the
    final object (response_fields applied); an error object ends the stream. With
    probabilities the final event's tokens go in chunks of their own first, so the
    final object has none (as llama-server's)."""
    async for i, ev in run.events():
        if ev.error is not None:
            yield sse(error_body(to_api_error(ev.error)))
            return
        n_prompt = len(preps[i].job.prompt)
        r = ev.response
        if ev.progress is not None:
            yield sse(render.native_progress(i, ev.progress, n_prompt, ev.slot_id,
                                             body.timings_per_token))
        elif ev.final:
            text, toks = ev.text, ev.tokens
            if r.probs:
                for c in native_partials(state, i, r, n_prompt, ev.slot_id,
                                         body.timings_per_token):
                    yield sse(c)
                text, toks = "", []
            out = native_final_json(state, preps[i], run.jobs[i], i, text, toks, ev, True)
            yield sse(render.pick_fields(body.response_fields, out) if body.response_fields
                      else out)
        elif r is not None:
            for c in native_partials(state, i, r, n_prompt, ev.slot_id,
                                     body.timings_per_token):
                yield sse(c)


@router.post("/tokenize")
async def tokenize(request: Request, state: ServerState = Depends(ready_state)):
    body = await parse_body(request, TokenizeRequest)
    return {"tokens": tokenize_json(state, body)}


def tokenize_json(state: ServerState, body: TokenizeRequest) -> list:
    """/tokenize's `tokens`: ids, or {id, piece} with the piece as text when it is valid
    UTF-8 and as its list of byte values when it is not (a part of a character)."""
    if body.content is None:
        return []
    m = state.engine.model
    parts = [body.content] if isinstance(body.content, str) else body.content
    ids = mixed_tokens(m, parts, body.add_special, body.parse_special)
    check_tokens(state, ids)
    if not body.with_pieces:
        return ids
    out = []
    for t in ids:
        raw = m.piece(t, special=True)
        try:
            piece: str | list[int] = raw.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(raw)
        out.append({"id": t, "piece": piece})
    return out


@router.post("/detokenize")
async def detokenize(request: Request, state: ServerState = Depends(ready_state)):
    """Token ids -> text, special tokens shown (as llama-server)."""
    body = await parse_body(request, DetokenizeRequest)
    return {"content": render.prompt_text(state.engine.model, check_tokens(state, body.tokens))}


@router.post("/apply-template")
async def apply_template(request: Request, state: ServerState = Depends(ready_state)):
    body = await parse_body(request, ChatCompletionRequest)
    return {"prompt": render_messages(state, body)}
