"""Server settings, defined once (llama-cpp-python's `server/settings.py` style).

`ServerSettings` is what `ngramspec serve` builds from its flags and what
`create_app` reads; request defaults (sampling, n_predict, speculation) come
from the same flags, as in llama-server.

Context (`-c`): ONE llama.cpp context with `--parallel` sequences in a unified
KV cache. The `-c` tokens are shared by all slots and each slot may use
`n_ctx // parallel` of them (llama-server's per-slot context). A prompt that
does not fit a slot is refused with `exceed_context_size_error`; generation
stops with finish_reason "length" (`truncated: true`) when the slot is full.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..config import SpecConfig
from ..errors import ConfigError
from ..sampling import SamplingParams


@dataclass(frozen=True)
class ServerSettings:
    # model
    model: str | None = None  # None: the embedded Gemma 3 270M
    model_draft: str | None = None
    n_ctx: int = 4096  # shared by all slots (see module docstring)
    threads: int | None = None
    draft_p_min: float = 0.0
    # speculation defaults for every request (a request may override or disable it)
    spec: SpecConfig = field(default_factory=SpecConfig)
    # request defaults
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.8))
    n_predict: int = -1  # -1: until end of generation or the slot's context is full
    # server
    host: str = "127.0.0.1"
    port: int = 8080
    n_parallel: int = 1  # slots = llama.cpp sequences in one context
    queue_size: int = 64  # requests waiting for a slot; beyond that 503
    api_key: str | None = None
    metrics: bool = False
    verbose: bool = False

    def __post_init__(self) -> None:
        if self.n_parallel < 1:
            raise ConfigError(f"-np/--parallel must be >= 1, got {self.n_parallel}")
        if self.queue_size < 0:
            raise ConfigError(f"--queue-size must be >= 0, got {self.queue_size}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be between 0 and 65535, got {self.port}")
        if self.n_ctx // self.n_parallel < 8:
            raise ConfigError(f"-c/--ctx-size {self.n_ctx} leaves fewer than 8 tokens per slot "
                              f"for {self.n_parallel} slots; raise -c or lower -np")

    @property
    def n_ctx_slot(self) -> int:
        """Tokens (prompt + output) one slot may hold."""
        return self.n_ctx // self.n_parallel
