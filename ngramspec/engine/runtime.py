"""Build an Engine from its settings (settings/engine.EngineSettings: model paths, sizes,
speculation)."""
from __future__ import annotations

import os
import threading
from typing import Callable

from ..llama import file_pages
from ..settings.config import SpecConfig
from ..settings.engine import EngineSettings, LoadOptions
from ..speculative.cost import Calibration, calibrate_context
from .engine import Engine
from ..errors import ConfigError
from ..settings.llama_values import MLOCK_MODES
from ..llama.context import TILED_PREFILL_MIN, ContextParams
from ..llama.fixed_shape import ROWS as FIXED_ROWS, FixedShapeContext
from ..llama.model import Model, check_model_file, default_model_path
from ..speculative.memory import available_bytes, plan_auto
from ..llama.omp import on_passing_thread
from ..speculative.policy import CostPolicy
from ..llama.twin import load_twin, open_context, repack_is_safe


def default_threads() -> int:
    return max(os.cpu_count() or 1, 1)


def context_params(n_ctx: int, n_seq: int, threads: int, opts: LoadOptions,
                   batch_invariant: bool, verbose: bool = False) -> tuple[ContextParams, list[str]]:
    """The context settings for `opts`, and one line per setting changed to keep
    exactness (docs/exactness.md, "Command-line flags and exactness").

    The device decides first (`device_policy`): layers on a device in exact mode give a
    fixed-shape context, whose batch sizes, KV layout and padding are the shape's own
    (the CPU's rules below and their notes do not apply there). Otherwise, batch-invariant:
    flash attention stays on; one KV stream per slot; -b and -ub are at least
    TILED_PREFILL_MIN (64) so prompts take the tiled path (rule T); -ub is at most -b
    (as llama.cpp clamps it). Otherwise every value is applied. Either way a quantized V
    cache with -fa off is refused (llama.cpp quantizes V only with flash attention)."""
    fa = {"on": True, "off": False, "auto": None}[opts.flash_attn]
    offload, note, fixed = device_policy(opts.n_gpu_layers, batch_invariant, verbose)
    notes = [note] if note else []
    fixed = batch_invariant and (fixed or bool(opts.fixed_shape))
    if (fa is False and (fixed or not batch_invariant)
            and opts.cache_type_v not in ("f32", "f16", "bf16")):
        raise ConfigError(f"-ctv {opts.cache_type_v} needs flash attention (llama.cpp quantizes "
                          "the V cache only with it): drop -fa off or use -ctv f16")
    if fixed:
        return _fixed_shape_params(n_ctx, n_seq, threads, opts, offload), notes
    n_batch, n_ubatch = opts.n_batch, min(opts.n_ubatch or opts.n_batch, opts.n_batch)
    kvu = opts.kv_unified
    if batch_invariant:
        if fa is False:
            notes.append("-fa off would break exactness (batch invariance needs flash "
                         "attention): flash attention stays on; --no-batch-invariance allows off")
        fa = True
        if kvu and n_seq > 1:
            notes.append("--kv-unified would break exactness (slots' KV cells would "
                         "interleave): one KV stream per slot; --no-batch-invariance allows it")
        kvu = None
        if n_ubatch < TILED_PREFILL_MIN:
            notes.append(f"-b/-ub below {TILED_PREFILL_MIN} would break exactness (prompts "
                         f"need {TILED_PREFILL_MIN}-row chunks): using {TILED_PREFILL_MIN}")
            n_batch, n_ubatch = max(n_batch, TILED_PREFILL_MIN), TILED_PREFILL_MIN
    return ContextParams(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_seq_max=n_seq,
                         n_threads=threads, n_threads_batch=opts.threads_batch, flash_attn=fa,
                         kv_unified=kvu, batch_invariant=batch_invariant,
                         swa_full=True if opts.swa_full or not batch_invariant else None,
                         type_k=opts.cache_type_k, type_v=opts.cache_type_v,
                         op_offload=offload), notes


def device_policy(n_gpu_layers: int, batch_invariant: bool,
                  verbose: bool = False) -> tuple[bool, str | None, bool]:
    """(llama.cpp's op_offload, a note or None, fixed-shape decodes) for a build whose
    devices are `kernels.guard.devices()` (docs/exactness.md, "Builds with a GPU
    backend"). In exact mode with a device besides the CPU: -ngl 0 keeps every node on
    the CPU (no op offload) and the CPU's rules hold; -ngl > 0 (or all) decodes every
    step in one fixed shape (llama/fixed_shape.py), on if its start-up check passes
    (`open_fixed_shape`). --no-batch-invariance runs as llama.cpp would."""
    from ..llama.kernels import guard
    from ..llama.backend import _quiet_logs

    _quiet_logs(verbose)  # llama.cpp initialized (its logs quiet unless verbose): devices known
    other = [f"{n} ({t})" for n, t in guard.devices() if t != "CPU"]
    if not other or not batch_invariant:
        return True, None, False
    if n_gpu_layers != 0:
        return True, (f"-ngl {n_gpu_layers if n_gpu_layers > 0 else 'all'} on "
                      f"{', '.join(other)}: every decode has one fixed shape "
                      f"({FIXED_ROWS} rows a slot), as exactness on a device needs; "
                      "ngramspec's kernels are off"), True
    return False, (f"llama.cpp has {', '.join(other)}: with -ngl 0 every node stays on the CPU "
                   "(no op offload), as exactness needs; ngramspec's kernels are off"), False


def _fixed_shape_params(n_ctx: int, n_seq: int, threads: int, opts: LoadOptions,
                        offload: bool) -> ContextParams:
    """A fixed-shape context's settings: the user's -fa (llama.cpp decides with auto),
    KV types and threads, llama.cpp's op offload as `device_policy` says; the rest is
    the shape's own (fixed_shape.py)."""
    fa = {"on": True, "off": False, "auto": None}[opts.flash_attn]
    return ContextParams(n_ctx=n_ctx, n_batch=FIXED_ROWS, n_ubatch=FIXED_ROWS, n_seq_max=n_seq,
                         n_threads=threads, n_threads_batch=opts.threads_batch, flash_attn=fa,
                         batch_invariant=True, swa_full=True, type_k=opts.cache_type_k,
                         type_v=opts.cache_type_v, op_offload=offload, fixed_rows=FIXED_ROWS)


def open_fixed_shape(model: Model, params: ContextParams) -> FixedShapeContext:
    """The fixed-shape context, after its start-up check (`self_check`); ConfigError with
    the check's reason if the device's rows differ between one-row and verify decodes."""
    try:
        ctx = FixedShapeContext(model, params, params.fixed_rows)
    except BaseException:
        model.close()
        raise
    check = ctx.self_check()
    if not check.passed:
        ctx.close()
        model.close()
        raise ConfigError(f"-ngl {model.n_gpu_layers if model.n_gpu_layers >= 0 else 'all'}: "
                          f"the device is not exact in fixed-shape decodes ({check.reason}); use "
                          "-ngl 0, or --no-batch-invariance to run on the device with output "
                          "that may differ from spec-off")
    return ctx


def _load_models(model_path: str | None, opts: LoadOptions, batch_invariant: bool,
                 verbose: bool, fixed: bool = False) -> tuple[Model, Model | None]:
    """The generation model and, in exact mode where the CPU allows, its prefill twin
    (repacked weights, twin.py). The twin loads on a thread of its own while the main
    model loads (llama.cpp releases the GIL; most of a load is vocabulary and tensor
    set-up on one core): ~0.4 s less start-up on 2 cores. A failure of either frees
    the other and is raised."""
    path = check_model_file(model_path or default_model_path())
    load = {"verbose": verbose, "n_gpu_layers": opts.n_gpu_layers, "load_mode": opts.load_mode}
    repack = opts.repack and repack_is_safe() and not fixed  # the twin is CPU code
    box: dict = {}

    def twin_target() -> None:
        try:
            box["twin"] = load_twin(path, **load)
        except BaseException as e:  # raised in the caller
            box["error"] = e

    loader = threading.Thread(target=twin_target, name="ngramspec-twin", daemon=True)
    if repack and batch_invariant:
        loader.start()
    try:
        model = Model(path, use_extra_bufts=repack and not batch_invariant, **load)
    except BaseException:
        if loader.ident is not None:
            loader.join()
        if box.get("twin") is not None:
            box["twin"].close()
        raise
    if loader.ident is not None:
        loader.join()
    if "error" in box:
        model.close()
        raise box["error"]
    twin = box.get("twin")
    if twin is not None and opts.load_mode not in MLOCK_MODES:  # the twin's copy, else all
        file_pages.drop(path, twin.file_span)
    return model, twin


@on_passing_thread
def load_engine(settings: EngineSettings, notify: Callable[[str], None] = lambda line: None
                ) -> Engine:
    """Load the target (and optional draft) model and return a ready Engine.

    With spec type auto, free memory decides whether the draft model is loaded
    and whether speculation runs at all; `notify` gets the one-line reason, and
    one line per llama.cpp setting kept for exactness (`context_params`).

    Runs on a thread of its own that has ended when it returns (`omp.on_passing_thread`):
    the decodes of loading leave no OpenMP pool on the caller's thread to slow the
    decodes of whichever thread runs the engine afterwards.
    """
    s = settings
    plan = plan_auto(s.spec, s.model_draft, available_bytes())
    if plan.note:
        notify(plan.note)
    spec, draft_path = plan.spec, (s.model_draft if plan.use_draft_model else None)
    if s.n_ctx < 16:
        raise ConfigError(f"-c/--ctx-size must be >= 16, got {s.n_ctx}")
    if s.threads is not None and s.threads < 1:
        raise ConfigError(f"-t/--threads must be >= 1, got {s.threads}")
    if s.n_seq < 1:
        raise ConfigError(f"-np/--parallel must be >= 1, got {s.n_seq}")
    threads = s.threads or default_threads()
    cparams, notes = context_params(s.n_ctx, s.n_seq, threads, s.options, s.batch_invariant,
                                    s.verbose)
    for line in notes:
        notify(line)
    model, twin = _load_models(s.model, s.options, s.batch_invariant, s.verbose,
                               fixed=bool(cparams.fixed_rows))
    ctx = (open_fixed_shape(model, cparams) if cparams.fixed_rows
           else open_context(model, cparams, twin))
    dd = None
    if draft_path is not None:
        from ..speculative.draft_model import DraftModelDrafter

        dd = DraftModelDrafter.load(draft_path, model, n_ctx=s.n_ctx, n_seq=s.n_seq,
                                    threads=threads, p_min=s.draft_p_min, verbose=s.verbose,
                                    n_max=spec.draft_max if spec.draft_max is not None else 16)
    cal = calibrate_context(model.path, ctx) if spec.policy == "cost" else None
    return engine_on(model, ctx, spec, dd, cal)


def engine_on(model: Model, ctx, spec: SpecConfig, draft_drafter=None,
              calibration: Calibration | None = None, keep_refined: bool = True) -> Engine:
    """An engine on a loaded model and context: the one rule for its draft policy
    (`load_engine` and every engine `bench` builds). Where the policy is cost, drafts are
    priced with the calibrated curve (`keep_refined`: the curve the run refines is saved
    for the next run), also on an engine with no spec type, where only a request's own
    prediction drafts (within its record's credit, own_budget.py); with the fixed policy,
    or without a curve, llama.cpp's fixed policy."""
    policy = None
    if spec.policy == "cost" and calibration is not None:
        policy = CostPolicy(calibration.cost, compare_all=spec.auto,
                            save=calibration.save if keep_refined else None)
    return Engine(model, ctx, spec, draft_drafter=draft_drafter, policy=policy,
                  calibration=calibration)
