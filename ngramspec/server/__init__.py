"""llama-server-compatible HTTP server for ngramspec (`ngramspec serve`).

Modules: command (the click command; its ServerSettings come from settings/), app (create_app),
routes_native / routes_openai (the endpoints), prepare and sampling_request (request ->
job), run (jobs on the scheduler from the event loop; disconnects), render and probs
(response JSON), embeddings, slot_actions (slot save, restore, erase), metrics
(Prometheus text), state (ServerState and the route dependencies), errors (an exception
-> its error body), cors and cors_proxy, protocol (uvicorn's HTTP/1.1 protocol with two
fixes), launch (a server process for bench and tests). Request types, jobs and the
slot scheduler are the jobs/ layer's.
"""
from __future__ import annotations

__all__ = ["ServerSettings", "create_app"]


def __getattr__(name):  # lazy: importing the package must not import fastapi
    if name == "create_app":
        from .app import create_app

        return create_app
    if name == "ServerSettings":
        from ..settings.server import ServerSettings

        return ServerSettings
    raise AttributeError(name)
