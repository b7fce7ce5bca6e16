"""The values of llama.cpp's load and KV-cache flags, by name (-lm/--load-mode, -ctk/-ctv).

Invariant: a name not in these tables is a ConfigError that lists the valid ones.
"""
from __future__ import annotations

from ..errors import ConfigError

#: llama.cpp's llama_load_mode values (-lm/--load-mode), by name
LOAD_MODES = {"auto": -1, "none": 0, "mmap": 1, "mlock": 2, "mmap+mlock": 3, "dio": 4}
#: the load modes that lock the model's pages in memory
MLOCK_MODES = frozenset({LOAD_MODES["mlock"], LOAD_MODES["mmap+mlock"]})


#: the KV cache types llama.cpp's -ctk/-ctv take (common/arg.cpp), by name
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def kv_type_name(value) -> str:
    """A KV cache type as given (-ctk/-ctv, any case): its name in KV_TYPES, or
    ConfigError."""
    name = str(value).strip().lower()
    if name not in KV_TYPES:
        raise ConfigError(f"unknown KV cache type {value!r}; valid values: {', '.join(KV_TYPES)}")
    return name
