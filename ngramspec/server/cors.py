"""CORS as llama-server does it (server-http.cpp's pre-routing handler).

Every response gets `Access-Control-Allow-Origin`: with the default origins "*" the
request's Origin is echoed back (credentials are allowed, so "*" itself cannot be
sent); with "localhost" only a localhost origin is echoed; any other value is sent as
is. An OPTIONS request is a preflight: it is answered 200 at once, before the API key
and readiness checks (browsers send no Authorization header on it), with
`Access-Control-Allow-Credentials/-Methods/-Headers`.
"""
from __future__ import annotations

from urllib.parse import urlsplit

METHODS = "GET, POST, DELETE, OPTIONS"
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}


def origin_is_localhost(origin: str) -> bool:
    try:
        host = urlsplit(origin).hostname
    except ValueError:
        return False
    return host in LOCAL_HOSTS


def allow_origin(origins: str, origin: str) -> str | None:
    """The Access-Control-Allow-Origin value for a request from `origin`, or None."""
    if origins == "*":
        return origin
    if origins == "localhost":
        return origin if origin and origin_is_localhost(origin) else None
    return origins


class CORSMiddleware:
    def __init__(self, app, origins: str = "*"):
        self.app, self.origins = app, origins

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        origin = headers.get(b"origin", b"").decode("latin-1")
        allowed = allow_origin(self.origins, origin)
        extra = [(b"Access-Control-Allow-Origin", allowed.encode("latin-1"))] if allowed else []
        if scope["method"] == "OPTIONS":
            extra += [(b"Access-Control-Allow-Credentials", b"true"),
                      (b"Access-Control-Allow-Methods", METHODS.encode()),
                      (b"Access-Control-Allow-Headers", b"*"),
                      (b"content-type", b"text/html"), (b"content-length", b"0")]
            await send({"type": "http.response.start", "status": 200, "headers": extra})
            await send({"type": "http.response.body", "body": b""})
            return

        async def _send(message):
            if message["type"] == "http.response.start" and extra:
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, _send)
