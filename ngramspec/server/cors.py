"""CORS as llama-server does it (server-http.cpp's pre-routing handler).

Every response gets `Access-Control-Allow-Origin` from --cors-origins (`default_origins`:
"*" unless tools/MCP servers are asked for, then "localhost"):
- "*" with --cors-credentials (the default): the request's Origin is echoed back
  (credentials are allowed, so "*" itself cannot be sent);
- "localhost": only an http(s) Origin whose host is localhost, 127.0.0.1 or ::1 is
  echoed; any other Origin gets no header at all;
- anything else (also "*" with --no-cors-credentials) is sent as is.
An OPTIONS request is a preflight: it is answered 200 at once, before the API key and
readiness checks (browsers send no Authorization header on it), with
`Access-Control-Allow-Credentials/-Methods/-Headers` (--cors-credentials,
--cors-methods, --cors-headers).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

log = logging.getLogger("ngramspec.server")

METHODS = "GET, POST, DELETE, OPTIONS"
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}


def origin_is_localhost(origin: str) -> bool:
    """Whether `origin` is an http(s) URL whose host is a loopback name or address."""
    try:
        parts = urlsplit(origin)
        host = parts.hostname
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and host in LOCAL_HOSTS


def default_origins(s) -> str:
    """--cors-origins as given; else, as llama-server, "localhost" when tools or MCP
    servers are asked for (--tools, --mcp-servers-config/-json, --agent), else "*"."""
    if s.cors_origins is not None:
        return s.cors_origins
    tools = s.tools or s.mcp_servers_config or s.mcp_servers_json or s.agent
    return "localhost" if tools else "*"


def allow_origin(origins: str, origin: str, credentials: bool = True) -> str | None:
    """The Access-Control-Allow-Origin value for a request from `origin`, or None."""
    if origins == "*" and credentials:
        return origin or None
    if origins == "localhost":
        if origin and origin_is_localhost(origin):
            return origin
        if origin:
            log.warning("(CORS) skip non-localhost origin: %s", origin)
        return None
    return origins


@dataclass(frozen=True)
class CORSPolicy:
    """The CORS flags of one server (ServerSettings' cors_* fields)."""

    origins: str = "*"
    methods: str = METHODS
    headers: str = "*"
    credentials: bool = True

    @classmethod
    def from_settings(cls, s) -> "CORSPolicy":
        return cls(default_origins(s), s.cors_methods, s.cors_headers, bool(s.cors_credentials))

    def preflight_headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"Access-Control-Allow-Credentials", b"true" if self.credentials else b"false"),
                (b"Access-Control-Allow-Methods", self.methods.encode("latin-1")),
                (b"Access-Control-Allow-Headers", self.headers.encode("latin-1"))]


class CORSMiddleware:
    def __init__(self, app, policy: CORSPolicy = CORSPolicy()):
        self.app, self.policy = app, policy

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        origin = headers.get(b"origin", b"").decode("latin-1")
        allowed = allow_origin(self.policy.origins, origin, self.policy.credentials)
        extra = [(b"Access-Control-Allow-Origin", allowed.encode("latin-1"))] if allowed else []
        if scope["method"] == "OPTIONS":
            extra += self.policy.preflight_headers()
            extra += [(b"content-type", b"text/html"), (b"content-length", b"0")]
            await send({"type": "http.response.start", "status": 200, "headers": extra})
            await send({"type": "http.response.body", "body": b""})
            return

        async def _send(message):
            if message["type"] == "http.response.start" and extra:
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, _send)
