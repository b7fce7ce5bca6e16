"""The FastAPI application: llama-server's endpoints on the ngramspec scheduler.

Request flow: validate the body and tokenize (prepare.py) -> submit one job per prompt
and wait until each has its slot (run.py; errors from prompt evaluation, e.g. a bad
grammar, become 4xx before any byte is sent) -> stream SSE or collect the response
(render.py shapes it). A disconnected client cancels its jobs; the scheduler frees
their slots at its next turn. Routes: routes_native.py (llama-server's own) and
routes_openai.py; they get the state through FastAPI dependencies (state.py).
"""
from __future__ import annotations

import threading
from contextlib import asynccontextmanager
from typing import Callable

from fastapi import Depends, FastAPI

from . import routes_native, routes_openai
from .cors import CORSMiddleware, CORSPolicy
from .cors_proxy import cors_proxy_router
from .errors import install_handlers
from .embeddings import embedding_router
from ..settings.server import ServerSettings
from .slot_actions import slot_actions_router
from .state import ServerState, ready_state, require_key


def create_app(settings: ServerSettings, engine_factory: Callable | None = None,
               on_fatal: Callable[[], None] | None = None, load_async: bool = True) -> FastAPI:
    """The ASGI app; the model loads in a background thread once the server runs
    (`engine_factory()`, when given, builds the engine instead: tests use it)."""
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
    # outermost: preflights skip the rest
    app.add_middleware(CORSMiddleware, policy=CORSPolicy.from_settings(settings))
    for module in (routes_native, routes_openai):
        app.include_router(module.public)
        app.include_router(module.router)
    app.include_router(embedding_router(state, settings, [Depends(require_key)]))
    app.include_router(slot_actions_router(state, [Depends(require_key), Depends(ready_state)]))
    app.include_router(cors_proxy_router(settings, [Depends(require_key)]))
    return app

