"""`/embedding` and `/v1/embeddings` (`ngramspec serve --embedding`), as llama-server.

Invariants:
- Embeddings come from a llama.cpp context of their own on the served model
  (`embeddings=True`, `--pooling` or the model's pooling type), created at the
  first request. The generation context, its slots and its exactness are untouched.
- One input is one llama_decode of the whole input (at most a slot's context), run
  in a worker thread under a lock: the embedding context is never used by two
  threads at once.
- Without --embedding both endpoints answer 501 not_supported_error; pooling
  'none' (one vector per token) is refused on the OpenAI endpoint with 400, and
  the native endpoint returns per-token vectors unnormalised, as llama-server does.
"""
from __future__ import annotations

import asyncio
import base64
import threading
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ..errors import ConfigError
from .errors import APIError, loading_error

POOLING = {None: -1, "none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}


def normalize(v: np.ndarray, mode: int) -> np.ndarray:
    """llama.cpp's embedding normalisation: -1 none, 0 max-abs scaled to the int16
    range, 1 taxicab, 2 euclidean, p > 2 p-norm; a zero vector stays zero."""
    x = v.astype(np.float64)
    if mode == -1:
        total = 1.0
    elif mode == 0:
        total = float(np.max(np.abs(x))) / 32760.0 if x.size else 0.0
    elif mode == 2:
        total = float(np.sqrt(np.sum(x * x)))
    else:
        total = float(np.sum(np.abs(x) ** mode) ** (1.0 / mode))
    return (x * (1.0 / total if total > 0 else 0.0)).astype(np.float32)


class Embedder:
    """An embeddings context on `model` (see module invariants)."""

    def __init__(self, model, n_ctx: int, threads: int, pooling: str | None):
        from ..llama.model import ModelError
        from ..llama.backend import _llama

        lc = _llama()
        if pooling == "rank":
            raise ConfigError("--pooling rank is for reranking, which is not supported")
        cp = lc.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx
        cp.n_seq_max = 1
        cp.n_threads = cp.n_threads_batch = threads
        cp.embeddings = True
        cp.pooling_type = POOLING[pooling]
        cp.no_perf = True
        self.ptr = lc.llama_init_from_model(model.ptr, cp)
        if not self.ptr:
            raise ModelError(f"llama.cpp could not create an embeddings context for {model.path}")
        self.model, self.n_ctx = model, n_ctx
        self.n_embd = lc.llama_model_n_embd(model.ptr)
        self.pooling = lc.llama_pooling_type(self.ptr)  # the resolved type (model default)
        self.batch = lc.llama_batch_init(n_ctx, 0, 1)
        self.lock = threading.Lock()

    @property
    def pooled(self) -> bool:
        return self.pooling != 0

    def embed(self, tokens: np.ndarray, norm: int) -> list[list[float]]:
        """[pooled vector] (normalised with `norm`), or one raw vector per token."""
        from ..llama.backend import _llama

        lc = _llama()
        n = len(tokens)
        if n > self.n_ctx:
            raise APIError(f"input is too large to process: {n} tokens, the embeddings "
                           f"context holds {self.n_ctx}", "exceed_context_size_error")
        with self.lock:
            lc.llama_memory_clear(lc.llama_get_memory(self.ptr), True)
            b = self.batch
            for i, t in enumerate(tokens):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = int(t), i, 1, True
                b.seq_id[i][0] = 0
            b.n_tokens = n
            rc = lc.llama_decode(self.ptr, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed with code {rc} (embeddings, {n} tokens)")
            if self.pooled:
                row = np.ctypeslib.as_array(lc.llama_get_embeddings_seq(self.ptr, 0),
                                            shape=(self.n_embd,))
                return [normalize(row, norm).tolist()]
            return [np.ctypeslib.as_array(lc.llama_get_embeddings_ith(self.ptr, i),
                                          shape=(self.n_embd,)).tolist() for i in range(n)]


def _inputs(state, prompt: Any) -> list[np.ndarray]:
    """A string, token ids, or a list of either -> token arrays (one per input)."""
    from .prepare import tokenize_prompt

    if isinstance(prompt, list) and prompt and not all(isinstance(p, int) for p in prompt):
        items = prompt
    else:
        items = [prompt]
    if not items:
        raise APIError('"input" must not be empty', "invalid_request_error")
    return [tokenize_prompt(state, p)[0] for p in items]


def embedding_router(state, settings, dependencies: list) -> APIRouter:
    """The two endpoints, reading the app's ServerState (`state`)."""
    router = APIRouter(dependencies=dependencies)
    holder: dict[str, Embedder] = {}
    make_lock = threading.Lock()

    def embedder() -> Embedder:
        with make_lock:
            if "e" not in holder:
                holder["e"] = Embedder(state.engine.model, state.n_ctx_slot,
                                       state.engine.ctx.params.n_threads, settings.pooling)
            return holder["e"]

    async def run(request: Request, oai: bool):
        if not settings.embedding:
            raise APIError("This server does not support embeddings. Start it with "
                           "`--embeddings`", "not_supported_error")
        data = await _body(request)
        prompt = data.get("input") if "input" in data else data.get("content")
        if prompt is None:
            raise APIError('"input" or "content" must be provided', "invalid_request_error")
        oai = oai and "input" in data
        fmt = data.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise APIError("encoding_format must be 'float' or 'base64'", "invalid_request_error")
        norm = data.get("embd_normalize", settings.embd_normalize)
        if not state.ready:
            raise loading_error()
        emb = await asyncio.to_thread(embedder)
        if oai and not emb.pooled:
            raise APIError("Pooling type 'none' is not OAI compatible. Please use a different "
                           "pooling type", "invalid_request_error")
        inputs = _inputs(state, prompt)
        vecs = [await asyncio.to_thread(emb.embed, t, int(norm)) for t in inputs]
        if not oai:
            return JSONResponse([{"index": i, "embedding": v} for i, v in enumerate(vecs)])
        n = sum(len(t) for t in inputs)
        data_out = [_oai_item(i, v[0], fmt) for i, v in enumerate(vecs)]
        return JSONResponse({"model": data.get("model") or state.model_id, "object": "list",
                             "usage": {"prompt_tokens": n, "total_tokens": n}, "data": data_out})

    @router.post("/embedding")
    @router.post("/embeddings")
    async def native(request: Request):
        return await run(request, oai=False)

    @router.post("/v1/embeddings")
    async def openai(request: Request):
        return await run(request, oai=True)

    return router


def _oai_item(i: int, vec: list[float], fmt: str) -> dict:
    if fmt == "base64":
        raw = np.asarray(vec, dtype="<f4").tobytes()
        return {"embedding": base64.b64encode(raw).decode(), "index": i, "object": "embedding",
                "encoding_format": "base64"}
    return {"embedding": vec, "index": i, "object": "embedding"}


async def _body(request: Request) -> dict:
    from .prepare import read_json

    return await read_json(request)
