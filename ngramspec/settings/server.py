"""`ngramspec serve`'s settings, built from the one flag table (`ngramspec.settings.flags.FLAGS`).

`ServerSettings` has one field per model/request/server flag of `ngramspec serve`
(same default, named by `Flag.settings_field`), plus the composite `spec`
(SpecConfig) and `sampling` (SamplingParams) built from the spec and sampling
flags (settings/typed.py builds it from serve's flag values). The server
(server/app.py `create_app`) reads it; request defaults (sampling, n_predict,
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

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from . import flags
from .config import SpecConfig
from .engine import EngineSettings, engine_from_flags
from .sampling import SamplingParams
from .sampling_flags import sampling_from_flags


def _default_sampling() -> SamplingParams:
    return sampling_from_flags(flags.defaults("serve", ("sampling",)))


@dataclass(frozen=True)
class ServerSettings:
    """`ngramspec serve`'s settings: one field per model/request/server flag of the one
    flag table, with its default (`flags.settings_fields()`, which
    tests/test_architecture.py holds this class to), plus the SpecConfig and the
    SamplingParams the spec and sampling flags build. Comma lists and other values a flag
    parses are parsed here too (`flags.parsers()`); ranges are checked once, here."""

    model: str | None = None
    model_draft: str | None = None
    n_ctx: int | None = 4096
    threads: int | None = None
    threads_batch: int | None = None
    n_batch: int | None = 512
    n_ubatch: int | None = 512
    flash_attn: Any = "auto"
    kv_unified: bool | None = None
    n_gpu_layers: Any = "0"
    load_mode: str | None = "auto"
    mmap: bool | None = None
    mlock: bool | None = False
    repack: bool | None = True
    swa_full: bool | None = False
    cache_type_k: Any = "f16"
    cache_type_v: Any = "f16"
    no_batch_invariance: bool | None = False
    draft_p_min: float | None = 0.0
    n_predict: int | None = -1
    verbose: bool | None = False
    log_disable: bool | None = False
    host: Any = "127.0.0.1"
    port: int | None = 8080
    reuse_port: bool | None = False
    n_parallel: int | None = 1
    queue_size: int | None = 64
    api_key: str | None = None
    api_key_file: str | None = None
    timeout: int | None = 3600
    metrics: bool | None = False
    slots: bool | None = True
    props: bool | None = False
    alias: Any = None
    tags: Any = None
    chat_template: str | None = None
    chat_template_file: str | None = None
    chat_template_kwargs: Any = None
    jinja: bool | None = True
    cache_prompt: bool | None = True
    cache_reuse: int | None = 0
    context_shift: bool | None = False
    keep: int | None = 0
    slot_save_path: Any = None
    embedding: bool | None = False
    pooling: str | None = None
    embd_normalize: int | None = 2
    webui: bool | None = None
    cors_origins: str | None = None
    cors_methods: str | None = "GET, POST, DELETE, OPTIONS"
    cors_headers: str | None = "*"
    cors_credentials: bool | None = True
    ui_mcp_proxy: bool | None = None
    tools: Any = None
    mcp_servers_config: str | None = None
    mcp_servers_json: str | None = None
    agent: bool | None = False
    spec: SpecConfig = field(default_factory=SpecConfig)
    sampling: SamplingParams = field(default_factory=_default_sampling)
    api_keys: tuple = field(default=(), init=False)

    def __post_init__(self) -> None:
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

    @property
    def n_ctx_slot(self) -> int:
        """Tokens (prompt + output) one slot may hold."""
        return self.n_ctx // self.n_parallel

    def model_id(self, loaded_name: str) -> str:
        """The model id clients see: the first --alias in sort order (llama-server keeps
        them in a std::set), else the model file's name."""
        return self.alias[0] if self.alias else loaded_name

    def engine_settings(self) -> EngineSettings:
        """The EngineSettings of these settings: their model and load flags' values through
        `engine_from_flags` (the same table as every command), their SpecConfig and -np
        slots."""
        values = {f.dest: getattr(self, f.settings_field)
                  for f in flags.for_command("serve", ("model",))}
        # a window-size cache cannot shift: --context-shift keeps the full-size one
        values["swa_full"] = values["swa_full"] or self.context_shift
        return engine_from_flags(values, self.n_parallel, bool(self.verbose), self.spec)


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
