"""The `ngramspec` command line: generate, serve, batch, bench, replay, doctor.

Flags follow llama.cpp. The flags the commands share (model, sampling,
speculation, server) are generated from the one table in `settings/flags.py`, so every
command spells and validates them the same way. Each command is a module of its own
(cli/generate.py, cli/bench.py, cli/replay.py, server/command.py, batch/command.py,
doctor.py); this group registers them, and none imports another's module.
Errors the user can fix exit non-zero with one line on stderr, no traceback
(pass --verbose for one).
"""
from __future__ import annotations

from typing import Any

import click

from .bench import bench
from .generate import generate
from .replay import replay
from ..batch.command import batch
from ..doctor import doctor
from ..errors import ConfigError, NgramSpecError, TokenError
from ..server.command import serve


class CliGroup(click.Group):
    """A group that turns our errors into one-line messages and exit codes."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (ConfigError, TokenError) as e:
            raise click.UsageError(str(e)) from None
        except NgramSpecError as e:
            err = click.ClickException(str(e))
            err.exit_code = getattr(e, "exit_code", 1)
            raise err from None
        except (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt):
            raise
        except Exception as e:  # a bug or an environment problem: short unless --verbose
            if ctx.obj and ctx.obj.get("verbose"):
                raise
            raise click.ClickException(f"{type(e).__name__}: {e} (run with --verbose for "
                                       "a traceback)") from None


@click.group(cls=CliGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--verbose", is_flag=True, help="show tracebacks and llama.cpp logs")
@click.version_option(package_name="ngramspec")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """Draftless speculative decoding for llama.cpp: n-gram drafts, exact verification."""
    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose


def run() -> None:
    """Console-script entry point."""
    main(obj={})


for _command in (generate, serve, batch, bench, replay, doctor):
    main.add_command(_command)


if __name__ == "__main__":  # pragma: no cover
    run()
