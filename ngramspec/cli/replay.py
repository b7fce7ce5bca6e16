"""`ngramspec replay`: a drafter measured on recorded token streams, without a model."""
from __future__ import annotations

import json
from typing import Any

import click

from ..bench.replay import print_replay
from ..console import err_console
from ..settings.typed import typed
from ..errors import ConfigError
from ..settings import click_options


@click.command()
@click.argument("streams", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click_options.options("replay")
@click.option("--max-draft", type=int, default=None, help="cap every draft (default: none)")
@click.option("--cost-history", type=int, default=8192, show_default=True,
              help="history length for the per-call cost benchmark (0 skips it)")
@click.option("--json", "as_json", is_flag=True, help="print machine-readable JSON")
def replay(streams: tuple[str, ...], max_draft: int | None, cost_history: int, as_json: bool,
           **kwargs: Any) -> None:
    """Measure drafters on recorded token streams (ngramspec/bench/fixtures/streams/*.json),
    no model needed.

    Prints, per stream, a table with every drafter (the selected --spec-type
    marked) and the drafter cost at --cost-history tokens of history.
    """
    from ..bench.replay import drafter_cost, load_stream, replay_types
    from ..settings.config import SPEC_TYPES

    config = typed(kwargs, need_draft=False).spec
    if config.auto:
        raise ConfigError("replay runs without a model, so it cannot measure the verify cost "
                          "that 'auto' needs; name spec types instead (e.g. --spec-type ngram-mod)")
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
            print_replay(stream.name, len(stream.prompt), len(stream.generated), rows, costs,
                          set(config.types) if len(config.types) == 1 else {",".join(config.types)})
    if as_json:
        click.echo(json.dumps(report, indent=2))
