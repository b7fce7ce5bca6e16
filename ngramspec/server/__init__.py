"""llama-server-compatible HTTP server for ngramspec (`ngramspec serve`).

Modules: settings (ServerSettings, defined once), types (request bodies),
errors (the one exception -> error-body mapping), scheduler (slots, the engine
thread), chat (templates), metrics (Prometheus text), state (ServerState and the
route dependencies), prepare (request -> job), run (jobs on the scheduler from the
event loop; disconnects), render (response JSON), routes_native / routes_openai
(the endpoints), app (create_app), command (the click command).
"""
from __future__ import annotations

__all__ = ["ServerSettings", "create_app"]


def __getattr__(name):  # lazy: importing the package must not import fastapi
    if name == "create_app":
        from .app import create_app

        return create_app
    if name == "ServerSettings":
        from .settings import ServerSettings

        return ServerSettings
    raise AttributeError(name)
