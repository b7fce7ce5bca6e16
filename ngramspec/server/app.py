"""The FastAPI application: llama-server's endpoints on the ngramspec scheduler.

Request flow: validate (pydantic) -> tokenize, clamp to the slot's context,
build sampling + speculation settings (`prepare`) -> `Scheduler.submit` ->
wait for the first event (errors from prompt evaluation, e.g. a bad grammar,
become 4xx before any byte is sent) -> stream SSE or collect the response.
A disconnected client cancels its job; the scheduler frees the slot.
"""
from __future__ import annotations

import hmac
import json
import logging
import os
import re
import threading
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Callable

import numpy as np
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from ..config import NGRAM_LIMIT, SpecConfig, parse_spec_types
from ..errors import ConfigError, TokenError
from ..model import ContextOverflow
from ..sampling import SamplingParams, json_grammar, schema_grammar
from . import metrics as metrics_mod
from . import render
from .chat import chat_prompt, continues_final
from .errors import APIError, error_body, install_handlers, loading_error, to_api_error
from ..generate import GenerationResponse
from .run import Run, RunStreamingResponse, sse
from .scheduler import Event, Job, Scheduler
from .settings import ServerSettings
from .types import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                    NativeCompletionRequest, PromptObject, SpeculativeParams, TokenizeRequest,
                    _Generation, _OpenAI)

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
    timings_per_token: bool = False
    return_progress: bool = False  # streaming requests only, as llama-server


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
                          grammar=_grammar(req) or d.grammar)


def _check_tokens(state: ServerState, tokens: list[int]) -> np.ndarray:
    n_vocab = state.engine.model.n_vocab
    for i, t in enumerate(tokens):
        if not 0 <= t < n_vocab:
            raise TokenError(f"prompt token {i} is {t}, outside the vocabulary [0, {n_vocab})")
    return np.asarray(tokens, dtype=np.int32)


def split_prompts(prompt: Any) -> list:
    """llama-server's rule: a list with no number at its top level is a batch of prompts
    (each a string, token ids, a mixed list or {prompt_string}); anything else is one."""
    if isinstance(prompt, list) and prompt and not any(isinstance(p, int) for p in prompt):
        return [p.prompt_string if isinstance(p, PromptObject) else p for p in prompt]
    return [prompt]


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
        elif isinstance(p, int):
            out.append(p)
        else:
            raise ConfigError("a prompt holding token ids may contain only token ids and "
                              "strings")
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
                    prediction=_prediction(state, req), timings_per_token=req.timings_per_token,
                    return_progress=req.return_progress and req.stream)


def render_messages(state: ServerState, body: ChatCompletionRequest) -> str:
    """The chat request's prompt text (assistant prefill and its checks as llama-server)."""
    cont = continues_final([m.role for m in body.messages], body.add_generation_prompt,
                           body.continue_final_message)
    return chat_prompt(state.engine.model, body.messages, continue_final=cont)


def tokenize_json(state: ServerState, body: TokenizeRequest) -> list:
    """/tokenize's `tokens`: ids, or {id, piece} with the piece as text when it is valid
    UTF-8 and as its list of byte values when it is not (a part of a character)."""
    if body.content is None:
        return []
    m = state.engine.model
    parts = [body.content] if isinstance(body.content, str) else body.content
    ids: list[int] = []
    for i, p in enumerate(parts):
        if isinstance(p, str):
            ids.extend(m.tokenize(p, add_special=body.add_special and i == 0,
                                  parse_special=body.parse_special).tolist())
        else:
            ids.append(p)
    _check_tokens(state, ids)
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


async def parse_body(request: Request, model: type):
    """The JSON body validated as `model`, whatever the Content-Type (as llama-server)."""
    raw = await request.body()
    try:
        data = json.loads(raw) if raw.strip() else None
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(f"malformed JSON body: {e}", "invalid_request_error") from None
    if not isinstance(data, dict):
        raise APIError("the request body must be a JSON object", "invalid_request_error")
    if _SURROGATE_ESCAPE.search(raw):
        _check_unicode(data)
    return model.model_validate(data)


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


# ---------------------------------------------------------------------------- running a job


def make_job(prep: Prepared, sink) -> Job:
    return Job(prompt=prep.tokens, sampling=prep.sampling, n_predict=prep.n_predict,
               speculative=prep.speculative, spec=prep.spec, stop=prep.stop, sink=sink,
               truncate_at_length=prep.truncate_at_length, cache_prompt=prep.cache_prompt,
               prediction=prep.prediction, return_progress=prep.return_progress)


async def start_run(state: ServerState, request: Request, preps: list[Prepared],
                    stream: bool) -> tuple[Run, list[Event]] | None:
    """Submit one job per prepared prompt and wait until all have started; None if the
    client left meanwhile (the jobs are cancelled)."""
    run = Run(state.scheduler, request)
    for prep in preps:
        run.submit(lambda sink, prep=prep: make_job(prep, sink))
    firsts = await run.start()
    if firsts is None:
        return None
    if stream:
        run.gone.stop()  # the streaming response watches the connection itself
    return run, firsts


def spec_headers(speculative: bool, result: GenerationResponse | None = None) -> dict[str, str]:
    h = {SPEC_HEADER: "enabled" if speculative else "disabled"}
    if result is not None:
        h["X-Ngramspec-Acceptance-Rate"] = f"{result.acceptance_rate:.4f}"
        h["X-Ngramspec-Effective-Speedup"] = f"{result.tokens_per_step:.3f}"
    return h


def prompt_text_of(state: ServerState, tokens: np.ndarray) -> str:
    """The prompt as llama-server shows it: every token's piece, special ones included."""
    m = state.engine.model
    return b"".join(m.piece(t, special=True) for t in tokens.tolist()).decode("utf-8", "replace")


def native_final_json(state: ServerState, prep: Prepared, job: Job, index: int, content: str,
                      tokens: list[int], ev: Event, stream: bool) -> dict:
    spec = job.spec or state.settings.spec
    settings = render.params_json(prep.sampling, prep.n_predict, prep.stop, spec,
                                  job.speculative, stream, prep.timings_per_token)
    return render.native_final(index, content, tokens, ev.response, state.model_id, settings,
                               prompt_text_of(state, prep.tokens))


async def native_stream(state: ServerState, run: Run, preps: list[Prepared],
                        body) -> AsyncIterator[str]:
    """/completion's SSE, every prompt's chunks carrying its index: progress chunks
    (return_progress), one chunk per emitted text, the final object (response_fields
    applied); an error object ends the stream."""
    async for i, ev in run.events():
        if ev.error is not None:
            yield sse(error_body(to_api_error(ev.error)))
            return
        n_prompt = len(preps[i].tokens)
        if ev.progress is not None:
            yield sse(render.native_progress(i, ev.progress, n_prompt, ev.slot_id,
                                             body.timings_per_token))
        elif ev.final:
            out = native_final_json(state, preps[i], run.jobs[i], i, ev.text, ev.tokens, ev,
                                    True)
            yield sse(render.pick_fields(body.response_fields, out) if body.response_fields
                      else out)
        elif ev.response is not None:
            yield sse(render.native_partial(i, ev.response, n_prompt, ev.slot_id,
                                            body.timings_per_token))


async def oai_stream(state: ServerState, run: Run, preps: list[Prepared], body, base: dict,
                     chat: bool) -> AsyncIterator[str]:
    """OpenAI SSE for every choice (index i per prompt): chat opens each choice with a
    role delta; each choice ends with a finish_reason chunk; then the usage chunk
    (stream_options.include_usage); `timings` on the very last chunk; [DONE]."""
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    per_token = body.timings_per_token
    for i, p in enumerate(preps):
        if chat:
            yield sse(render.oai_chunk(base, chat, i, role=True))
        elif getattr(body, "echo", False):
            yield sse(render.oai_chunk(base, chat, i, text=p.prompt_text))
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
        if ev.text:
            c = render.oai_chunk(base, chat, i, text=ev.text)
            if per_token:
                c["timings"] = r.timings()
            yield sse(c)
        if ev.final:
            finals[i] = r
            last = render.oai_chunk(base, chat, i, finish=r.finish_reason)
            if all(f is not None for f in finals):
                tail = render.oai_usage_chunk(base, chat, finals) if include_usage else None
                (tail or last)["timings"] = r.timings()
                yield sse(last)
                if tail is not None:
                    yield sse(tail)
                yield "data: [DONE]\n\n"
            else:
                yield sse(last)


# ---------------------------------------------------------------------------- the app


def uvicorn_server(app: FastAPI, config):
    """uvicorn's Server for `app`, which on SIGINT/SIGTERM first fails the running and
    queued requests (503 "shutting down"), so that open connections end at once and the
    server exits without waiting out the graceful-shutdown timeout."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            sched = app.state.ngramspec.scheduler
            if sched is not None:
                sched.stop()
            super().handle_exit(sig, frame)

    return Server(config)



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

    def default_params() -> dict:
        return render.params_json(settings.sampling, settings.n_predict, [], settings.spec,
                                  settings.spec.enabled or state.engine.draft_drafter is not None)

    def slot_json(slot) -> dict:
        job, st = slot.job, slot.st
        if job is None:
            params, processing = default_params(), False
        else:
            spec = job.spec or settings.spec
            params = render.params_json(job.sampling, job.n_predict, job.stop, spec,
                                        job.speculative)
            processing = True
        n_decoded = st.n_generated if st is not None else 0
        return {"id": slot.id, "id_task": job.id if job is not None else -1,
                "n_ctx": state.n_ctx_slot, "speculative": params["speculative"],
                "is_processing": processing, "params": params,
                "next_token": [{"has_next_token": processing, "has_new_line": slot.has_new_line,
                                "n_remain": (job.n_predict - n_decoded) if job is not None else -1,
                                "n_decoded": n_decoded}],
                "draft_n": st.draft_n if st is not None else 0,
                "draft_n_accepted": st.draft_n_accepted if st is not None else 0}

    @api.get("/props")
    async def props():
        m = state.engine.model
        default = {"id": 0, "id_task": -1, "n_ctx": state.n_ctx_slot,
                   "speculative": default_params()["speculative"], "is_processing": False,
                   "params": default_params(), "prompt": "",
                   "next_token": [{"has_next_token": True, "has_new_line": False,
                                   "n_remain": -1, "n_decoded": 0, "stopping_word": ""}]}
        return {"default_generation_settings": default, "total_slots": settings.n_parallel,
                "model_path": str(m.path), "chat_template": m.chat_template or "",
                "chat_template_caps": {}, "modalities": {"vision": False, "audio": False},
                "build_info": render.system_fingerprint(), "is_sleeping": False,
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
        r = PlainTextResponse(metrics_mod.render(state.scheduler, state.engine),
                              media_type="text/plain; version=0.0.4")
        # raw, to keep llama-server's spelling (Starlette lowercases names it is given)
        r.raw_headers.append((b"Process-Start-Time-Unix", str(state.created).encode()))
        return r

    # ------------------------------------------------------------ /completion (native)
    @api.post("/completion")
    @api.post("/completions")
    async def completion(request: Request):
        body = await parse_body(request, NativeCompletionRequest)
        batch = split_prompts(body.prompt)
        preps = [prepare(state, body, request, *tokenize_prompt(state, p), body.n_predict)
                 for p in batch]
        started = await start_run(state, request, preps, body.stream)
        if started is None:
            return Response(status_code=499)
        run, _firsts = started
        headers = spec_headers(run.jobs[0].speculative)
        if body.stream:
            return RunStreamingResponse(native_stream(state, run, preps, body), run,
                                        headers=headers)
        got = await run.collect()
        if got is None:
            return Response(status_code=499)
        outs = []
        for i, ((content, toks, ev), prep, job) in enumerate(zip(got, preps, run.jobs)):
            out = native_final_json(state, prep, job, i, content,
                                    toks if body.return_tokens else [], ev, False)
            outs.append(render.pick_fields(body.response_fields, out) if body.response_fields
                        else out)
        headers = spec_headers(run.jobs[0].speculative, got[0][2].response)
        return JSONResponse(outs if len(batch) > 1 else outs[0], headers=headers)

    # ------------------------------------------------------------ OpenAI endpoints
    async def oai_run(body: _OpenAI, request: Request, prompts: list[tuple[np.ndarray, str]],
                      chat: bool):
        n_predict = getattr(body, "max_completion_tokens", None)
        n_predict = body.max_tokens if n_predict is None else n_predict
        preps = [prepare(state, body, request, t, x, n_predict) for t, x in prompts]
        started = await start_run(state, request, preps, body.stream)
        if started is None:
            return Response(status_code=499)
        run, firsts = started
        base = render.oai_base(("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
                               int(time.time()), body.model or state.model_id)
        echo = getattr(body, "echo", False)
        if body.stream:
            return RunStreamingResponse(oai_stream(state, run, preps, body, base, chat), run,
                                        headers=spec_headers(run.jobs[0].speculative))
        got = await run.collect()
        if got is None:
            return Response(status_code=499)
        results = [ev.response for _c, _t, ev in got]
        choices = [render.oai_choice(chat, i, (p.prompt_text if echo else "") + content,
                                     ev.response.finish_reason)
                   for i, ((content, _t, ev), p) in enumerate(zip(got, preps))]
        out = {**base, "object": "chat.completion" if chat else "text_completion",
               "choices": choices, "usage": render.usage(results),
               "timings": results[-1].timings()}
        if settings.verbose:
            content, toks, ev = got[0]
            out["__verbose"] = native_final_json(state, preps[0], run.jobs[0], 0, content,
                                                 toks, ev, False)
        return JSONResponse(out, headers=spec_headers(run.jobs[0].speculative, results[0]))

    @api.post("/v1/completions")
    async def v1_completions(request: Request):
        body = await parse_body(request, CompletionRequest)
        prompts = [tokenize_prompt(state, p) for p in split_prompts(body.prompt)]
        return await oai_run(body, request, prompts, chat=False)

    @api.post("/v1/chat/completions")
    @api.post("/chat/completions")
    async def v1_chat(request: Request):
        body = await parse_body(request, ChatCompletionRequest)
        if body.tools:
            raise APIError("tools are not supported by this server", "not_supported_error")
        text = render_messages(state, body)
        tokens = state.engine.model.tokenize(text, add_special=True, parse_special=True)
        return await oai_run(body, request, [(tokens, text)], chat=True)

    @api.post("/apply-template")
    async def apply_template(request: Request):
        body = await parse_body(request, ChatCompletionRequest)
        return {"prompt": render_messages(state, body)}

    @api.post("/v1/chat/completions/input_tokens")
    @api.post("/chat/completions/input_tokens")
    async def chat_input_tokens(request: Request):
        body = await parse_body(request, ChatCompletionRequest)
        text = render_messages(state, body)
        n = len(state.engine.model.tokenize(text, add_special=True, parse_special=True))
        return {"input_tokens": n, "object": "response.input_tokens"}

    @api.post("/tokenize")
    async def tokenize(request: Request):
        body = await parse_body(request, TokenizeRequest)
        return {"tokens": tokenize_json(state, body)}

    @api.post("/detokenize")
    async def detokenize(request: Request):
        body = await parse_body(request, DetokenizeRequest)
        toks = _check_tokens(state, body.tokens)
        m = state.engine.model
        return {"content": b"".join(m.piece(t, special=True) for t in toks.tolist())
                .decode("utf-8", errors="replace")}

    app.include_router(public)
    app.include_router(api)
    return app
