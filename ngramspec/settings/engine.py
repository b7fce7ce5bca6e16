"""The settings an engine is loaded with (`EngineSettings`, its `LoadOptions`), and the one
builder from a command's flag values (`engine_from_flags`).

Invariant: `engine_from_flags` pops the values it uses from the command's dict (the
model, context and load flags of the flag table), so what is left is the command's own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .config import SpecConfig
from .flag import gpu_layers, load_mode, on_off
from .llama_values import kv_type_name


@dataclass(frozen=True)
class LoadOptions:
    """llama.cpp settings a user may set on the command line (-b, -ub, -fa, -kvu, -tb,
    -ngl, --load-mode, --no-repack); engine/runtime.context_params decides what of them
    is applied."""

    n_batch: int = 512
    n_ubatch: int | None = None
    flash_attn: str = "auto"  # on | off | auto
    kv_unified: bool | None = None
    threads_batch: int | None = None
    n_gpu_layers: int = 0
    load_mode: int = -1
    repack: bool = True  # exact mode: prompts on the repacked twin (ngramspec/llama/twin.py)
    swa_full: bool = False  # --swa-full (or --context-shift): full-size SWA cache
    cache_type_k: str = "f16"  # -ctk/-ctv: KV cache types (model.KV_TYPES)
    cache_type_v: str = "f16"
    # every decode of one fixed shape (llama/fixed_shape.py): None = where exactness needs
    # it (layers on a device); True also on the CPU (tests: the same code without a GPU)
    fixed_shape: bool | None = None


@dataclass(frozen=True)
class EngineSettings:
    """Everything engine/runtime.load_engine needs: the one object generate, serve, batch
    and bench build (`engine_from_flags`, through settings/typed.py or
    ServerSettings.engine_settings) and pass."""

    model: str | None = None  # None: the embedded model
    model_draft: str | None = None
    n_ctx: int = 4096
    threads: int | None = None  # None: every core
    spec: SpecConfig = field(default_factory=lambda: SpecConfig(types=()))
    n_seq: int = 1
    draft_p_min: float = 0.0
    batch_invariant: bool = True
    options: LoadOptions = field(default_factory=LoadOptions)
    verbose: bool = False


#: the flags of LoadOptions (llama.cpp's load and context settings)
_LOAD = ("batch_size", "ubatch_size", "flash_attn", "kv_unified", "threads_batch",
         "n_gpu_layers", "load_mode", "mmap", "mlock", "repack", "swa_full", "cache_type_k",
         "cache_type_v")


def _load_options(kw: dict[str, Any]) -> LoadOptions:
    """Pop -b, -ub, -fa, -kvu, -tb, -ngl, -lm/--[no-]mmap/--mlock, --[no-]repack,
    --swa-full, -ctk/-ctv into LoadOptions."""
    v = {d: kw.pop(d) for d in _LOAD}
    return LoadOptions(n_batch=v["batch_size"], n_ubatch=v["ubatch_size"],
                       flash_attn=on_off(v["flash_attn"]), kv_unified=v["kv_unified"],
                       threads_batch=v["threads_batch"], n_gpu_layers=gpu_layers(v["n_gpu_layers"]),
                       load_mode=load_mode(v["load_mode"], v["mmap"], v["mlock"]),
                       repack=v["repack"], swa_full=bool(v["swa_full"]),
                       cache_type_k=kv_type_name(v["cache_type_k"] or "f16"),
                       cache_type_v=kv_type_name(v["cache_type_v"] or "f16"))


def engine_from_flags(kw: dict[str, Any], n_seq: int, verbose: bool,
                      spec: SpecConfig) -> EngineSettings:
    """Pop a command's model and load flags (-m, -md, -c, -t, --draft-p-min,
    --no-batch-invariance, `_load_options`') into the one EngineSettings, with `spec`
    and `n_seq` slots."""
    return EngineSettings(
        model=kw.pop("model", None), model_draft=kw.pop("model_draft", None),
        n_ctx=kw.pop("ctx_size"), threads=kw.pop("threads", None), spec=spec,
        n_seq=n_seq, draft_p_min=kw.pop("draft_p_min", 0.0) or 0.0,
        batch_invariant=not kw.pop("no_batch_invariance", False),
        options=_load_options(kw), verbose=verbose)
