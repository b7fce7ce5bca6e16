"""Request fields of llama-server's other samplers -> SamplingParams fields, for server
requests and batch records alike (DRY, XTC, typical, top-n-sigma, mirostat, dynamic
temperature, min_keep and the order, `samplers`)."""
from __future__ import annotations

from typing import Any

from ..settings.sampling import parse_order
from .types import OtherSamplers

#: the numeric fields of OtherSamplers (each a SamplingParams field of the same name,
#: reported under it in generation_settings)
NUMBER_FIELDS = tuple(k for k in OtherSamplers.model_fields
                      if k not in ("dry_sequence_breakers", "samplers"))
#: those set as given; dry_base and dry_penalty_last_n are read as llama-server reads them
_SAME = tuple(k for k in NUMBER_FIELDS if k not in ("dry_base", "dry_penalty_last_n"))


def other_samplers(default, req: Any, n_ctx_slot: int) -> dict:
    """The SamplingParams fields of llama-server's other samplers for a request: each
    field the request sets, else the server's default (`default`, SamplingParams), read
    as llama-server reads them: dry_base below 1 is the default's, dry_penalty_last_n -1
    the slot's context, `samplers` names or a string of letters (`parse_order`)."""
    def pick(name: str):
        v = getattr(req, name)
        return getattr(default, name) if v is None else v

    out = {k: pick(k) for k in _SAME}
    base = pick("dry_base")
    out["dry_base"] = base if base >= 1.0 else default.dry_base
    last_n = pick("dry_penalty_last_n")
    out["dry_penalty_last_n"] = n_ctx_slot if last_n == -1 else last_n
    out["dry_sequence_breakers"] = tuple(pick("dry_sequence_breakers"))
    out["samplers"] = default.samplers if req.samplers is None else parse_order(req.samplers)
    return out
