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
