"""A command's flag values turned into the typed objects an engine is built from, by one
function, `typed`: SpecConfig, SamplingParams and the one EngineSettings (with its
LoadOptions), as a `Typed`.

Invariant: the values `typed` uses are popped from the command's dict, so what is left
is the command's own (its prompt, output and report flags); each group is built only
where the command has its flags (sampling: --temp; model and load: -c).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..settings import strict_json
from ..settings.config import SPEC_OPTIONS, SpecConfig, spec_config_from_options, uses_draft_model
from ..settings.flag import on_off, gpu_layers, load_mode
from ..settings.flags import sampling_fields
from ..settings.llama_values import kv_type_name

if TYPE_CHECKING:
    from .runtime import EngineSettings
    from ..settings.sampling import SamplingParams


@dataclass(frozen=True)
class Typed:
    """A command's settings, typed: its speculation, its sampling (None where the command
    has no sampling flags) and its EngineSettings (None without model flags)."""

    spec: SpecConfig
    sampling: "SamplingParams | None" = None
    engine: "EngineSettings | None" = None


def typed(values: dict[str, Any], n_seq: int = 1, verbose: bool = False,
          spec: SpecConfig | None = None, need_draft: bool = True,
          model_draft: str | None = None) -> Typed:
    """The one walk from a command's parsed flag values down to its typed settings
    (popped from `values`): SpecConfig from the speculation flags (or `spec`, one built
    already: a server's), SamplingParams from the sampling flags, EngineSettings from
    the model and load flags with that SpecConfig and `n_seq` slots. `need_draft`: a
    draft-model type without -md (`values`', else `model_draft`) is an error that names
    the fix."""
    model_draft = values.get("model_draft", model_draft)
    if spec is None:
        spec = _spec(values, model_draft, need_draft)
    sampling = _sampling(values) if "temp" in values else None
    engine = _engine(values, n_seq, verbose, spec) if "ctx_size" in values else None
    return Typed(spec, sampling, engine)


def _spec(kw: dict[str, Any], model_draft: str | None, need_draft: bool) -> SpecConfig:
    """Pop the speculation flags out of a command's values into one SpecConfig.

    A llama.cpp draft-model type (draft-simple, ...) without -md is an error that
    names the fix (`need_draft`)."""
    opts = {o.dest: kw.pop(o.dest) for o in SPEC_OPTIONS if o.dest in kw}
    mib = kw.pop("spec_pool_mib", None)
    pool = None
    if mib is not None:
        if mib < 1:
            raise ConfigError(f"--spec-pool-mib must be >= 1, got {mib}")
        pool = mib << 20
    spec_type = kw.pop("spec_type", None)
    if need_draft and model_draft is None and uses_draft_model(spec_type):
        raise ConfigError(f"--spec-type {spec_type} drafts with a draft model: add "
                          "-md/--model-draft FILE.gguf (or use an ngram-* type or auto)")
    return spec_config_from_options(spec_type=spec_type, pool_bytes=pool,
                                    policy=kw.pop("draft_policy", None), **opts)


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror}") from None


def _sampling(kw: dict[str, Any]):
    """Pop the sampling flags into SamplingParams (grammar from --grammar/-file, -j/-jf)."""
    from .sampling import schema_grammar
    from ..settings.sampling import SamplingParams, seed_or_random

    grammar, gfile = kw.pop("grammar", None), kw.pop("grammar_file", None)
    schema, sfile = kw.pop("json_schema", None), kw.pop("json_schema_file", None)
    if sum(x is not None for x in (grammar, gfile, schema, sfile)) > 1:
        raise ConfigError("use only one of --grammar, --grammar-file, --json-schema and "
                          "--json-schema-file")
    if gfile is not None:
        grammar = _read(gfile, "--grammar-file")
    if sfile is not None:
        schema = _read(sfile, "--json-schema-file")
    if schema is not None:
        parsed = strict_json.loads(schema, "--json-schema")
        grammar = schema_grammar(parsed if parsed else {"type": "object"})
    values = {field: kw.pop(dest) for dest, field in sampling_fields().items() if dest in kw}
    seed = values.get("seed")
    values["seed"] = seed_or_random(-1 if seed is None else seed)
    values["ignore_eos"] = bool(values.get("ignore_eos"))
    base = values.get("dry_base")
    if base is None or base < 1.0:  # below 1: the default, as llama.cpp
        values["dry_base"] = SamplingParams.dry_base
    return SamplingParams(grammar=grammar, **_samplers_from_values(kw),
                          **{k: v for k, v in values.items() if v is not None})


def _token_bias(value: str) -> tuple[int, float]:
    """llama.cpp's -l value TOKEN(+|-)BIAS: a token id, then a signed bias (inf allowed)."""
    m = re.fullmatch(r"\s*(\d+)\s*([+-]\s*(?:inf|[0-9.]+(?:e[+-]?\d+)?))\s*", value, re.I)
    if m is None:
        raise ConfigError(f"-l/--logit-bias takes TOKEN(+|-)BIAS, e.g. 15043+1 or 15043-inf; "
                          f"got {value!r}")
    return int(m.group(1)), float(m.group(2).replace(" ", ""))


def _samplers_from_values(kw: dict[str, Any]) -> dict[str, Any]:
    """Pop the sampling flags that are not a SamplingParams field as they are: the logit
    biases (-l), the DRY breakers (given ones replace the default; 'none': no breakers),
    the order (--samplers or --sampler-seq: settings/sampling.parse_order)."""
    from ..settings.sampling import DEFAULT_ORDER, parse_order

    out: dict[str, Any] = {"logit_bias": tuple(_token_bias(v) for v in kw.pop("logit_bias", ())
                                               or ())}
    breakers = kw.pop("dry_sequence_breaker", ())
    if breakers:
        out["dry_sequence_breakers"] = tuple(b for b in breakers if b != "none")
    names, seq = kw.pop("samplers", None), kw.pop("sampler_seq", None)
    if names is not None and seq is not None:
        raise ConfigError("use only one of --samplers and --sampler-seq")
    order = names if names is not None else seq
    out["samplers"] = DEFAULT_ORDER if order is None else parse_order(order)
    return {k: v for k, v in out.items() if v is not None}


#: the flags of runtime.LoadOptions (llama.cpp's load and context settings)
_LOAD = ("batch_size", "ubatch_size", "flash_attn", "kv_unified", "threads_batch",
         "n_gpu_layers", "load_mode", "mmap", "mlock", "repack", "swa_full", "cache_type_k",
         "cache_type_v")


def _load_options(kw: dict[str, Any]):
    """Pop -b, -ub, -fa, -kvu, -tb, -ngl, -lm/--[no-]mmap/--mlock, --[no-]repack,
    --swa-full, -ctk/-ctv into runtime.LoadOptions."""
    from .runtime import LoadOptions

    v = {d: kw.pop(d) for d in _LOAD}
    return LoadOptions(n_batch=v["batch_size"], n_ubatch=v["ubatch_size"],
                       flash_attn=on_off(v["flash_attn"]), kv_unified=v["kv_unified"],
                       threads_batch=v["threads_batch"], n_gpu_layers=gpu_layers(v["n_gpu_layers"]),
                       load_mode=load_mode(v["load_mode"], v["mmap"], v["mlock"]),
                       repack=v["repack"], swa_full=bool(v["swa_full"]),
                       cache_type_k=kv_type_name(v["cache_type_k"] or "f16"),
                       cache_type_v=kv_type_name(v["cache_type_v"] or "f16"))


def _engine(kw: dict[str, Any], n_seq: int, verbose: bool, spec: SpecConfig):
    """Pop a command's model and load flags (-m, -md, -c, -t, --draft-p-min,
    --no-batch-invariance, `_load_options`') into the one runtime.EngineSettings."""
    from .runtime import EngineSettings

    return EngineSettings(
        model=kw.pop("model", None), model_draft=kw.pop("model_draft", None),
        n_ctx=kw.pop("ctx_size"), threads=kw.pop("threads", None), spec=spec,
        n_seq=n_seq, draft_p_min=kw.pop("draft_p_min", 0.0) or 0.0,
        batch_invariant=not kw.pop("no_batch_invariance", False),
        options=_load_options(kw), verbose=verbose)
