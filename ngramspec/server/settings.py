"""Server settings, built from the one flag table (`ngramspec.settings.flags.FLAGS`).

`ServerSettings` has one field per model/request/server flag of `ngramspec serve`
(same default, named by `Flag.settings_field`), plus the composite `spec`
(SpecConfig) and `sampling` (SamplingParams) built from the spec and sampling
flags. `create_app` reads it; request defaults (sampling, n_predict,
cache_prompt, speculation) come from the same flags, as in llama-server.

Values a flag parses (comma lists such as --host, --alias, --api-key; -ngl) are
parsed here too, so `ServerSettings(host="127.0.0.1,::1")` means what the command
line means.

Context (`-c`): ONE llama.cpp context with `--parallel` sequences. The `-c` tokens
are shared by all slots and each slot may use `n_ctx // parallel` of them
(llama-server's per-slot context). A prompt that does not fit a slot is refused
with `exceed_context_size_error`; generation stops with finish_reason "length"
(`truncated: true`) when the slot is full.
"""
from __future__ import annotations

from dataclasses import field, make_dataclass
from pathlib import Path
from typing import Any

from ..settings import flags
from ..engine import flag_values
from ..settings.config import SpecConfig
from ..errors import ConfigError
from ..engine.sampling import SamplingParams


def _default_sampling() -> SamplingParams:
    return flag_values.sampling_from_values(flags.defaults("serve", ("sampling",)))


def _post_init(self) -> None:
    for name, parse in flags.parsers().items():
        v = getattr(self, name)
        if v is not None or parse in (flags.csv, flags.csv_set):  # an unset comma list is ()
            object.__setattr__(self, name, parse(v))
    if self.n_parallel < 1:
        raise ConfigError(f"-np/--parallel must be >= 1, got {self.n_parallel}")
    if self.queue_size < 0:
        raise ConfigError(f"--queue-size must be >= 0, got {self.queue_size}")
    if not 0 <= self.port <= 65535:
        raise ConfigError(f"--port must be between 0 and 65535, got {self.port}")
    if not self.host:
        raise ConfigError("--host needs at least one address")
    if self.port == 0 and len(self.host) > 1:
        raise ConfigError("--port 0 cannot be used with several --host addresses")
    if self.n_ctx // self.n_parallel < 8:
        raise ConfigError(f"-c/--ctx-size {self.n_ctx} leaves fewer than 8 tokens per slot "
                          f"for {self.n_parallel} slots; raise -c or lower -np")
    for what, v in (("-b/--batch-size", self.n_batch), ("-ub/--ubatch-size", self.n_ubatch)):
        if v < 1:
            raise ConfigError(f"{what} must be >= 1, got {v}")
    object.__setattr__(self, "api_keys", _api_keys(self.api_key, self.api_key_file))


def _api_keys(keys: tuple[str, ...] | str | None, path: str | None) -> tuple[str, ...]:
    """--api-key (comma list) plus --api-key-file's lines ('#' lines are comments)."""
    out = list(flags.csv(keys))
    if path is not None:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise ConfigError(f"cannot read --api-key-file {path}: {e.strerror}") from None
        out += [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    return tuple(out)


def _n_ctx_slot(self) -> int:
    """Tokens (prompt + output) one slot may hold."""
    return self.n_ctx // self.n_parallel


def _model_id(self, loaded_name: str) -> str:
    """The model id clients see: the first --alias in sort order (llama-server keeps
    them in a std::set), else the model file's name."""
    return self.alias[0] if self.alias else loaded_name


ServerSettings = make_dataclass(
    "ServerSettings",
    flags.settings_fields() + [
        ("spec", SpecConfig, field(default_factory=SpecConfig)),
        ("sampling", SamplingParams, field(default_factory=_default_sampling)),
        ("api_keys", tuple, field(default=(), init=False)),
    ],
    frozen=True,
    namespace={"__post_init__": _post_init, "n_ctx_slot": property(_n_ctx_slot),
               "model_id": _model_id, "__module__": __name__, "__doc__": __doc__},
)


def from_flags(values: dict[str, Any]) -> "ServerSettings":
    """ServerSettings from `ngramspec serve`'s parsed flags (popped from `values`)."""
    model_draft = values.get("model_draft")
    sampling = flag_values.sampling_from_values(values)
    spec = flag_values.spec_from_values(values, model_draft)
    return ServerSettings(**flags.settings_values(values), spec=spec, sampling=sampling)


def engine_settings(s: "ServerSettings"):
    """The runtime.EngineSettings of `s`: its model and load flags' values through
    `flag_values.engine_settings` (the same table as every command), its SpecConfig and
    -np slots."""
    values = {f.dest: getattr(s, f.settings_field) for f in flags.for_command("serve", ("model",))}
    values["swa_full"] = values["swa_full"] or s.context_shift  # a window-size cache cannot shift
    return flag_values.engine_settings(values, n_seq=s.n_parallel, verbose=s.verbose, spec=s.spec)
