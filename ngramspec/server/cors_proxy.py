"""llama-server's CORS proxy: GET/POST /cors-proxy?url=URL (its Web UI reaches MCP servers
through it).

    GET|POST /cors-proxy?url=http(s)://host[:port]/path   -> the target's status, headers, body

Enabled only by --ui-mcp-proxy (or --agent); otherwise 403 `feature_disabled`. Like
every API route it needs the API key when one is set.

Invariants (what makes it safe to turn on):
- Only headers the client names explicitly reach the target: a request header
  `x-llama-server-proxy-header-NAME: V` is sent as `NAME: V`. Nothing else of the
  client's request is forwarded (no Authorization, Cookie, X-Api-Key, Proxy-*), and
  Host, Content-Length, Transfer-Encoding and Accept-Encoding are always ours.
- The target is an http(s) URL with a host and no password in it (else 400). It is
  fetched directly (no environment proxy), following redirects, with a 600 s timeout.
- The answer carries the target's status, content type and headers, less those the
  server sets itself (Server, Date, Connection, Keep-Alive, Content-Length,
  Transfer-Encoding) and the target's Access-Control-* (this server's CORS applies).
  A target that cannot be reached gives 500 "proxy error: ...".
"""
from __future__ import annotations

import logging
import urllib.error
import urllib.request
from typing import Iterator
from urllib.parse import urlsplit, urlunsplit

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, StreamingResponse

from .errors import APIError

log = logging.getLogger("ngramspec.server")

PREFIX = "x-llama-server-proxy-header-"
TIMEOUT_S = 600
CHUNK = 64 * 1024
_NOT_FORWARDED = {"host", "content-length", "transfer-encoding", "accept-encoding", "connection"}
_NOT_RETURNED = {"server", "date", "connection", "keep-alive", "content-length",
                 "transfer-encoding", "content-type"}
#: no ProxyHandler: the http(s)_proxy environment is not used, as in llama-server
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def target_url(url: str | None) -> str:
    """The URL to fetch, without user info; APIError (400) if it may not be proxied."""
    if not url:
        raise APIError("missing required query parameter 'url'")
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as e:
        raise APIError(f"invalid target URL: {e}") from None
    if parts.scheme not in ("http", "https"):
        raise APIError(f"unsupported URL scheme in target URL: {parts.scheme}")
    if not host:
        raise APIError("invalid target URL: missing host")
    if parts.password:
        raise APIError("authentication in target URL is not supported")
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    return urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))


def forwarded_headers(headers) -> dict[str, str]:
    """The headers sent to the target: only the x-llama-server-proxy-header-* ones,
    with the prefix removed (see the module invariants)."""
    out = {}
    for key, value in headers.items():
        name = key[len(PREFIX):] if key.lower().startswith(PREFIX) else ""
        if name and name.lower() not in _NOT_FORWARDED:
            out[name] = value
    return out


def _open(req: urllib.request.Request):
    """The target's response (an HTTPError is one too: its status is forwarded)."""
    try:
        return _OPENER.open(req, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as e:
        return e


def _chunks(resp) -> Iterator[bytes]:
    try:
        while chunk := resp.read(CHUNK):
            yield chunk
    finally:
        resp.close()


async def proxy(request: Request, method: str):
    url = target_url(request.query_params.get("url"))
    body = await request.body() if method == "POST" else None
    req = urllib.request.Request(url, data=body, headers=forwarded_headers(request.headers),
                                 method=method)
    log.info("proxying %s request to %s", method, url)
    try:
        resp = await run_in_threadpool(_open, req)
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        log.warning("cors-proxy: %s %s failed: %s", method, url, reason)
        return PlainTextResponse(f"proxy error: {reason}", status_code=500)
    headers = {k: v for k, v in resp.headers.items()
               if k.lower() not in _NOT_RETURNED and not k.lower().startswith("access-control-")}
    return StreamingResponse(_chunks(resp), status_code=resp.status, headers=headers,
                             media_type=resp.headers.get("content-type"))


def enabled(settings) -> bool:
    """--ui-mcp-proxy as given; else on with --agent (as llama-server's --agent)."""
    return bool(settings.agent) if settings.ui_mcp_proxy is None else bool(settings.ui_mcp_proxy)


def cors_proxy_router(settings, dependencies: list) -> APIRouter:
    """GET and POST /cors-proxy: the proxy with --ui-mcp-proxy, else 403."""
    router = APIRouter(dependencies=dependencies)

    @router.api_route("/cors-proxy", methods=["GET", "POST"])
    async def cors_proxy(request: Request):
        if not enabled(settings):
            raise APIError("this feature is disabled", "feature_disabled", status=403)
        return await proxy(request, request.method)

    return router
