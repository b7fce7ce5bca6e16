"""A command's sampling flags turned into SamplingParams (`sampling_from_flags`).

Invariant: the values it uses are popped from the command's dict (the flag table's
sampling flags: `flags.sampling_fields`, the grammar and schema flags, -l, the DRY
breakers and the sampler order), so what is left is the command's own.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from . import strict_json
from .flags import sampling_fields
from .grammar import schema_grammar
from .sampling import DEFAULT_ORDER, SamplingParams, parse_order, seed_or_random


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror}") from None


def sampling_from_flags(kw: dict[str, Any]) -> SamplingParams:
    """Pop the sampling flags into SamplingParams (grammar from --grammar/-file, -j/-jf)."""
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
