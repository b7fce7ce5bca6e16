"""The FastAPI application: llama-server's endpoints on the ngramspec scheduler.

Request flow: validate (pydantic) -> tokenize, clamp to the slot's context,
build sampling + speculation settings (`prepare`) -> `Scheduler.submit` ->
wait for the first event (errors from prompt evaluation, e.g. a bad grammar,
become 4xx before any byte is sent) -> stream SSE or collect the response.
A disconnected client cancels its job; the scheduler frees the slot.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import threading
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Callable

import numpy as np
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from ..config import NGRAM_LIMIT, SpecConfig, parse_spec_types
from ..errors import ConfigError, TokenError
from ..model import ContextOverflow
from ..sampling import SamplingParams, json_grammar, schema_grammar
from . import metrics as metrics_mod
from . import probs as probs_mod
from .chat import chat_prompt
from .errors import APIError, error_body, install_handlers, loading_error, to_api_error
from ..generate import GenerationResponse
from .scheduler import Event, Job, Scheduler
from .sampling_request import sampler_fields
from .settings import ServerSettings
from .types import (ChatCompletionRequest, CompletionRequest, NativeCompletionRequest,
                    SpeculativeParams, _Generation, _OpenAI)

log = logging.getLogger("ngramspec.server")
SPEC_HEADER = "X-Ngramspec-Speculative"
OFF_VALUES = {"off", "disabled", "false", "0", "none", "no"}
ON_VALUES = {"on", "enabled", "true", "1", "yes", ""}


@dataclass
class ServerState:
    settings: ServerSettings
    engine: Any = None
    scheduler: Scheduler | None = None
    n_ctx_slot: int = 0
    ready: bool = False
    load_error: BaseException | None = None
    on_fatal: Callable[[], None] | None = None
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def model_id(self) -> str:
        return self.engine.model.path.name if self.engine is not None else "loading"

    def load(self, engine_factory: Callable | None = None) -> None:
        """Load the model and start the scheduler (runs in a background thread)."""
        s = self.settings
        try:
            delay = float(os.environ.get("NGRAMSPEC_SERVER_LOAD_DELAY", "0") or 0)
            if delay > 0:  # test hook: a visible loading phase
                time.sleep(delay)
            if engine_factory is None:
                from ..runtime import load_engine

                engine = load_engine(s.model, s.model_draft, s.n_ctx, s.threads, s.spec,
                                     n_seq=s.n_parallel, verbose=s.verbose,
                                     draft_p_min=s.draft_p_min, notify=log.warning)
            else:
                engine = engine_factory()
            self.n_ctx_slot = engine.ctx.n_ctx // s.n_parallel
            sched = Scheduler(engine, s.n_parallel, s.queue_size, self.n_ctx_slot)
            sched.start()
            self.engine, self.scheduler = engine, sched
            self.ready = True
            log.warning("ngramspec: model %s loaded; %d slots of %d tokens; speculation: %s",
                        engine.model.path.name, s.n_parallel, self.n_ctx_slot,
                        ",".join(s.spec.types) or "none")
        except BaseException as e:  # reported by `serve`, which then exits non-zero
            self.load_error = e
            log.error("ngramspec: loading failed: %s", e)
            if self.on_fatal is not None:
                self.on_fatal()


# ---------------------------------------------------------------------------- preparation


@dataclass
class Prepared:
    tokens: np.ndarray
    prompt_text: str
    sampling: SamplingParams
    n_predict: int
    truncate_at_length: bool
    speculative: bool
    spec: SpecConfig | None
    stop: list[str]
    cache_prompt: bool = True
    prediction: np.ndarray | None = None


def _clamp(v: int, lo: int, hi: int | None = None) -> int:
    v = max(v, lo)
    return min(v, hi) if hi is not None else v


def spec_override(base: SpecConfig, sp: SpeculativeParams) -> SpecConfig:
    """Apply a request's `speculative` object to the server's config (clamped, validated).

    n_max -> draft_max (>= 0); n_min -> draft_min (0..n_max); ngram_size_n ->
    every type's key length (ngram-mod n_match); ngram_size_m -> every type's
    drafted length (ngram-mod n_max); sizes clamped to [1, 1024].
    """
    cfg = base
    if sp.type is not None:
        cfg = replace(cfg, types=parse_spec_types(sp.type))
    if sp.ngram_size_n is not None:
        n = _clamp(sp.ngram_size_n, 1, NGRAM_LIMIT)
        cfg = replace(cfg, ngram_simple=replace(cfg.ngram_simple, size_n=n),
                      ngram_map_k=replace(cfg.ngram_map_k, size_n=n),
                      ngram_map_k4v=replace(cfg.ngram_map_k4v, size_n=n),
                      ngram_mod=replace(cfg.ngram_mod, n_match=n))
    if sp.ngram_size_m is not None:
        m = _clamp(sp.ngram_size_m, 1, NGRAM_LIMIT)
        cfg = replace(cfg, ngram_simple=replace(cfg.ngram_simple, size_m=m),
                      ngram_map_k=replace(cfg.ngram_map_k, size_m=m),
                      ngram_map_k4v=replace(cfg.ngram_map_k4v, size_m=m),
                      ngram_mod=replace(cfg.ngram_mod, n_max=m, n_min=min(cfg.ngram_mod.n_min, m)))
    draft_max = cfg.draft_max if sp.n_max is None else _clamp(sp.n_max, 0)
    draft_min = cfg.draft_min if sp.n_min is None else _clamp(sp.n_min, 0)
    if draft_max is not None:
        draft_min = min(draft_min, draft_max)
    return replace(cfg, draft_max=draft_max, draft_min=draft_min)


def _speculation(state: ServerState, req: _Generation, request: Request) -> tuple[bool, SpecConfig | None]:
    on = True
    hdr = request.headers.get(SPEC_HEADER)
    if hdr is not None:
        v = hdr.strip().lower()
        if v in OFF_VALUES:
            on = False
        elif v not in ON_VALUES:
            raise ConfigError(f"header {SPEC_HEADER} must be 'on' or 'off', got {hdr!r}")
    cfg = state.settings.spec
    if req.speculative is not None:
        cfg = spec_override(cfg, req.speculative)
    has_draft_model = state.engine.draft_drafter is not None
    on = on and (cfg.enabled or has_draft_model or req.prediction is not None)
    return on, (None if cfg == state.engine.spec else cfg)


def _grammar(req: _Generation) -> str | None:
    sources = []
    if req.grammar is not None:
        sources.append(("grammar", req.grammar))
    if req.json_schema is not None:
        sources.append(("json_schema", schema_grammar(req.json_schema or {"type": "object"})))
    rf = getattr(req, "response_format", None)
    if rf is not None and rf.type != "text":
        schema = rf.schema_
        if rf.type == "json_schema":
            schema = (rf.json_schema.schema_ if rf.json_schema is not None else None) or schema
            if schema is None:
                raise ConfigError("response_format.json_schema.schema is required for "
                                  "type 'json_schema'")
        sources.append(("response_format",
                        schema_grammar(schema) if schema is not None else json_grammar()))
    if len(sources) > 1:
        raise ConfigError("use only one of " + ", ".join(n for n, _ in sources))
    return sources[0][1] if sources else None


def _sampling(state: ServerState, req: _Generation) -> SamplingParams:
    d = state.settings.sampling
    pick = lambda v, default: default if v is None else v  # noqa: E731
    seed = pick(req.seed, d.seed)
    repeat_last_n = pick(req.repeat_last_n, d.repeat_last_n)
    if repeat_last_n == -1:
        repeat_last_n = state.n_ctx_slot
    for name in ("top_p", "min_p"):
        v = getattr(req, name)
        if v is not None and not 0.0 <= v <= 1.0:
            raise ConfigError(f"{name} must be between 0 and 1, got {v}")
    if req.repeat_penalty is not None and req.repeat_penalty <= 0:
        raise ConfigError(f"repeat_penalty must be > 0, got {req.repeat_penalty}")
    return SamplingParams(temperature=float(pick(req.temperature, d.temperature)),
                          top_k=pick(req.top_k, d.top_k), top_p=float(pick(req.top_p, d.top_p)),
                          min_p=float(pick(req.min_p, d.min_p)),
                          repeat_penalty=float(pick(req.repeat_penalty, d.repeat_penalty)),
                          repeat_last_n=repeat_last_n,
                          seed=0xFFFFFFFF if seed == -1 else seed,
                          grammar=_grammar(req) or d.grammar,
                          **sampler_fields(state.engine.model, req))


def _check_tokens(state: ServerState, tokens: list[int]) -> np.ndarray:
    n_vocab = state.engine.model.n_vocab
    for i, t in enumerate(tokens):
        if not 0 <= t < n_vocab:
            raise TokenError(f"prompt token {i} is {t}, outside the vocabulary [0, {n_vocab})")
    return np.asarray(tokens, dtype=np.int32)


def tokenize_prompt(state: ServerState, prompt: Any) -> tuple[np.ndarray, str]:
    """A string, token ids, or llama.cpp's mixed list -> (tokens, prompt text)."""
    model = state.engine.model
    if isinstance(prompt, str):
        if not prompt:
            raise ConfigError("the prompt is empty")
        return model.tokenize(prompt, add_special=True, parse_special=True), prompt
    if not prompt:
        raise ConfigError("the prompt is empty")
    out: list[int] = []
    for i, p in enumerate(prompt):
        if isinstance(p, str):
            out.extend(model.tokenize(p, add_special=i == 0, parse_special=True).tolist())
        else:
            out.append(p)
    tokens = _check_tokens(state, out)
    if len(tokens) == 0:
        raise ConfigError("the prompt is empty")
    return tokens, model.detokenize(tokens)


def _prediction(state: ServerState, req: _Generation) -> np.ndarray | None:
    """The request's predicted output as token ids (no BOS), or None."""
    p = req.prediction
    if p is None:
        return None
    c = p.content
    if isinstance(c, list) and c and isinstance(c[0], int):
        return _check_tokens(state, c)
    text = c if isinstance(c, str) else "".join(part.text or "" for part in c)
    return state.engine.model.tokenize(text, add_special=False, parse_special=False)


def prepare(state: ServerState, req: _Generation, request: Request, tokens: np.ndarray,
            prompt_text: str, n_predict: int | None) -> Prepared:
    n = len(tokens)
    if n >= state.n_ctx_slot:
        err = ContextOverflow(n, state.n_ctx_slot)
        err.args = (f"the request exceeds the available context size: the prompt has {n} tokens "
                    f"and a slot holds {state.n_ctx_slot} (-c {state.settings.n_ctx} shared by "
                    f"{state.settings.n_parallel} slots)",)
        raise err
    room = state.n_ctx_slot - n
    want = state.settings.n_predict if n_predict is None else n_predict
    speculative, spec = _speculation(state, req, request)
    return Prepared(tokens=tokens, prompt_text=prompt_text, sampling=_sampling(state, req),
                    n_predict=room if want < 0 else min(want, room),
                    truncate_at_length=want < 0 or want > room, speculative=speculative,
                    spec=spec, stop=req.stop_list(), cache_prompt=req.cache_prompt,
                    prediction=_prediction(state, req))


async def parse_body(request: Request, model: type):
    """The JSON body validated as `model`, whatever the Content-Type (as llama-server)."""
    raw = await request.body()
    try:
        data = json.loads(raw) if raw.strip() else None
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(f"malformed JSON body: {e}", "invalid_request_error") from None
    if not isinstance(data, dict):
        raise APIError("the request body must be a JSON object", "invalid_request_error")
    return model.model_validate(data)


# ---------------------------------------------------------------------------- running a job


async def _next_event(job: Job, request: Request) -> Event | None:
    """The job's next event; None if the client disconnected meanwhile."""
    get = asyncio.ensure_future(job.queue.get())
    try:
        while True:
            done, _ = await asyncio.wait({get}, timeout=0.25)
            if done:
                return get.result()
            if await request.is_disconnected():
                return None
    finally:
        if not get.done():
            get.cancel()


@dataclass
class HttpJob(Job):
    """A job whose events land on an asyncio queue of the request's event loop."""

    queue: asyncio.Queue | None = None


def _sink(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue):
    def sink(ev: Event) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, ev)
        except RuntimeError:  # the event loop is closed (shutdown)
            pass
    return sink


async def submit(state: ServerState, request: Request, prep: Prepared) -> tuple[Job, Event] | None:
    """Queue the job and wait for its first event (raises the prompt's error, if any)."""
    queue: asyncio.Queue = asyncio.Queue()
    job = HttpJob(prompt=prep.tokens, sampling=prep.sampling, n_predict=prep.n_predict,
                  speculative=prep.speculative, spec=prep.spec, stop=prep.stop,
                  sink=_sink(asyncio.get_running_loop(), queue), queue=queue,
                  truncate_at_length=prep.truncate_at_length, cache_prompt=prep.cache_prompt,
                  prediction=prep.prediction)
    state.scheduler.submit(job)
    try:
        ev = await _next_event(job, request)
    except BaseException:
        state.scheduler.cancel(job)
        raise
    if ev is None:
        state.scheduler.cancel(job)
        return None
    if ev.error is not None:
        raise ev.error
    return job, ev


async def collect(state: ServerState, request: Request, job: Job) -> tuple[str, list[int], Event, list] | None:
    """The whole answer: (text, tokens, final event, TokenOutputs when n_probs > 0)."""
    parts, tokens, probs = [], [], []
    try:
        while True:
            ev = await _next_event(job, request)
            if ev is None:
                return None
            if ev.error is not None:
                raise ev.error
            parts.append(ev.text)
            tokens.extend(ev.tokens)
            probs.extend(ev.response.probs)
            if ev.final:
                return "".join(parts), tokens, ev, probs
    finally:
        state.scheduler.cancel(job)  # no-op when finished


class JobStreamingResponse(StreamingResponse):
    """SSE response that cancels its job however the response ends."""

    def __init__(self, content, job: Job | list[Job], scheduler: Scheduler, **kw):
        super().__init__(content, media_type="text/event-stream", **kw)
        self.jobs, self.scheduler = (job if isinstance(job, list) else [job]), scheduler

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for job in self.jobs:
                self.scheduler.cancel(job)


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def events(state: ServerState, job: Job, first: Event) -> AsyncIterator[Event]:
    """The job's events after the start event (errors are yielded, not raised)."""
    try:
        while True:
            ev = await job.queue.get()
            yield ev
            if ev.final:
                return
    finally:
        state.scheduler.cancel(job)


async def submit_n(state: ServerState, request: Request, prep: Prepared,
                   n: int) -> list[tuple[Job, Event]] | None:
    """`n` independent jobs of one prepared request (OpenAI's `n` choices), each waited
    for until it has a slot; None (every job cancelled) if the client went away."""
    runs: list[tuple[Job, Event]] = []
    try:
        for _ in range(n):
            started = await submit(state, request, prep)
            if started is None:
                break
            runs.append(started)
    finally:
        if len(runs) < n:
            for job, _ in runs:
                state.scheduler.cancel(job)
    return runs if len(runs) == n else None


async def collect_all(state: ServerState, request: Request, jobs: list[Job]) -> list | None:
    """`collect` of every job concurrently; None if the client went away. One failing
    job cancels the others."""
    tasks = [asyncio.ensure_future(collect(state, request, job)) for job in jobs]
    try:
        got = await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
    return None if any(g is None for g in got) else list(got)


async def merged_events(state: ServerState, runs: list[tuple[Job, Event]]) -> AsyncIterator[tuple[int, Event]]:
    """(choice index, event) of every job as they arrive, until each job's final event
    (an error is final); leaving early cancels the jobs still running."""
    out: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, job: Job, first: Event) -> None:
        async for ev in events(state, job, first):
            out.put_nowait((i, ev))

    tasks = [asyncio.ensure_future(pump(i, job, first)) for i, (job, first) in enumerate(runs)]
    try:
        left = len(runs)
        while left:
            i, ev = await out.get()
            left -= ev.final
            yield i, ev
    finally:
        for t in tasks:
            t.cancel()


def spec_headers(speculative: bool, result: GenerationResponse | None = None) -> dict[str, str]:
    h = {SPEC_HEADER: "enabled" if speculative else "disabled"}
    if result is not None:
        h["X-Ngramspec-Acceptance-Rate"] = f"{result.acceptance_rate:.4f}"
        h["X-Ngramspec-Effective-Speedup"] = f"{result.tokens_per_step:.3f}"
    return h


def usage(*results: GenerationResponse) -> dict:
    """OpenAI's usage: the prompt counted once, the completion tokens of every choice."""
    prompt, completion = results[0].prompt_tokens, sum(r.generation_tokens for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


# ---------------------------------------------------------------------------- the app


def create_app(settings: ServerSettings, engine_factory: Callable | None = None,
               on_fatal: Callable[[], None] | None = None, load_async: bool = True) -> FastAPI:
    """The ASGI app; the model loads in a background thread once the server runs."""
    from .. import __version__ as version

    state = ServerState(settings, on_fatal=on_fatal)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if load_async:
            threading.Thread(target=state.load, args=(engine_factory,), name="ngramspec-loader",
                             daemon=True).start()
        else:
            state.load(engine_factory)
        try:
            yield
        finally:
            if state.scheduler is not None:
                state.scheduler.shutdown()

    app = FastAPI(title="ngramspec", version=version, lifespan=lifespan)
    app.state.ngramspec = state
    install_handlers(app)

    def require_key(request: Request) -> None:
        key = settings.api_key
        if not key:
            return
        auth = request.headers.get("authorization", "")
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else request.headers.get("x-api-key", "")
        if not hmac.compare_digest(given.encode(), key.encode()):
            raise APIError("Invalid API Key", "authentication_error")

    def require_ready() -> None:
        if state.load_error is not None:
            raise APIError(f"the model failed to load: {state.load_error}", "server_error")
        if not state.ready:
            raise loading_error()

    public = APIRouter(dependencies=[Depends(require_ready)])
    api = APIRouter(dependencies=[Depends(require_key), Depends(require_ready)])

    # ------------------------------------------------------------ health, models, props
    @app.get("/health")
    @app.get("/v1/health")
    async def health():
        require_ready()
        return {"status": "ok"}

    @public.get("/v1/models")
    @public.get("/models")
    async def models():
        m = state.engine.model
        return {"object": "list", "data": [{
            "id": state.model_id, "object": "model", "created": state.created,
            "owned_by": "ngramspec",
            "meta": {"n_vocab": m.n_vocab, "n_ctx_train": m.n_ctx_train,
                     "n_ctx": state.engine.ctx.n_ctx, "n_ctx_slot": state.n_ctx_slot,
                     "total_slots": settings.n_parallel}}]}

    def params_json(sampling: SamplingParams, n_predict: int, stop: list[str], spec: SpecConfig,
                    speculative: bool, stream: bool = False) -> dict:
        return {"n_predict": n_predict, "seed": sampling.seed, "temperature": sampling.temperature,
                "top_k": sampling.top_k, "top_p": sampling.top_p, "min_p": sampling.min_p,
                "repeat_last_n": sampling.repeat_last_n, "repeat_penalty": sampling.repeat_penalty,
                "stop": stop, "max_tokens": n_predict, "stream": stream,
                "grammar": sampling.grammar or "",
                "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"],
                "speculative": speculative,
                "speculative.types": ",".join(spec.types) or "none",
                "speculative.n_max": spec.max_draft(), "speculative.n_min": spec.draft_min,
                "speculative.ngram_size_n": spec.ngram_mod.n_match
                if spec.types == ("ngram-mod",) else spec.ngram_simple.size_n,
                "speculative.ngram_size_m": spec.ngram_mod.n_max
                if spec.types == ("ngram-mod",) else spec.ngram_simple.size_m,
                "timings_per_token": False, **probs_mod.settings_json(sampling, state.engine.model)}

    def default_params() -> dict:
        return params_json(settings.sampling, settings.n_predict, [], settings.spec,
                           settings.spec.enabled or state.engine.draft_drafter is not None)

    def slot_json(slot) -> dict:
        job, st = slot.job, slot.st
        if job is None:
            params, processing = default_params(), False
        else:
            spec = job.spec or settings.spec
            params = params_json(job.sampling, job.n_predict, job.stop, spec, job.speculative)
            processing = True
        n_decoded = st.n_generated if st is not None else 0
        return {"id": slot.id, "id_task": job.id if job is not None else -1,
                "n_ctx": state.n_ctx_slot, "speculative": params["speculative"],
                "is_processing": processing, "params": params,
                "next_token": {"has_next_token": processing, "has_new_line": slot.has_new_line,
                               "n_remain": (job.n_predict - n_decoded) if job is not None else -1,
                               "n_decoded": n_decoded},
                "draft_n": st.draft_n if st is not None else 0,
                "draft_n_accepted": st.draft_n_accepted if st is not None else 0}

    @api.get("/props")
    async def props():
        m = state.engine.model
        default = {"id": 0, "id_task": -1, "n_ctx": state.n_ctx_slot,
                   "speculative": default_params()["speculative"], "is_processing": False,
                   "params": default_params(), "prompt": "",
                   "next_token": {"has_next_token": True, "has_new_line": False, "n_remain": -1,
                                  "n_decoded": 0, "stopping_word": ""}}
        return {"default_generation_settings": default, "total_slots": settings.n_parallel,
                "model_path": str(m.path), "chat_template": m.chat_template or "",
                "chat_template_caps": {}, "modalities": {"vision": False, "audio": False},
                "build_info": f"ngramspec {version}", "is_sleeping": False,
                "n_ctx": state.engine.ctx.n_ctx, "queue_size": settings.queue_size,
                "speculative": {"types": list(settings.spec.types),
                                "draft_min": settings.spec.draft_min,
                                "draft_max": settings.spec.draft_max,
                                "pool_bytes": state.engine.pool.nbytes,
                                "draft_model": settings.model_draft}}

    @api.get("/slots")
    async def slots(fail_on_no_slot: int = 0):
        out = [slot_json(s) for s in state.scheduler.slots]
        if fail_on_no_slot and all(s["is_processing"] for s in out):
            raise APIError("no slot available", "unavailable_error")
        return out

    @api.get("/metrics")
    async def metrics():
        if not settings.metrics:
            raise APIError("This server does not support metrics endpoint. Start it with "
                           "`--metrics`", "not_supported_error")
        return PlainTextResponse(metrics_mod.render(state.scheduler, state.engine),
                                 media_type="text/plain; version=0.0.4")

    # ------------------------------------------------------------ /completion (native)
    @api.post("/completion")
    @api.post("/completions")
    async def completion(request: Request):
        body = await parse_body(request, NativeCompletionRequest)
        tokens, text = tokenize_prompt(state, body.prompt)
        prep = prepare(state, body, request, tokens, text, body.n_predict)
        started = await submit(state, request, prep)
        if started is None:
            return Response(status_code=499)
        job, first = started
        spec = job.spec or settings.spec

        def final_json(content: str, toks: list[int], ev: Event, stream: bool,
                       probs: list | None = None) -> dict:
            r = ev.response
            extra = {"completion_probabilities": probs_mod.probs_json(
                state.engine.model, probs_mod.final_outputs(state.engine.model, probs, r))} \
                if probs else {}
            return {**extra, "index": 0, "content": content, "tokens": toks if (body.return_tokens or stream) else [],
                    "id_slot": r.slot_id, "stop": True, "model": state.model_id,
                    "tokens_predicted": r.generation_tokens, "tokens_evaluated": r.prompt_tokens,
                    "generation_settings": params_json(prep.sampling, prep.n_predict, prep.stop,
                                                       spec, job.speculative, stream),
                    "prompt": prep.prompt_text, "has_new_line": "\n" in content,
                    "truncated": r.truncated, "stop_type": r.stop_type,
                    "stopping_word": r.stopping_word, "tokens_cached": r.cache_n,
                    "timings": r.timings()}

        if not body.stream:
            got = await collect(state, request, job)
            if got is None:
                return Response(status_code=499)
            content, toks, ev, probs = got
            return JSONResponse(final_json(content, toks, ev, False, probs),
                                headers=spec_headers(job.speculative, ev.response))

        async def gen():
            n = 0
            async for ev in events(state, job, first):
                if ev.error is not None:
                    yield sse(error_body(to_api_error(ev.error)))
                    return
                if ev.response is not None and ev.response.probs:  # one chunk per token
                    for t, o in zip(ev.tokens, ev.response.probs):
                        n += 1
                        yield sse({"index": 0, "content": o.text, "tokens": [t], "stop": False,
                                   "id_slot": first.slot_id, "tokens_predicted": n,
                                   "tokens_evaluated": len(prep.tokens),
                                   "completion_probabilities": probs_mod.probs_json(
                                       state.engine.model, [o])})
                    if ev.final:
                        yield sse(final_json("", [], ev, True))
                    continue
                n += len(ev.tokens)
                if ev.final:
                    yield sse(final_json(ev.text, ev.tokens, ev, True))
                else:
                    yield sse({"index": 0, "content": ev.text, "tokens": ev.tokens, "stop": False,
                               "id_slot": first.slot_id, "tokens_predicted": n,
                               "tokens_evaluated": len(prep.tokens)})

        return JobStreamingResponse(gen(), job, state.scheduler,
                                    headers=spec_headers(job.speculative))

    # ------------------------------------------------------------ OpenAI endpoints
    def oai_n_predict(body: _OpenAI) -> int | None:
        v = getattr(body, "max_completion_tokens", None)
        return v if v is not None else body.max_tokens

    async def oai_run(body: _OpenAI, request: Request, tokens, text, chat: bool):
        prep = prepare(state, body, request, tokens, text, oai_n_predict(body))
        runs = await submit_n(state, request, prep, body.n)
        if runs is None:
            return Response(status_code=499)
        jobs = [job for job, _ in runs]
        speculative = jobs[0].speculative
        cid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        base = {"id": cid, "created": created, "model": body.model or state.model_id,
                "system_fingerprint": f"ngramspec-{version}"}
        echo = text if (not chat and getattr(body, "echo", False)) else ""
        model = state.engine.model
        legacy = None if chat else len(echo)  # /v1/completions: OpenAI's legacy logprobs too

        if not body.stream:
            got = await collect_all(state, request, jobs)
            if got is None:
                return Response(status_code=499)
            choices = []
            for i, (content, _toks, ev, probs) in enumerate(got):
                r = ev.response
                lp = probs_mod.oai_logprobs(model, probs_mod.final_outputs(model, probs, r), legacy)
                if chat:
                    choices.append({"index": i, "message": {"role": "assistant", "content": content},
                                    "logprobs": lp, "finish_reason": r.finish_reason})
                else:
                    choices.append({"index": i, "text": echo + content, "logprobs": lp,
                                    "finish_reason": r.finish_reason})
            rs = [g[2].response for g in got]
            out = {**base, "object": "chat.completion" if chat else "text_completion",
                   "choices": choices, "usage": usage(*rs), "timings": rs[0].timings()}
            return JSONResponse(out, headers=spec_headers(speculative, rs[0]))

        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(text_delta: str | None, finish: str | None, role: bool = False, index: int = 0,
                  logprobs: dict | None = None) -> dict:
            if chat:
                delta: dict = {}
                if role:
                    delta["role"] = "assistant"
                if text_delta is not None:
                    delta["content"] = text_delta
                choice = {"index": index, "delta": delta, "logprobs": logprobs,
                          "finish_reason": finish}
            else:
                choice = {"index": index, "text": text_delta or "", "logprobs": logprobs,
                          "finish_reason": finish}
            return {**base, "object": obj, "choices": [choice]}

        async def gen():
            sent = [len(echo)] * len(runs)  # characters of each choice so far (text_offset)
            for i in range(len(runs)):
                if chat:
                    yield sse(chunk("", None, role=True, index=i))
                elif echo:
                    yield sse(chunk(echo, None, index=i))
            finals = []
            async for i, ev in merged_events(state, runs):
                if ev.error is not None:
                    yield sse(error_body(to_api_error(ev.error)))
                    return
                r = ev.response
                for o in r.probs:  # with logprobs: one chunk per token
                    lp = probs_mod.oai_logprobs(model, [o], None if chat else sent[i])
                    sent[i] += len(o.text)
                    yield sse(chunk(o.text, None, index=i, logprobs=lp))
                if ev.text and not r.probs:
                    yield sse(chunk(ev.text, None, index=i))
                if ev.final:
                    last = chunk(None if chat else "", r.finish_reason, index=i)
                    last["timings"] = r.timings()
                    yield sse(last)
                    finals.append(r)
            if include_usage:
                yield sse({**base, "object": obj, "choices": [], "usage": usage(*finals),
                           "timings": finals[0].timings()})
            yield "data: [DONE]\n\n"

        return JobStreamingResponse(gen(), jobs, state.scheduler,
                                    headers=spec_headers(speculative))

    @api.post("/v1/completions")
    async def v1_completions(request: Request):
        body = await parse_body(request, CompletionRequest)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise APIError("only one prompt per request is supported", "not_supported_error")
            prompt = prompt[0]
        tokens, text = tokenize_prompt(state, prompt)
        return await oai_run(body, request, tokens, text, chat=False)

    @api.post("/v1/chat/completions")
    @api.post("/chat/completions")
    async def v1_chat(request: Request):
        body = await parse_body(request, ChatCompletionRequest)
        if body.tools:
            raise APIError("tools are not supported by this server", "not_supported_error")
        m = state.engine.model
        text = chat_prompt(m, body.messages)
        tokens = m.tokenize(text, add_special=True, parse_special=True)
        return await oai_run(body, request, tokens, text, chat=True)

    app.include_router(public)
    app.include_router(api)
    return app
