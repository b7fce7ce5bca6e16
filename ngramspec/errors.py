"""User-facing errors.

Every error a user can cause (bad flag, bad token, bad request body) is an
`NgramSpecError`. Its message names the fix; the CLI prints it without a
traceback and the server maps it to an OpenAI-shaped 4xx body.
"""
from __future__ import annotations


class NgramSpecError(Exception):
    """Base class for errors caused by the caller's input. `status` is the HTTP code."""

    status = 400
    type = "invalid_request_error"


class ConfigError(NgramSpecError, ValueError):
    """An invalid speculation or generation setting (flag, body field, library argument)."""


class TokenError(NgramSpecError, ValueError):
    """Token input that is not a sequence of non-negative integers."""


class GrammarError(ConfigError):
    """The grammar (or JSON schema) admits no token where generation must go on: it has
    no valid continuation at all, or the text so far has led it into a dead end."""


class Unavailable(NgramSpecError):
    """The engine cannot take the work now (shutting down, every slot and the queue full)."""

    status = 503
    type = "unavailable_error"


def validation_message(errors: list[dict]) -> str:
    """One line for a request body's validation errors (pydantic's `errors()` list, the
    first three): the field's path and what is wrong with it."""
    parts = []
    for e in errors[:3]:
        loc = [str(x) for x in e.get("loc", ()) if x not in ("body",)]
        where = ".".join(loc)
        if e.get("type") == "json_invalid":
            ctx = e.get("ctx") or {}
            parts.append(f"malformed JSON body: {ctx.get('error', e.get('msg', ''))}")
        elif e.get("type") == "missing":
            parts.append(f"missing required field '{where}'")
        else:
            parts.append(f"{where}: {e.get('msg', 'invalid value')}" if where else e.get("msg", ""))
    return "; ".join(parts) or "invalid request"


def error_fields(exc: BaseException) -> dict | None:
    """The llama-server error of a caller's mistake, transport-free: {"message", "type",
    "status", "extra"}; None for anything else (a bug: the caller reports a server
    error). The one mapping of domain errors: the server turns it into a response
    (`server/errors.py`), `batch` into an error record."""
    from pydantic import ValidationError

    if isinstance(exc, NgramSpecError):
        extra = {}
        if exc.type == "exceed_context_size_error":
            extra = {"n_prompt_tokens": getattr(exc, "n_prompt_tokens", None),
                     "n_ctx": getattr(exc, "n_ctx", None)}
        return {"message": str(exc), "type": exc.type, "status": exc.status, "extra": extra}
    if isinstance(exc, ValidationError):
        return {"message": validation_message(list(exc.errors())),
                "type": "invalid_request_error", "status": 400, "extra": {}}
    if isinstance(exc, UnicodeDecodeError):
        return {"message": "request body is not UTF-8", "type": "invalid_request_error",
                "status": 400, "extra": {}}
    if isinstance(exc, UnicodeEncodeError):  # text that is not Unicode (a lone surrogate)
        return {"message": f"the request holds text that is not valid Unicode: {exc.reason}",
                "type": "invalid_request_error", "status": 400, "extra": {}}
    return None
