"""Build an Engine from user-level settings (model paths, sizes, speculation)."""
from __future__ import annotations

import os
from typing import Callable

from .config import SpecConfig
from .engine import Engine
from .errors import ConfigError
from .model import Context, ContextParams, Model
from .memory import available_bytes, plan_auto
from .policy import CostPolicy


def default_threads() -> int:
    return max(os.cpu_count() or 1, 1)


def load_engine(model_path: str | None, draft_path: str | None, n_ctx: int, threads: int | None,
                spec: SpecConfig, n_seq: int = 1, verbose: bool = False,
                draft_p_min: float = 0.0, n_batch: int = 512,
                notify: Callable[[str], None] = lambda line: None,
                batch_invariant: bool = True) -> Engine:
    """Load the target (and optional draft) model and return a ready Engine.

    With spec type auto, free memory decides whether the draft model is loaded
    and whether speculation runs at all; `notify` gets the one-line reason.
    """
    plan = plan_auto(spec, draft_path, available_bytes())
    if plan.note:
        notify(plan.note)
    spec, draft_path = plan.spec, (draft_path if plan.use_draft_model else None)
    if n_ctx < 16:
        raise ConfigError(f"-c/--ctx-size must be >= 16, got {n_ctx}")
    if threads is not None and threads < 1:
        raise ConfigError(f"-t/--threads must be >= 1, got {threads}")
    if n_seq < 1:
        raise ConfigError(f"-np/--parallel must be >= 1, got {n_seq}")
    threads = threads or default_threads()
    model = Model(model_path, verbose=verbose, use_extra_bufts=not batch_invariant)
    ctx = Context(model, ContextParams(n_ctx=n_ctx, n_batch=n_batch, n_seq_max=n_seq,
                                       n_threads=threads, batch_invariant=batch_invariant))
    dd = None
    if draft_path is not None:
        from .draft_model import DraftModelDrafter

        dd = DraftModelDrafter.load(draft_path, model, n_ctx=n_ctx, n_seq=n_seq, threads=threads,
                                    n_max=spec.draft_max if spec.draft_max is not None else 16,
                                    p_min=draft_p_min, verbose=verbose)
    engine = Engine(model, ctx, spec, draft_drafter=dd)
    if spec.enabled and spec.policy == "cost":
        engine.policy = CostPolicy(engine.calibrate(), compare_all=spec.auto)
    return engine
