"""One flag of the table (`Flag`) and the parsers of flag values (llama.cpp's spellings).

Invariant: a parser raises ConfigError naming the flag and what it takes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import strict_json
from .llama_values import LOAD_MODES
from ..errors import ConfigError

ALL = frozenset({"generate", "serve", "bench", "batch"})
GEN = frozenset({"generate", "serve", "batch"})  # commands that sample text for requests
SERVE = frozenset({"serve"})


@dataclass(frozen=True)
class Flag:
    """One flag. `names`: every spelling (first long name is canonical); `neg`: the
    spellings that turn an on/off flag off; `switch`: takes no value; `field`: the
    ServerSettings field, or a sampling flag's SamplingParams field (default: dest);
    `parse`: str -> value, applied by click and by ServerSettings; `defaults`: per-command
    default overrides; `note`: the warning printed when the flag is given and
    `warn(value)` holds."""

    names: tuple[str, ...]
    dest: str
    target: str
    type: Any = str
    default: Any = None
    help: str = ""
    commands: frozenset = SERVE
    neg: tuple[str, ...] = ()
    switch: bool = False
    field: str | None = None
    parse: Callable[[Any], Any] | None = None
    defaults: tuple[tuple[str, Any], ...] = ()
    note: str | None = None
    warn: Callable[[Any], bool] = lambda value: True
    envvar: tuple[str, ...] = ()
    multiple: bool = False
    join: bool = True  # a repeated flag reads as one comma list (False: a tuple of values)
    metavar: str | None = None
    nargs: int = 1

    @property
    def name(self) -> str:
        return next((n for n in self.names if n.startswith("--")), self.names[0])

    @property
    def settings_field(self) -> str:
        return self.field or self.dest

    def default_for(self, command: str) -> Any:
        return dict(self.defaults).get(command, self.default)


# ------------------------------------------------------------------ value parsers


def csv(value: Any) -> tuple[str, ...]:
    """'a, b,,c' -> ('a', 'b', 'c') (llama.cpp's comma lists)."""
    if value is None:
        return ()
    if isinstance(value, (tuple, list)):
        return tuple(value)
    return tuple(p.strip() for p in str(value).split(",") if p.strip())


def csv_set(value: Any) -> tuple[str, ...]:
    """A comma list as llama.cpp keeps it in a std::set: unique, sorted ('b,a,b' -> ('a', 'b'))."""
    return tuple(sorted(set(csv(value))))


def gpu_layers(value: Any) -> int:
    """-ngl N | auto | all -> llama_model_params.n_gpu_layers (negative: all)."""
    if isinstance(value, int):
        return value
    v = str(value).strip().lower()
    if v in ("auto", "all"):
        return -1
    try:
        return int(v)
    except ValueError:
        raise ConfigError(f"-ngl/--n-gpu-layers takes a number, 'auto' or 'all', got {value!r}") from None


def json_object(value: Any) -> dict:
    if value is None or isinstance(value, dict):
        return value or {}
    obj = strict_json.loads(value, "--chat-template-kwargs")
    if not isinstance(obj, dict):
        raise ConfigError("--chat-template-kwargs must be a JSON object")
    return obj


def directory(value: Any) -> str:
    """An existing directory (llama.cpp's --slot-save-path check), as given."""
    if not Path(str(value)).is_dir():
        raise ConfigError(f"not a directory: {value}")
    return str(value)


def load_mode(mode: str, mmap: bool | None, mlock: bool) -> int:
    """llama_model_params.load_mode from -lm, or from the older --[no-]mmap/--mlock."""
    if mode != "auto" or (mmap is None and not mlock):
        return LOAD_MODES[mode]
    if mmap is False:
        return LOAD_MODES["mlock" if mlock else "none"]
    return LOAD_MODES["mmap+mlock" if mlock else "mmap"]


def on_off(value: Any) -> str:
    v = str(value).strip().lower()
    for canon, spellings in (("on", ("on", "enabled", "true", "1", "yes")),
                             ("off", ("off", "disabled", "false", "0", "no")),
                             ("auto", ("auto", "-1"))):
        if v in spellings:
            return canon
    raise ConfigError(f"-fa/--flash-attn takes on, off or auto, got {value!r}")


