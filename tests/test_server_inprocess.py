"""The app in-process without a model (no lifespan: the model never loads): what must
work before the engine exists — CORS preflights, 503 while loading, the API key."""
from __future__ import annotations

from asgi_client import call
from ngramspec.server.app import create_app
from ngramspec.settings.server import ServerSettings


def test_preflight_needs_neither_model_nor_key():
    app = create_app(ServerSettings(api_key="k"))
    r = call(app, "OPTIONS", "/v1/chat/completions",
             headers={"Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST"})
    assert r.status_code == 200 and r.text == ""
    assert r.headers["access-control-allow-origin"] == "http://localhost:5173"
    assert r.headers["access-control-allow-headers"] == "*"


def test_loading_and_key_errors_carry_cors():
    app = create_app(ServerSettings(api_key="k"))
    r = call(app, "GET", "/health", headers={"Origin": "http://x.example"})
    assert r.status_code == 503 and r.json()["error"]["message"] == "Loading model"
    assert r.headers["access-control-allow-origin"] == "http://x.example"
    r = call(app, "POST", "/completion", json={"prompt": "x"},
             headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
