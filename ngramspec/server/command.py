"""`ngramspec serve`: llama-server-compatible HTTP server (FastAPI + uvicorn, SSE).

Its flags are llama-server's (generated from `ngramspec.settings.flags.FLAGS`); flags with no
meaning here are accepted with one warning line each. This module imports
`flags`, `settings` and `app`, never `ngramspec.cli.main`.

Shutdown (SIGINT/SIGTERM): the scheduler is stopped at once, so every request in
flight or waiting gets its final event (503 "the server is shutting down") and its
handler returns; uvicorn then has nothing to wait for. The whole shutdown takes
well under a second (`SHUTDOWN_GRACE_S` bounds what is left).
"""
from __future__ import annotations

import logging
import os
import socket
import sys
from typing import Any, Callable

import click

from ..settings import click_options
from ..console import err_console

#: seconds uvicorn waits for responses after the scheduler has failed them (a backstop)
SHUTDOWN_GRACE_S = 0.5


@click.command(context_settings=click_options.CONTEXT_SETTINGS)
@click_options.options("serve")
@click.version_option(package_name="ngramspec")
@click.pass_context
def serve(ctx: click.Context, **kw: Any) -> None:
    """Serve the model over HTTP like llama-server (OpenAI + llama.cpp endpoints).

    Takes llama-server's flags (docs/server-flags.md says what each maps to).
    -c/--ctx-size is the size of ONE context shared by all -np slots: each slot
    holds n_ctx / parallel tokens (prompt + output). A longer prompt gets
    exceed_context_size_error; output stops with finish_reason "length" when the
    slot is full. -n sets the default n_predict of requests (-1: until the slot
    is full). The speculation flags are every request's defaults; a request may
    override them (`speculative: {type, n_max, n_min, p_min, ngram_size_n,
    ngram_size_m, ngram_min_hits}`) or turn speculation off (header
    X-Ngramspec-Speculative: off).
    """
    from ..jobs.chat import check_template
    from ..settings.typed import typed

    for line in click_options.warnings_for(ctx, "serve", kw):
        click.echo(f"ngramspec serve: {line}", err=True)
    click_options.pop_unused(kw)
    settings = typed(kw, serve=True).server
    verbose = bool(settings.verbose or (ctx.obj or {}).get("verbose"))
    if verbose and ctx.obj is not None:
        ctx.obj["verbose"] = True
    check_template(settings)
    level = logging.ERROR if settings.log_disable else logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    run_server(settings, verbose)


def bind(hosts: tuple[str, ...], port: int, reuse_port: bool = False) -> list[socket.socket]:
    """One listening socket per address (llama-server's comma-separated --host): IPv4,
    IPv6 (IPv6-only when there are several addresses, as llama-server) or a UNIX
    socket path ending in .sock. Raises click.ClickException naming what failed."""
    socks: list[socket.socket] = []
    try:
        for host in hosts:
            socks.append(_bind_one(host, port, reuse_port, ipv6_only=len(hosts) > 1))
    except OSError as e:
        for s in socks:
            s.close()
        raise click.ClickException(f"could not listen on {host}:{port}: {e.strerror or e}") from None
    return socks


def _bind_one(host: str, port: int, reuse_port: bool, ipv6_only: bool) -> socket.socket:
    if host.endswith(".sock"):
        if os.path.exists(host):
            os.unlink(host)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(host)
        return s
    family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                               flags=socket.AI_PASSIVE)[0]
    # proto IPPROTO_TCP, not 0: asyncio turns Nagle off (TCP_NODELAY) only on accepted
    # sockets whose proto says TCP, and they inherit the listener's. With Nagle on, a
    # response written as headers + body waits for the client's delayed ACK: ~40 ms on
    # every request after the first on a keep-alive connection.
    s = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port and hasattr(socket, "SO_REUSEPORT"):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1 if ipv6_only else 0)
        s.bind(addr)
    except OSError:
        s.close()
        raise
    return s


def _url(sock: socket.socket) -> str:
    if sock.family == socket.AF_UNIX:
        return f"unix://{sock.getsockname()}"
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if sock.family == socket.AF_INET6 else f"http://{host}:{port}"


def make_server(app, settings, verbose: bool, on_exit: Callable[[], None]):
    """A uvicorn.Server whose exit signal first stops the scheduler (see module doc)."""
    import uvicorn

    from .protocol import Protocol

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame) -> None:
            on_exit()
            super().handle_exit(sig, frame)

    log_level = "error" if settings.log_disable else "info" if verbose else "warning"
    config = uvicorn.Config(app, http=Protocol, log_level=log_level, access_log=verbose,
                            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
                            timeout_keep_alive=max(1, settings.timeout))
    return Server(config)


def run_server(settings, verbose: bool) -> None:
    """Bind every --host, start the app (the model loads in the background) and serve
    until a signal; raise what made loading fail."""
    from .app import create_app

    holder: dict[str, Any] = {}

    def on_fatal() -> None:
        srv = holder.get("server")
        if srv is not None:
            srv.should_exit = True

    app = create_app(settings, on_fatal=on_fatal)
    state = app.state.ngramspec

    def stop_scheduler() -> None:
        if state.scheduler is not None:
            state.scheduler.shutdown(wait=False)

    socks = bind(settings.host, settings.port, settings.reuse_port)
    server = make_server(app, settings, verbose, stop_scheduler)
    holder["server"] = server
    spec = ",".join(settings.spec.types) or "none"
    err_console.print(f"ngramspec serve: listening on {', '.join(_url(s) for s in socks)} "
                      f"({settings.n_parallel} slot{'s' if settings.n_parallel != 1 else ''}, "
                      f"spec {spec}); loading the model ...")
    try:
        server.run(sockets=socks)
    finally:
        for s in socks:
            s.close()
    if state.load_error is not None:
        raise state.load_error
    if not server.started:
        raise click.ClickException("the HTTP server did not start")
