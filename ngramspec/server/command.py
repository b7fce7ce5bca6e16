"""`ngramspec serve`: llama-server-compatible HTTP server (FastAPI + uvicorn, SSE)."""
from __future__ import annotations

import logging
import sys
from typing import Any

import click

from ..cli import err_console, model_options, sampling_from_kwargs, sampling_options, spec_options


@click.command()
@model_options
@sampling_options
@spec_options()
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", type=int, default=8080, show_default=True, help="port to listen on")
@click.option("-np", "--parallel", "parallel", type=int, default=1, show_default=True,
              help="slots: requests decoded together, each a llama.cpp sequence of one context")
@click.option("--queue-size", type=int, default=64, show_default=True,
              help="requests that may wait for a free slot; beyond that 503 unavailable_error")
@click.option("--api-key", default=None, envvar="NGRAMSPEC_API_KEY",
              help="require 'Authorization: Bearer KEY' (env NGRAMSPEC_API_KEY)")
@click.option("--metrics", is_flag=True, help="enable GET /metrics (Prometheus text)")
@click.option("--verbose", "verbose_cmd", is_flag=True, help="access log, llama.cpp logs, tracebacks")
@click.pass_context
def serve(ctx: click.Context, model, model_draft, ctx_size, threads, n_predict, draft_p_min,
          host, port, parallel, queue_size, api_key, metrics, verbose_cmd, **kw: Any) -> None:
    """Serve the model over HTTP like llama-server (OpenAI + llama.cpp endpoints).

    -c/--ctx-size is the size of ONE context shared by all -np slots: each slot
    holds n_ctx / parallel tokens (prompt + output). A longer prompt gets
    exceed_context_size_error; output stops with finish_reason "length" when the
    slot is full. -n sets the default n_predict of requests (-1: until the slot
    is full). The speculation flags are every request's defaults; a request may
    override them (`speculative: {type, n_max, n_min, ngram_size_n,
    ngram_size_m}`) or turn speculation off (header X-Ngramspec-Speculative: off).
    """
    import uvicorn

    from .app import create_app, uvicorn_server
    from .settings import ServerSettings
    from ..cli import config_from_kwargs

    verbose = bool(verbose_cmd or (ctx.obj or {}).get("verbose"))
    if verbose and ctx.obj is not None:
        ctx.obj["verbose"] = True
    sampling = sampling_from_kwargs(kw)
    spec = config_from_kwargs(kw)
    settings = ServerSettings(model=model, model_draft=model_draft, n_ctx=ctx_size, threads=threads,
                              draft_p_min=draft_p_min, spec=spec, sampling=sampling,
                              n_predict=n_predict, host=host, port=port, n_parallel=parallel,
                              queue_size=queue_size, api_key=api_key, metrics=metrics,
                              verbose=verbose)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    holder: dict[str, Any] = {}

    def on_fatal() -> None:
        srv = holder.get("server")
        if srv is not None:
            srv.should_exit = True

    app = create_app(settings, on_fatal=on_fatal)
    config = uvicorn.Config(app, host=host, port=port, log_level="info" if verbose else "warning",
                            access_log=verbose, timeout_graceful_shutdown=3,
                            timeout_keep_alive=30)
    server = uvicorn_server(app, config)
    holder["server"] = server
    err_console.print(f"ngramspec serve: listening on http://{host}:{port} "
                      f"({parallel} slot{'s' if parallel != 1 else ''}, spec "
                      f"{','.join(spec.types) or 'none'}); loading the model ...")
    server.run()
    state = app.state.ngramspec
    if state.load_error is not None:
        raise state.load_error
    if not server.started:
        raise click.ClickException(f"could not listen on {host}:{port}")


for _p in serve.params:  # llama-server's default: generate until the end or the slot is full
    if _p.name == "n_predict":
        _p.default = -1
        _p.help = "default tokens to generate per request (-1: until end of text or the slot is full)"
