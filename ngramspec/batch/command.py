"""`ngramspec batch INPUT -o OUTPUT`: a JSONL file of records through the scheduler's
slots (or a Ray cluster's actors), resumable; see job.py for the guarantees."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from ..settings import click_options
from ..settings.typed import typed
from ..console import err_console
from ..errors import ConfigError


@click.command(context_settings=click_options.CONTEXT_SETTINGS)
@click.argument("input_path", metavar="INPUT",
                type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("-o", "--output", "output_path", required=True, type=click.Path(dir_okay=False),
              help="JSONL results, appended as records finish; re-running skips ids already there")
@click_options.options("batch")
@click.option("--ordered", is_flag=True, help="write OUTPUT in INPUT order (default: as finished)")
@click.option("--ray", "ray_address", is_flag=False, flag_value="auto", default=None,
              metavar="[ADDRESS]", help="spread records over a Ray cluster (pip install "
              "ngramspec[ray]); ADDRESS as for `ray start --address`, alone: a running local "
              "cluster or a new one")
@click.option("--actors", type=int, default=None,
              help="with --ray: engines to start (default: one per node of the cluster)")
@click.option("--chunk-size", type=int, default=None,
              help="with --ray: records an actor pulls at a time (default: -np)")
@click.option("--previous", "previous_paths", multiple=True,
              type=click.Path(exists=True, dir_okay=False), metavar="FILE",
              help="results JSONL of an earlier run (repeatable; the last file wins): a record "
              "whose id has a text there drafts from it first (its own 'prediction' wins); "
              "outputs are unchanged")
@click.option("--summary-json", type=click.Path(dir_okay=False), default=None,
              help="also write the summary's numbers here as JSON")
@click.pass_context
def batch(ctx: click.Context, input_path, output_path, n_predict, parallel, ordered, ray_address,
          actors, chunk_size, previous_paths, summary_json, verbose, **kw: Any) -> None:
    """Run every record of INPUT (JSONL, '-' for stdin) and append one result line per
    record to OUTPUT.

    A record is {"id", "prompt"} or {"id", "messages"}, with optional n_predict,
    temperature, seed, stop, grammar/json_schema, speculative, prediction (the output
    expected; --previous: the text an earlier run gave its id) and the other samplers
    (dry_*, xtc_*, typical_p, mirostat*, ...; as in the server's requests). A result
    line has id, line, text, finish_reason, llama.cpp's timings and, if the record
    failed, error {type, message}. Killed and re-run, the job
    goes on where it stopped. Exit status 1 if any record failed. Greedy (--temp 0)
    by default, so a re-run gives the same text. -c is shared by the -np slots.
    """
    from .job import count_records, run_job
    from .output import OutputFile
    from .previous import with_previous
    from .progress import Progress, Tally, summary_table
    from .runner import Defaults

    verbose = bool(verbose or ctx.obj.get("verbose"))
    ctx.obj["verbose"] = verbose
    if parallel < 1:
        raise ConfigError(f"-np/--parallel must be >= 1, got {parallel}")
    if ray_address is None and (actors is not None or chunk_size is not None):
        raise ConfigError("--actors and --chunk-size need --ray")
    for flag, v in (("--actors", actors), ("--chunk-size", chunk_size)):
        if v is not None and v < 1:
            raise ConfigError(f"{flag} must be >= 1, got {v}")
    if output_path == "-" or (input_path != "-" and Path(input_path).resolve() ==
                              Path(output_path).resolve()):
        raise ConfigError("-o/--output must be a file other than INPUT (it is read back to resume)")
    t = typed(kw, n_seq=parallel, verbose=verbose)
    load = dict(settings=t.engine, defaults=Defaults(t.sampling, n_predict, kw.pop("cache_prompt")))
    output = OutputFile(output_path)
    done = output.recover()  # before the model loads: a foreign OUTPUT stops us here
    texts = _previous(previous_paths)
    tally = Tally(total=None if input_path == "-" else count_records(input_path))
    backend = _backend(load, ray_address, actors, chunk_size)
    try:
        with _open_input(input_path) as lines, Progress(err_console, tally) as progress:
            tally.t0 = time.perf_counter()
            run_job(lines, output, done, lambda items: backend.run(with_previous(items, texts)),
                    tally, ordered, progress.update)
    finally:  # the summary also when the job stops on an error: OUTPUT holds what finished
        output.close()
        tally.t_end = time.perf_counter()
        speed = backend.speed()
        backend.close()
        if output.repaired_bytes:
            err_console.print(f"batch: cut a truncated last line ({output.repaired_bytes} "
                              f"bytes) from {output_path}; that record ran again")
        err_console.print(summary_table(tally, speed, output_path, backend.describe()))
    if summary_json:
        Path(summary_json).write_text(json.dumps(tally.as_dict(speed), indent=1))
    if tally.any_failed:
        ctx.exit(1)


def _previous(paths: tuple[str, ...]) -> dict[str, str]:
    """The earlier texts of --previous FILE... (read before the model loads), said once."""
    from .previous import load_previous

    texts = load_previous(paths)
    if paths:
        err_console.print(f"batch: {len(texts)} earlier texts from {len(paths)} --previous "
                          "file(s) will draft first", highlight=False)
    return texts


def _open_input(path: str):
    if path == "-":
        return sys.stdin
    try:
        return open(path, encoding="utf-8", errors="replace")
    except OSError as e:
        raise ConfigError(f"cannot read INPUT {path}: {e.strerror}") from None


def _backend(load: dict, ray_address: str | None, actors: int | None, chunk_size: int | None):
    """The engine(s) records run on: this process's, or a Ray cluster's actors."""
    if ray_address is None:
        from .runner import EngineRunner

        with err_console.status("loading model ..."):
            runner = EngineRunner.load(**load, notify=lambda line: err_console.print(line))
        err_console.print(runner.engine.ctx.kernels.line(), markup=False)
        return runner
    try:
        from .ray_backend import RayPool
    except ImportError as e:
        raise ConfigError(f"--ray needs Ray: pip install 'ngramspec[ray]' ({e})") from None
    with err_console.status("starting Ray actors and loading the model on each ..."):
        pool = RayPool(load, None if ray_address == "auto" else ray_address, actors, chunk_size)
    err_console.print(pool.kernel_line, markup=False)
    return pool
