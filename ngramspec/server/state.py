"""The server's state and the FastAPI dependencies that hand it to the routes.

`ServerState` is created by `create_app` and stored on `app.state.ngramspec`; the model
loads in a background thread (`load`), so every route that needs the engine depends on
`ready_state`, which answers 503 "Loading model" until it is loaded.
"""
from __future__ import annotations

import hmac
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from fastapi import Request

from ..speculative.stats import calibration_line
from .errors import APIError, loading_error
from ..jobs.scheduler import Scheduler
from ..settings.server import ServerSettings

log = logging.getLogger("ngramspec.server")


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
        """--alias's first name in sort order, else the model file's name."""
        return self.settings.model_id(self.engine.model.path.name if self.engine else "loading")

    def load(self, engine_factory: Callable | None = None) -> None:
        """Load the model and start the scheduler (runs in a background thread)."""
        s = self.settings
        try:
            delay = float(os.environ.get("NGRAMSPEC_SERVER_LOAD_DELAY", "0") or 0)
            if delay > 0:  # test hook: a visible loading phase
                time.sleep(delay)
            if engine_factory is None:
                from ..engine.runtime import load_engine

                engine = load_engine(s.engine_settings(), notify=log.warning)
            else:
                engine = engine_factory()
            self.n_ctx_slot = engine.ctx.n_ctx // s.n_parallel
            sched = Scheduler(engine, s.n_parallel, s.queue_size, self.n_ctx_slot)
            sched.start()
            self.engine, self.scheduler = engine, sched
            self.ready = True
            if hasattr(engine.ctx, "kernel_line"):  # a test's engine may have a stand-in context
                log.warning("ngramspec: %s", engine.ctx.kernels.line())
            cal = getattr(engine, "calibration", None)  # None: no cost policy (or a test's engine)
            log.warning("ngramspec: model %s loaded; %d slots of %d tokens; speculation: %s%s",
                        engine.model.path.name, s.n_parallel, self.n_ctx_slot,
                        ",".join(s.spec.types) or "none",
                        f"; {calibration_line(cal)}" if cal is not None else "")
        except BaseException as e:  # reported by `serve`, which then exits non-zero
            self.load_error = e
            log.error("ngramspec: loading failed: %s", e)
            if self.on_fatal is not None:
                self.on_fatal()


def get_state(request: Request) -> ServerState:
    return request.app.state.ngramspec


def ready_state(request: Request) -> ServerState:
    """The state of a server whose model is loaded (else 503, or 500 if loading failed)."""
    state = get_state(request)
    if state.load_error is not None:
        raise APIError(f"the model failed to load: {state.load_error}", "server_error")
    if not state.ready:
        raise loading_error()
    return state


def require_key(request: Request) -> None:
    """--api-key: 'Authorization: Bearer KEY' or 'X-Api-Key: KEY' (else 401)."""
    keys = get_state(request).settings.api_keys
    if not keys:
        return
    auth = request.headers.get("authorization", "")
    given = auth[7:].strip() if auth[:7].lower() == "bearer " else request.headers.get("x-api-key", "")
    if not any(hmac.compare_digest(given.encode(), k.encode()) for k in keys):
        raise APIError("Invalid API Key", "authentication_error")
