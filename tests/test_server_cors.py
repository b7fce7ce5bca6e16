"""CORS flags (--cors-origins/-methods/-headers/-credentials, the localhost default with
--tools/--mcp-servers-*/--agent) and the /cors-proxy endpoint, in-process without a model."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from click.testing import CliRunner

from asgi_client import call
from ngramspec.server.app import create_app
from ngramspec.settings.server import ServerSettings

PREFLIGHT = {"Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "Authorization"}


def preflight(settings: ServerSettings, origin: str) -> httpx.Response:
    r = call(create_app(settings), "OPTIONS", "/completions",
             headers={"Origin": origin, **PREFLIGHT})
    assert r.status_code == 200
    return r


@pytest.mark.parametrize("origin", ["http://localhost", "http://localhost:8080",
                                    "http://127.0.0.1", "https://127.0.0.1:3000",
                                    "http://[::1]", "http://[::1]:3000"])
def test_localhost_origins_are_echoed(origin):
    r = preflight(ServerSettings(cors_origins="localhost"), origin)
    assert r.headers["access-control-allow-origin"] == origin


@pytest.mark.parametrize("origin", ["http://web.mydomain.fr", "http://evil.com",
                                    "http://notlocalhost", "http://localhost.evil.com",
                                    "ftp://localhost", "localhost"])
def test_other_origins_get_no_allow_origin(origin):
    r = preflight(ServerSettings(cors_origins="localhost"), origin)
    assert "access-control-allow-origin" not in r.headers
    # a non-preflight request is served, without the header either
    r = call(create_app(ServerSettings(cors_origins="localhost")), "GET", "/health",
             headers={"Origin": origin})
    assert "access-control-allow-origin" not in r.headers


@pytest.mark.parametrize("flags,want", [
    ({}, "*"),
    ({"tools": "all"}, "localhost"),
    ({"mcp_servers_config": "mcp.json"}, "localhost"),
    ({"mcp_servers_json": "{}"}, "localhost"),
    ({"agent": True}, "localhost"),
    ({"tools": "all", "cors_origins": "*"}, "*"),  # an explicit value wins
    ({"tools": "all", "cors_origins": "https://app.example"}, "https://app.example"),
])
def test_default_origins_follow_tools(flags, want):
    from ngramspec.server.cors import default_origins

    assert default_origins(ServerSettings(**flags)) == want


def test_tools_default_rejects_remote_origins_end_to_end():
    s = ServerSettings(tools="all")
    assert preflight(s, "http://localhost:8080").headers["access-control-allow-origin"] == \
        "http://localhost:8080"
    assert "access-control-allow-origin" not in preflight(s, "http://evil.com").headers


def test_fixed_origin_methods_headers_credentials():
    s = ServerSettings(cors_origins="https://app.example", cors_methods="GET, POST",
                       cors_headers="Authorization, Content-Type", cors_credentials=False)
    r = preflight(s, "http://other.example")
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    assert r.headers["access-control-allow-methods"] == "GET, POST"
    assert r.headers["access-control-allow-headers"] == "Authorization, Content-Type"
    assert r.headers["access-control-allow-credentials"] == "false"
    # '*' without credentials is sent as is, not echoed
    r = preflight(ServerSettings(cors_credentials=False), "http://x.example")
    assert r.headers["access-control-allow-origin"] == "*"


def test_command_line_reaches_the_settings(monkeypatch):
    """The flags as llama-server spells them, parsed by `serve` into ServerSettings."""
    from ngramspec.server import command
    from ngramspec.server.cors import default_origins
    from ngramspec.server.cors_proxy import enabled

    seen = {}
    monkeypatch.setattr(command, "run_server", lambda settings, verbose: seen.update(s=settings))
    r = CliRunner().invoke(command.serve, ["--tools", "all", "--no-cors-credentials",
                                           "--cors-methods", "GET", "--webui-mcp-proxy"])
    assert r.exit_code == 0, r.output
    s = seen["s"]
    assert (default_origins(s), s.cors_credentials, s.cors_methods, enabled(s)) == \
        ("localhost", False, "GET", True)
    assert "--tools: there are no built-in tools here" in r.output
    r = CliRunner().invoke(command.serve, ["--agent", "--cors-origins", "*"])
    assert r.exit_code == 0, r.output
    assert (default_origins(seen["s"]), enabled(seen["s"])) == ("*", True)
    r = CliRunner().invoke(command.serve, ["--agent", "--no-ui-mcp-proxy"])
    assert r.exit_code == 0 and enabled(seen["s"]) is False


# ------------------------------------------------------------------ /cors-proxy


@pytest.fixture
def target():
    """A local HTTP server that records the headers and body of what it gets."""
    class Handler(BaseHTTPRequestHandler):
        def _answer(self, body: bytes):
            self.server.seen.append((self.command, self.path, dict(self.headers), body))
            self.send_response(201 if self.path.startswith("/created") else 200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Access-Control-Allow-Origin", "*")
            self.send_header("X-Target", "yes")
            self.end_headers()
            self.wfile.write(b'{"ok": true}')

        def do_GET(self):
            self._answer(b"")

        def do_POST(self):
            self._answer(self.rfile.read(int(self.headers.get("Content-Length", 0))))

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.seen = []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def test_proxy_is_403_unless_enabled(target):
    url = f"/cors-proxy?url=http://127.0.0.1:{target.server_port}/x"
    r = call(create_app(ServerSettings()), "GET", url)
    assert r.status_code == 403 and r.json()["error"]["type"] == "feature_disabled"
    assert target.seen == []


def test_proxy_forwards_only_explicit_headers(target):
    app = create_app(ServerSettings(ui_mcp_proxy=True, api_key="k"))
    url = f"/cors-proxy?url=http://127.0.0.1:{target.server_port}/capture?a=1"
    assert call(app, "GET", url).status_code == 401  # the API key applies
    r = call(app, "GET", url, headers={
        "Authorization": "Bearer k", "Proxy-Authorization": "Basic secret", "X-Api-Key": "k",
        "Cookie": "session=secret", "Origin": "http://localhost:5173",
        "x-llama-server-proxy-header-accept": "application/json",
        "x-llama-server-proxy-header-authorization": "Bearer explicit",
        "x-llama-server-proxy-header-host": "elsewhere.example"})
    assert r.status_code == 200 and r.json() == {"ok": True}
    assert r.headers["x-target"] == "yes" and r.headers["content-type"] == "application/json"
    # this server's CORS, not the target's
    assert r.headers["access-control-allow-origin"] == "http://localhost:5173"
    method, path, headers, _ = target.seen[-1]
    got = {k.lower(): v for k, v in headers.items()}
    assert (method, path) == ("GET", "/capture?a=1")
    assert got["accept"] == "application/json" and got["authorization"] == "Bearer explicit"
    assert got["host"] == f"127.0.0.1:{target.server_port}"
    for secret in ("proxy-authorization", "x-api-key", "cookie", "origin"):
        assert secret not in got


def test_proxy_post_body_and_status(target):
    app = create_app(ServerSettings(ui_mcp_proxy=True))
    url = f"/cors-proxy?url=http://127.0.0.1:{target.server_port}/created"
    r = call(app, "POST", url, content=b'{"q": 1}',
             headers={"x-llama-server-proxy-header-content-type": "application/json"})
    assert r.status_code == 201
    method, _, headers, body = target.seen[-1]
    assert method == "POST" and body == b'{"q": 1}'
    assert {k.lower(): v for k, v in headers.items()}["content-type"] == "application/json"


@pytest.mark.parametrize("url", ["", "file:///etc/passwd", "ftp://127.0.0.1/x", "http:///x",
                                 "http://u:p@127.0.0.1/x"])
def test_proxy_refuses_bad_targets(url):
    app = create_app(ServerSettings(ui_mcp_proxy=True))
    r = call(app, "GET", "/cors-proxy", params={"url": url} if url else None)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_proxy_unreachable_target_is_500():
    from ngramspec.server.launch import free_port

    app = create_app(ServerSettings(ui_mcp_proxy=True))
    r = call(app, "GET", f"/cors-proxy?url=http://127.0.0.1:{free_port()}/")
    assert r.status_code == 500 and r.text.startswith("proxy error:")
