"""Strict JSON for everything a client hands us: server bodies, batch records, CLI values.

Invariants:
- `NaN`, `Infinity`, `-Infinity` and numbers too large for a double (`1e400`) are refused:
  they are not JSON (RFC 8259), llama-server's parser refuses them, and a value that
  reached the sampler or a response as a non-finite float could not be answered.
- A document nested deeper than MAX_DEPTH arrays/objects is refused before any
  recursive code (validation, the schema converter, the chat template) walks it:
  the parser's own RecursionError and the depth check both become the same error.
- Every refusal is a ConfigError, so the server answers 400, the CLI prints one line
  and a batch job writes an error record.
"""
from __future__ import annotations

import json
import math
from typing import Any

from ..errors import ConfigError

#: arrays/objects inside one another; a JSON schema of 50 nested objects fits
MAX_DEPTH = 100


def _finite(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"the number {text} does not fit a double")
    return v


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value (only finite numbers are)")


def loads(text: str | bytes, what: str = "JSON") -> Any:
    """Parse `text` strictly (see the module docstring); ConfigError names `what`."""
    try:
        value = json.loads(text, parse_float=_finite, parse_constant=_constant)
    except RecursionError:
        raise ConfigError(f"malformed {what}: nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"malformed {what}: {e}") from None
    check_depth(value, what)
    return value


def depth(value: Any) -> int:
    """Nesting depth of arrays/objects in a decoded value (0 for a scalar); iterative,
    so any depth is measured without recursion."""
    best, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        elif not isinstance(v, (list, tuple)):
            continue
        best = max(best, d)
        if d <= MAX_DEPTH:  # deeper than the limit is refused anyway: stop measuring
            stack.extend((x, d + 1) for x in v if isinstance(x, (dict, list, tuple)))
    return best


def check_depth(value: Any, what: str = "JSON") -> None:
    """ConfigError if `value` nests arrays/objects deeper than MAX_DEPTH."""
    if depth(value) > MAX_DEPTH:
        raise ConfigError(f"malformed {what}: nested deeper than {MAX_DEPTH} levels")
