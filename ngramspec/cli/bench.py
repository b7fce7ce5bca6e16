"""`ngramspec bench`: speculation off against on, measured in one run: `bench fixtures`
by workload (`bench.command`), `bench pipeline` side by side with llama-server
(`bench.pipeline`); the old spelling (`bench [FILES] [--parallel N]`) still works. The
tables are the bench package's."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import click

from .generate import read_prompt
from ..bench.command import FIXTURE_DIR, print_bench
from ..bench.pipeline_table import print_pipeline
from ..console import err_console, out_console
from ..settings.typed import typed
from ..errors import ConfigError
from ..settings import click_options


_WORKLOADS = (", ".join(sorted(p.stem for p in FIXTURE_DIR.glob("*.txt")))
              or f"none found in {FIXTURE_DIR}")
_SHARED = [
    click.option("--json-out", type=click.Path(dir_okay=False), default=None,
                 help="write JSON here"),
    click.option("--llama-server", "llama_server", default=None,
                 help="path of a C++ llama-server binary to run on the same prompts and types"),
]
_FIXTURES = [
    click.argument("prompt_files", nargs=-1, type=click.Path(dir_okay=False)),
    click.option("--reps", type=int, default=2, show_default=True,
                 help="runs per mode (interleaved)"),
    click.option("--workloads", default=None,
                 help="comma list of fixture workloads to run (default: all; 'none' for only "
                      "files): " + _WORKLOADS),
    click.option("--no-oracle", is_flag=True, help="skip the oracle drafter"),
    click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
                 help="write a PNG chart of the speedups here"),
]
_PIPELINE = [
    click.option("--docs", default=None,
                 help="a JSONL file of {id, prompt} or a directory of prompt files (default: "
                      "held-out documents from Python's standard library)"),
    click.option("--n-docs", type=int, default=None, help="use the first N documents"),
    click.option("--peer-types", default="ngram-mod,ngram-map-k4v,ngram-simple,ngram-map-k",
                 show_default=True, help="llama-server spec types to run"),
    click.option("--own-types", default="ngram-mod,ngram-simple", show_default=True,
                 help="ngramspec's fixed spec types to run beside auto ('none': only off, auto "
                      "and the oracle); TYPE:fixed runs TYPE on a server with --draft-policy "
                      "fixed (llama.cpp's lengths)"),
    click.option("--rounds", type=int, default=1, show_default=True,
                 help="run every configuration this many times, interleaved (forward, "
                      "backward, ...), every server loaded and all but the timed one stopped; "
                      "the table shows each one's median round"),
]
_PARALLEL_HELP = ("comma list of slot counts; documents go through `ngramspec serve -np N` with "
                  "N concurrent clients (and --llama-server's)")


def _options(*groups):
    """The decorators of `groups` (lists of click options/arguments), the flag table's
    bench flags first."""
    def apply(f):
        for deco in reversed([d for g in groups for d in g]):
            f = deco(f)
        return click_options.options("bench")(f)
    return apply


class BenchGroup(click.Group):
    """`bench fixtures` and `bench pipeline`. The old spelling, `bench [FILES] [--parallel
    N] ...` with every option of both, still works: arguments that do not start with a
    subcommand run the hidden `all`, which takes --parallel to mean the pipeline."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("-h", "--help")):
            args = ["all", *args]
        return super().parse_args(ctx, args)


@click.group(cls=BenchGroup, context_settings=click_options.CONTEXT_SETTINGS,
             help="Benchmark tok/s: speculation off against on, measured in one run.\n\n"
                  "`bench fixtures`: every --spec-type mode (and the oracle) on the fixture "
                  "workloads (" + _WORKLOADS + ") and prompt files, greedy. `bench pipeline "
                  "--parallel 1,4`: documents through servers beside llama-server. The old "
                  "spelling (`bench [FILES] [--parallel N] ...`) still works.")
def bench() -> None:
    pass


@bench.command("fixtures", context_settings=click_options.CONTEXT_SETTINGS)
@_options(_FIXTURES, _SHARED)
@click.pass_context
def bench_fixtures(ctx: click.Context, **kw) -> None:
    """Speculation off vs every spec type (and the oracle) on the fixture workloads and
    prompt files, greedy: the median tok/s of `reps` interleaved runs a mode."""
    _fixtures(ctx, **kw)


@bench.command("pipeline", context_settings=click_options.CONTEXT_SETTINGS)
@_options(_PIPELINE, _SHARED)
@click.option("--parallel", default="1,4", show_default=True, help=_PARALLEL_HELP)
@click.pass_context
def bench_pipeline(ctx: click.Context, **kw) -> None:
    """Held-out documents through `ngramspec serve -np N` (and llama-server), N concurrent
    clients: aggregate tok/s per slot count, mode and server."""
    _pipeline(ctx, **kw)


@bench.command("all", hidden=True, context_settings=click_options.CONTEXT_SETTINGS)
@_options(_FIXTURES, _PIPELINE, _SHARED)
@click.option("--parallel", default=None, help="pipeline mode: " + _PARALLEL_HELP)
@click.pass_context
def bench_all(ctx: click.Context, prompt_files, reps, workloads, no_oracle, plot_path,
              docs, n_docs, peer_types, own_types, rounds, parallel, **kw) -> None:
    """The old spelling: the pipeline with --parallel, else the fixtures."""
    if parallel is not None:
        _pipeline(ctx, parallel=parallel, docs=docs, n_docs=n_docs, peer_types=peer_types,
                  own_types=own_types, rounds=rounds, **kw)
    else:
        _fixtures(ctx, prompt_files=prompt_files, reps=reps, workloads=workloads,
                  no_oracle=no_oracle, plot_path=plot_path, **kw)


def _pipeline(ctx: click.Context, parallel, docs, n_docs, peer_types, own_types, rounds,
              json_out, llama_server, n_predict, verbose, **kw) -> None:
    passed = {"targets": ("model", "spec"), "skip": ("model", "ctx_size", "threads", "spec_type")}
    _bench_pipeline(parallel, docs, n_docs, n_predict, kw["threads"], kw["ctx_size"],
                    kw["model"], llama_server, peer_types, json_out, own_types,
                    (click_options.given_argv(ctx, "bench", **passed),
                     click_options.given_argv(ctx, "bench", **passed, peer=True)), rounds)


def _fixtures(ctx: click.Context, prompt_files, n_predict, reps, workloads, no_oracle,
              json_out, plot_path, llama_server, verbose, **kw) -> None:
    """`bench fixtures`: every mode on every workload, one model load."""
    from ..bench import command as B
    from ..settings.config import check_draft_model, parse_spec_types
    from ..engine.runtime import load_engine

    if verbose:
        ctx.obj["verbose"] = True
    mode_types = [t.strip() for t in kw.pop("spec_type").split(",") if t.strip()]
    for mode in mode_types:
        t = B.split_mode(mode)[0]  # TYPES[:POLICY]
        parse_spec_types(t)  # each mode is validated on its own
        check_draft_model(t, kw["model_draft"] is not None)
    t = typed(kw, verbose=bool(ctx.obj.get("verbose")))
    spec = t.spec
    settings = replace(t.engine, spec=spec.with_types("auto"))
    if reps < 1 or n_predict < 1:
        raise ConfigError("--reps and -n must be >= 1")
    works = _bench_workloads(B, workloads, prompt_files)
    modes = ["off", *[t for t in mode_types if t != "none"]] + ([] if no_oracle else ["oracle"])
    with err_console.status("loading model ..."):
        base = load_engine(settings, notify=lambda line: err_console.print(line))
    m, cost, threads = base.model, base.policy.cost, base.ctx.params.n_threads
    peer_types = ([t for t in dict.fromkeys(B.split_mode(m)[0] for m in mode_types)
                   if t in B.SPEC_TYPES] if llama_server else [])
    all_results, peers = _bench_runs(B, base, works, modes, spec, n_predict, reps,
                                     llama_server, peer_types, settings.n_ctx)
    for name, res in all_results.items():
        print_bench(name, res, n_predict, reps, peers.get(name))
    meta = {"model": str(m.path), "threads": threads, "n_predict": n_predict, "reps": reps,
            "modes": modes, "batch_invariant": settings.batch_invariant,
            "decode_cost": {"per_ubatch_s": cost.per_ubatch, "per_token_s": cost.per_token,
                            "per_logit_s": cost.per_logit, "per_kv_s": cost.per_kv}}
    if json_out:
        Path(json_out).write_text(B.to_json(all_results, meta, peers))
    if plot_path:
        B.plot(all_results, plot_path)
        err_console.print(f"chart written to {plot_path}")


def _bench_workloads(B, workloads: str | None, prompt_files) -> list:
    """The fixture workloads named by --workloads (all by default, none for 'none'), then
    one per prompt file."""
    works = B.fixture_workloads()
    if workloads is not None:
        wanted = [] if workloads == "none" else [w.strip() for w in workloads.split(",")]
        unknown = set(wanted) - {w.name for w in works}
        if unknown:
            raise ConfigError(f"unknown workload(s) {sorted(unknown)}; fixture workloads: "
                              f"{', '.join(w.name for w in works)}")
        works = [w for w in works if w.name in wanted]
    works += [B.Workload(Path(f).stem, read_prompt(None, f)) for f in prompt_files]
    if not works:
        raise ConfigError("nothing to run: no workloads selected and no prompt files given")
    return works


def _bench_runs(B, base, works, modes, spec, n_predict, reps, llama_server, peer_types,
                ctx_size) -> tuple[dict, dict]:
    """Every mode on every workload on `base`'s model and context (one engine per mode,
    the measured cost curve shared), and llama-server's runs of `peer_types`."""
    from rich.progress import Progress

    from ..engine.runtime import engine_on

    m, context = base.model, base.ctx

    def make_engine(cfg, extra, draft_model):
        context.clear()
        if extra is None and (cfg.enabled or draft_model):
            extra = base.draft_drafter  # -md drafts after the n-gram chain, as in generate
        return engine_on(m, context, cfg, extra, base.calibration, keep_refined=False)

    all_results, peers = {}, {}
    total = len(works) * reps * (len(modes) + (1 + len(peer_types) if llama_server else 0))
    with Progress(console=err_console, transient=True) as prog:
        task = prog.add_task("benchmarking", total=total)
        for w in works:
            prog.update(task, description=f"{w.name}")
            all_results[w.name] = B.run_workload(make_engine, w, modes, spec, n_predict, reps,
                                                 lambda: prog.advance(task))
            if llama_server:
                prog.update(task, description=f"{w.name} (llama-server)")
                peers[w.name] = B.run_peer(llama_server, str(m.path), w, peer_types, n_predict,
                                           reps, ctx_size, context.params.n_threads,
                                           lambda: prog.advance(task))
    return all_results, peers


def _bench_pipeline(parallel, docs, n_docs, n_predict, threads, ctx_size, model, llama_server,
                    peer_types, json_out, own_types="none", args=((), ()), rounds=1) -> None:
    """`bench --parallel`; `args`: the load, -md and spec flags the user gave, as
    command lines for ngramspec's server and for llama-server."""
    from dataclasses import asdict

    from ..bench import pipeline as PB
    from ..engine.runtime import default_threads

    try:
        counts = [int(x) for x in parallel.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--parallel takes slot counts like 1,4,8, got {parallel!r}") from None
    if not counts or min(counts) < 1:
        raise ConfigError(f"--parallel takes slot counts >= 1, got {parallel!r}")
    documents = PB.load_documents(docs, n_docs)
    types = [t.strip() for t in peer_types.split(",") if t.strip()]
    own = [t.strip() for t in own_types.split(",") if t.strip() and t.strip() != "none"]
    with err_console.status("pipeline benchmark ...") as status:
        rep = PB.run(documents, counts, n_predict, threads or default_threads(), ctx_size, model,
                     llama_server, types, progress=lambda s: status.update(s), own_types=own,
                     server_args=args[0], peer_args=args[1], rounds=rounds)
    print_pipeline(rep, counts, len(documents), n_predict)
    from ..doctor import measured_on, measured_on_line

    where = measured_on()
    out_console.print(measured_on_line(where), markup=False)
    if json_out:
        Path(json_out).write_text(json.dumps({"runs": [asdict(r) for r in rep.runs],
                                              "rounds": [asdict(r) for r in rep.rounds],
                                              "checks": rep.checks,
                                              "check_rounds": rep.check_rounds,
                                              "measured_on": where}, indent=1))
