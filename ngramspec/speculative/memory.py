"""Memory-aware start for `--spec-type auto` (what on-device runtimes do).

- enough free memory and a draft model given: n-gram drafters + the draft model;
- low memory: n-gram drafters only (the draft model is not loaded);
- very low memory: speculation off.
Each downgrade comes with one line saying why.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

from ..settings.config import SpecConfig

VERY_LOW = 256 << 20  # below this (after the pool), speculation is not worth the risk


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo, or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


@dataclass(frozen=True)
class AutoPlan:
    spec: SpecConfig
    use_draft_model: bool
    note: str | None


def plan_auto(spec: SpecConfig, draft_path: str | None, available: int | None) -> AutoPlan:
    """Decide what `auto` may use given free memory (bytes; None = unknown, no limit)."""
    wants_draft = draft_path is not None
    if not spec.auto or available is None:
        return AutoPlan(spec, wants_draft, None)
    mib = available >> 20
    if available < spec.pool_bytes + VERY_LOW:
        return AutoPlan(replace(spec, types=()), False,
                        f"auto: speculation off, only {mib} MiB of memory free")
    if wants_draft:
        need = 2 * os.path.getsize(draft_path) + (1 << 30)  # weights + KV cache + headroom
        if available < need:
            return AutoPlan(spec, False, f"auto: draft model not loaded ({mib} MiB free, about "
                                         f"{need >> 20} MiB needed); n-gram drafting only")
    return AutoPlan(spec, wants_draft, None)
