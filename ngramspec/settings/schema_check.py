"""Refuse a JSON schema that no value satisfies, or that llama.cpp's grammar cannot hold.

The schema -> GBNF converter ignores bounds it cannot express, so an impossible schema
(`minLength` > `maxLength`) used to give a grammar that produced text the schema does
not accept. Invariants:
- every count bound (`minLength`, `maxItems`, ...) is a non-negative integer of at most
  MAX_REPEAT (llama.cpp's grammar repeats an element at most that many times);
- each min/max pair, and `minimum`/`maximum` (exclusive forms included), admits a value;
- `enum: []` admits nothing;
- the walk is iterative and sees every sub-schema (properties, items, anyOf, $defs, ...).
Violations raise ConfigError naming the JSON path.
"""
from __future__ import annotations

from typing import Any

from ..errors import ConfigError

MAX_REPEAT = 2000  # llama.cpp's grammar parser: repetitions above this are refused
COUNT_PAIRS = (("minLength", "maxLength"), ("minItems", "maxItems"),
               ("minProperties", "maxProperties"), ("minContains", "maxContains"))


def _count(node: dict, key: str, where: str) -> int | None:
    v = node.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or v < 0:
        raise ConfigError(f"invalid JSON schema: {where}.{key} must be a non-negative integer, "
                          f"got {v!r}")
    if v > MAX_REPEAT:
        raise ConfigError(f"invalid JSON schema: {where}.{key} is {v:g}; llama.cpp's grammar "
                          f"repeats an element at most {MAX_REPEAT} times")
    return int(v)


def _number(node: dict, key: str, where: str) -> float | None:
    v = node.get(key)
    if v is None or isinstance(v, bool):  # draft-4's boolean exclusiveMinimum: see below
        return None
    if not isinstance(v, (int, float)):
        raise ConfigError(f"invalid JSON schema: {where}.{key} must be a number, got {v!r}")
    return float(v)


def _check_node(node: dict, where: str) -> None:
    for lo_key, hi_key in COUNT_PAIRS:
        lo, hi = _count(node, lo_key, where), _count(node, hi_key, where)
        if lo is not None and hi is not None and lo > hi:
            raise ConfigError(f"invalid JSON schema: no value satisfies {where}: {lo_key} {lo} "
                              f"> {hi_key} {hi}")
    lo, hi = _number(node, "minimum", where), _number(node, "maximum", where)
    xlo, xhi = _number(node, "exclusiveMinimum", where), _number(node, "exclusiveMaximum", where)
    if node.get("exclusiveMinimum") is True:
        xlo, lo = lo, None
    if node.get("exclusiveMaximum") is True:
        xhi, hi = hi, None
    bad = ((lo is not None and hi is not None and lo > hi)
           or any(a is not None and b is not None and a >= b
                  for a, b in ((xlo, hi), (lo, xhi), (xlo, xhi))))
    if bad:
        raise ConfigError(f"invalid JSON schema: no number satisfies {where}'s bounds "
                          f"(minimum/maximum, exclusive forms included)")
    if node.get("enum") == []:
        raise ConfigError(f"invalid JSON schema: {where}.enum is empty: no value satisfies it")


#: keywords whose value maps names to sub-schemas (the map itself is not a schema)
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
#: keywords whose value is data, not schemas
DATA_KEYS = ("enum", "const", "examples", "default", "required")


def check_schema(schema: Any) -> None:
    """ConfigError if `schema` (decoded JSON) is unsatisfiable or beyond the grammar's
    limits (see the module docstring)."""
    stack: list[tuple[Any, str, bool]] = [(schema, "schema", False)]  # (node, path, is a map)
    while stack:
        node, where, is_map = stack.pop()
        if isinstance(node, dict):
            if not is_map:
                _check_node(node, where)
            stack.extend((v, f"{where}.{k}", not is_map and k in SCHEMA_MAPS)
                         for k, v in node.items()
                         if isinstance(v, (dict, list)) and (is_map or k not in DATA_KEYS))
        elif isinstance(node, list):
            stack.extend((v, f"{where}[{i}]", False) for i, v in enumerate(node)
                         if isinstance(v, (dict, list)))
