"""Grammars from JSON: llama.cpp's generic JSON grammar and a JSON schema's GBNF, both by
llama-cpp-python's converter (`llama_cpp.llama_grammar`, Python code: no llama.cpp call
is made here; importing it loads llama.cpp's library, which every entry point has
loaded first anyway).

Invariant: `schema_grammar` returns a grammar only for a schema some value satisfies
and the grammar can hold (schema_check.py); otherwise ConfigError naming what is wrong.
"""
from __future__ import annotations

import json

from ..errors import ConfigError
from . import strict_json
from .schema_check import check_schema


def json_grammar() -> str:
    """llama.cpp's generic JSON grammar (GBNF)."""
    from llama_cpp.llama_grammar import JSON_GBNF

    return JSON_GBNF


def schema_grammar(schema: dict | str) -> str:
    """GBNF for a JSON schema, or ConfigError naming what is wrong (unparsable, no value
    satisfies it, or beyond the grammar's limits: schema_check.py)."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    if isinstance(schema, str):
        parsed = strict_json.loads(schema, "JSON schema")  # depth checked there
    else:
        parsed = schema
        strict_json.check_depth(parsed, "JSON schema")
    check_schema(parsed)
    try:
        return json_schema_to_gbnf(json.dumps(parsed))
    except Exception as e:  # the converter raises assorted errors on bad schemas
        raise ConfigError(f"invalid JSON schema: {e}") from None
