"""The `ngramspec` command line: generate, serve, bench, replay.

Flags follow llama.cpp. Speculation flags are generated from
`config.SPEC_OPTIONS`, so every command spells and validates them the same way.
Errors the user can fix exit non-zero with one line on stderr, no traceback
(pass --verbose for one).
"""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable

import click
from rich.console import Console
from rich.table import Table

from .config import SPEC_OPTIONS, SpecConfig, spec_config_from_options, valid_types_text
from .errors import ConfigError, NgramSpecError, TokenError

err_console = Console(stderr=True)
out_console = Console()


class CliGroup(click.Group):
    """A group that turns our errors into one-line messages and exit codes."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (ConfigError, TokenError) as e:
            raise click.UsageError(str(e)) from None
        except NgramSpecError as e:
            raise click.ClickException(str(e)) from None
        except (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt):
            raise
        except Exception as e:  # a bug or an environment problem: short unless --verbose
            if ctx.obj and ctx.obj.get("verbose"):
                raise
            raise click.ClickException(f"{type(e).__name__}: {e} (run with --verbose for "
                                       "a traceback)") from None


def spec_options(default_type: str = "ngram-mod") -> Callable:
    """Decorator adding --spec-type, --spec-pool-mib and every SPEC_OPTIONS flag."""

    def decorate(f: Callable) -> Callable:
        for opt in reversed(SPEC_OPTIONS):
            f = click.option(*opt.flags, opt.dest, type=int, default=None, help=opt.help)(f)
        f = click.option("--spec-pool-mib", "spec_pool_mib", type=int, default=None,
                         help="shared hash pool size in MiB, a power of two (default: 16)")(f)
        f = click.option("--spec-type", "spec_type", default=default_type, show_default=True,
                         help=f"comma list of speculation types, first draft wins ({valid_types_text()})")(f)
        return f

    return decorate


def config_from_kwargs(kwargs: dict[str, Any]) -> SpecConfig:
    """Pop the speculation flags out of a command's kwargs into one SpecConfig."""
    dests = [o.dest for o in SPEC_OPTIONS]
    opts = {d: kwargs.pop(d) for d in dests if d in kwargs}
    mib = kwargs.pop("spec_pool_mib", None)
    pool = None
    if mib is not None:
        if mib < 1:
            raise ConfigError(f"--spec-pool-mib must be >= 1, got {mib}")
        pool = mib << 20
    return spec_config_from_options(spec_type=kwargs.pop("spec_type", None), pool_bytes=pool, **opts)


@click.group(cls=CliGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--verbose", is_flag=True, help="show tracebacks and llama.cpp logs")
@click.version_option(package_name="ngramspec")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """Draftless speculative decoding for llama.cpp: n-gram drafts, exact verification."""
    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose


# ------------------------------------------------------------------ replay


@main.command()
@click.argument("streams", nargs=-1, required=True, type=click.Path(dir_okay=False))
@spec_options()
@click.option("--max-draft", type=int, default=None, help="cap every draft (default: none)")
@click.option("--cost-history", type=int, default=8192, show_default=True,
              help="history length for the per-call cost benchmark (0 skips it)")
@click.option("--json", "as_json", is_flag=True, help="print machine-readable JSON")
def replay(streams: tuple[str, ...], max_draft: int | None, cost_history: int, as_json: bool,
           **kwargs: Any) -> None:
    """Measure drafters on recorded token streams (fixtures/streams/*.json), no model needed.

    Prints, per stream, a table with every drafter (the selected --spec-type
    marked) and the drafter cost at --cost-history tokens of history.
    """
    from .replay import drafter_cost, load_stream, replay_types
    from .config import SPEC_TYPES

    config = config_from_kwargs(kwargs)
    if max_draft is not None and max_draft < 0:
        raise ConfigError(f"--max-draft must be >= 0, got {max_draft}")
    report = []
    for path in streams:
        stream = load_stream(path)
        with err_console.status(f"replaying {stream.name} ..."):
            rows = replay_types(stream, config, max_draft=max_draft)
            costs = ([drafter_cost(stream, config, t, history=cost_history) for t in SPEC_TYPES]
                     if cost_history > 0 else [])
        report.append({"stream": stream.name, "path": path, "spec_type": ",".join(config.types),
                       "results": [r.as_dict() for r in rows],
                       "cost": [c.__dict__ for c in costs]})
        if not as_json:
            _print_replay(stream.name, len(stream.prompt), len(stream.generated), rows, costs,
                          set(config.types) if len(config.types) == 1 else {",".join(config.types)})
    if as_json:
        click.echo(json.dumps(report, indent=2))


def _print_replay(name, n_prompt, n_gen, rows, costs, selected) -> None:
    t = Table(title=f"replay: {name} ({n_prompt} prompt + {n_gen} generated tokens)")
    for col in ("drafter", "steps", "tokens/step", "accept rate", "drafts", "drafted",
                "accepted", "draft p50 µs", "draft p99 µs"):
        t.add_column(col, justify="left" if col == "drafter" else "right")
    for r in rows:
        mark = "★ " if r.name in selected else "  "
        t.add_row(mark + r.name, str(r.steps), f"{r.tokens_per_step:.2f}",
                  f"{r.acceptance_rate:.1%}", str(r.drafts), str(r.drafted), str(r.accepted),
                  f"{r.percentile_us(50):.1f}", f"{r.percentile_us(99):.1f}")
    out_console.print(t)
    if costs:
        c = Table(title=f"drafter cost at {costs[0].history} tokens of history")
        for col in ("drafter", "calls", "p50 µs/call", "p99 µs/call", "prompt ingestion"):
            c.add_column(col, justify="left" if col == "drafter" else "right")
        for r in costs:
            c.add_row(r.name, str(r.calls), f"{r.p50_us:.1f}", f"{r.p99_us:.1f}",
                      f"{r.ingest_tok_per_s / 1e6:.2f} M tok/s ({r.ingest_tokens} tokens)")
        out_console.print(c)


def run() -> None:
    """Console-script entry point."""
    main(obj={})


if __name__ == "__main__":  # pragma: no cover
    run()
