"""A command's flag values turned into the typed objects it runs on, by one function,
`typed`: its SpecConfig, SamplingParams, EngineSettings (with its LoadOptions) and, for
`serve`, its ServerSettings, as a `Typed`.

Invariant: the values `typed` uses are popped from the command's dict, so what is left
is the command's own (its prompt, output and report flags); each group is built only
where the command has its flags (sampling: --temp; model and load: -c).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from . import flags
from .config import SPEC_OPTIONS, SpecConfig, spec_config_from_options, uses_draft_model
from .engine import EngineSettings, engine_from_flags
from .sampling import SamplingParams
from .sampling_flags import sampling_from_flags
from .server import ServerSettings


@dataclass(frozen=True)
class Typed:
    """A command's settings, typed: its speculation, its sampling (None where the command
    has no sampling flags), its EngineSettings (None without model flags) and, for
    `serve`, its ServerSettings (else None)."""

    spec: SpecConfig
    sampling: SamplingParams | None = None
    engine: EngineSettings | None = None
    server: ServerSettings | None = None


def typed(values: dict[str, Any], n_seq: int = 1, verbose: bool = False,
          need_draft: bool = True, serve: bool = False) -> Typed:
    """The one walk from a command's parsed flag values down to its typed settings
    (popped from `values`): SpecConfig from the speculation flags, SamplingParams from
    the sampling flags, EngineSettings from the model and load flags with that SpecConfig
    and `n_seq` slots; with `serve`, the ServerSettings of serve's model, request and
    server flags too, whose -np gives the slots. `need_draft`: a draft-model type without
    -md is an error that names the fix."""
    fields = flags.settings_values(values) if serve else {}
    spec = _spec(values, values.get("model_draft", fields.get("model_draft")), need_draft)
    sampling = sampling_from_flags(values) if "temp" in values else None
    if serve:
        server = ServerSettings(**fields, spec=spec,
                                **({} if sampling is None else {"sampling": sampling}))
        return Typed(spec, server.sampling, server.engine_settings(), server)
    engine = engine_from_flags(values, n_seq, verbose, spec) if "ctx_size" in values else None
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
