"""What a sequence is started with: the engine-level request (`Engine.start`).

The jobs layer's `Job` (jobs/scheduler.py) is a Request with what the scheduler adds
(the event sink, its slot), so a job is started as it is, and the
fields are written once.

Invariant: nothing here is evaluated or validated; `Engine.start` checks the prompt and
the context's room, SamplingParams its own ranges.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..settings.config import SpecConfig
from ..settings.sampling import SamplingParams


@dataclass(kw_only=True)
class Request:
    """One sequence's prompt, sampler and generation options.

    `spec` overrides the engine's SpecConfig for this sequence; speculative=False or an
    empty type list turns drafting off for it. `prediction` (token ids of the output the
    client expects) drafts first, whatever the spec types. `context_shift` = (n_keep,
    n_discard) as a llama-server request gives them (n_keep -1: the whole prompt): the
    sequence shifts instead of stopping when its context is full, and n_predict < 0
    means until the end of generation."""

    prompt: Sequence[int] | np.ndarray
    sampling: SamplingParams
    n_predict: int = 256
    speculative: bool = True
    spec: SpecConfig | None = None
    cache_prompt: bool = True
    prediction: Sequence[int] | np.ndarray | None = None
    context_shift: tuple[int, int] | None = None
    # the strings its text stops at (cut by the caller: engine/generate.py Generation); the
    # engine only keeps a folded run of steps short past one (fold.STOP_STEPS)
    stop: Sequence[str] = ()


def output_budget(want: int, room: int, shift: bool = False) -> tuple[int, bool]:
    """(n_predict, truncate_at_length) of a job: the tokens asked for (`want`; < 0: until
    the end) within the `room` the slot leaves after the prompt, and whether stopping
    there means the slot is full ("length" with truncated set). With a context shift
    (`shift`) the slot never fills: `want` as given. The one rule of `Engine.start`,
    and of the server's requests and batch's records (jobs/build.py)."""
    if shift:
        return want, False
    return (room if want < 0 else min(want, room)), (want < 0 or want > room)
