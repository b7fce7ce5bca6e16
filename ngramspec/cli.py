"""The `ngramspec` command line: generate, serve, batch, bench, replay, doctor.

Flags follow llama.cpp. The flags the commands share (model, sampling,
speculation, server) are generated from the one table in `flags.py`, so every
command spells and validates them the same way. The commands import `flags`, never
each other: this module registers `serve` and `batch`, which do not import it.
Errors the user can fix exit non-zero with one line on stderr, no traceback
(pass --verbose for one).
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from . import flags
from .console import err_console, out_console
from .errors import ConfigError, NgramSpecError, TokenError


#: engines of one-shot commands, kept until the process ends so that the OS takes their
#: memory back instead of llama.cpp's frees (~0.2 s; model._at_exit)
_HELD_TILL_EXIT: list = []


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


# ------------------------------------------------------------------ replay


@main.command()
@click.argument("streams", nargs=-1, required=True, type=click.Path(dir_okay=False))
@flags.options("replay")
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

    config = flags.spec_from_values(kwargs, need_draft=False)
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


# ------------------------------------------------------------------ generate


def read_prompt(prompt: str | None, file: str | None) -> str:
    if prompt is not None and file is not None:
        raise ConfigError("use either -p/--prompt or -f/--file, not both")
    if file is not None:
        try:
            return Path(file).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"cannot read prompt file {file}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"prompt file {file} is not UTF-8 text") from None
    if prompt is None:
        raise ConfigError("no prompt: pass -p TEXT or -f FILE")
    return prompt


@main.command(context_settings=flags.CONTEXT_SETTINGS)
@click.option("-p", "--prompt", default=None, help="prompt text")
@click.option("-f", "--file", "prompt_file", default=None, help="read the prompt from a file")
@flags.options("generate")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of text")
@click.pass_context
def generate(ctx: click.Context, prompt, prompt_file, n_predict, as_json, verbose, **kw) -> None:
    """Generate text with speculative decoding; print llama.cpp's statistics at the end."""
    from .generate import stream_generate
    from .runtime import load_engine
    from .stats import acceptance_line, calibration_line

    if verbose:
        ctx.obj["verbose"] = True
    text = read_prompt(prompt, prompt_file)
    sampling = flags.sampling_from_values(kw)
    settings = flags.engine_settings(kw, verbose=bool(ctx.obj.get("verbose")))
    spec = settings.spec
    with err_console.status("loading model ..."):
        engine = load_engine(settings, notify=lambda line: err_console.print(line))
    _HELD_TILL_EXIT.append(engine)
    if ctx.obj.get("verbose"):
        err_console.print(engine.ctx.kernel_line(), markup=False)
    pieces, last = [], None
    for r in stream_generate(engine, text, sampling, n_predict,
                             speculative=engine.speculates()):
        if as_json:
            pieces.append(r.text)
        else:
            sys.stdout.write(r.text)
            sys.stdout.flush()
        last = r
    stats = engine.stats()
    if as_json:
        click.echo(json.dumps({
            "content": "".join(pieces), "finish_reason": last.finish_reason,
            "timings": last.timings(), "tokens_per_step": last.tokens_per_step,
            "spec_type": ",".join(spec.types) or "none",
            "calibration": _calibration_json(engine.calibration),
            "kernels": engine.ctx.kernel_state(), "kv_cells": engine.ctx.cell_mode,
            "statistics": {k: v.as_dict() for k, v in stats.items()}}, indent=2))
        return
    sys.stdout.write("\n")
    err = err_console.file
    print(acceptance_line(last.draft_n_accepted, last.draft_n), file=err)
    if engine.calibration is not None:
        print(calibration_line(engine.calibration), file=err)
    for st in stats.values():
        print(st.line(), file=err)
    print(f"prompt: {last.prompt_tokens} tokens in {last.prompt_ms:.1f} ms; generated: "
          f"{last.generation_tokens} tokens in {last.predicted_ms:.1f} ms = "
          f"{last.predicted_per_second:.2f} tok/s; mean acceptance length "
          f"{last.tokens_per_step:.2f} tokens/step", file=err)


def _calibration_json(cal) -> dict:
    """`--json`'s calibration: seconds spent at start-up on the cost model, and how."""
    if cal is None:
        return {"seconds": 0.0, "source": "none"}
    return {"seconds": round(cal.seconds, 4), "source": cal.source}


# ------------------------------------------------------------------ bench


@main.command(context_settings=flags.CONTEXT_SETTINGS)
@click.argument("prompt_files", nargs=-1, type=click.Path(dir_okay=False))
@flags.options("bench")
@click.option("--reps", type=int, default=2, show_default=True, help="runs per mode (interleaved)")
@click.option("--workloads", default=None,
              help="comma list of fixture workloads to run (default: all; 'none' for only files)")
@click.option("--no-oracle", is_flag=True, help="skip the oracle drafter")
@click.option("--json-out", type=click.Path(dir_okay=False), default=None, help="write JSON here")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="write a PNG chart of the speedups here")
@click.option("--llama-server", "llama_server", default=None,
              help="path of a C++ llama-server binary to run on the same prompts and types")
@click.option("--parallel", default=None,
              help="pipeline mode: comma list of slot counts (e.g. 1,4,8); documents go through "
                   "`ngramspec serve -np N` with N concurrent clients (and --llama-server's)")
@click.option("--docs", default=None,
              help="pipeline mode: a JSONL file of {id, prompt} or a directory of prompt files "
                   "(default: held-out documents from Python's standard library)")
@click.option("--n-docs", type=int, default=None, help="pipeline mode: use the first N documents")
@click.option("--peer-types", default="ngram-mod,ngram-map-k4v,ngram-simple,ngram-map-k",
              show_default=True, help="pipeline mode: llama-server spec types to run")
@click.option("--own-types", default="ngram-mod,ngram-simple", show_default=True,
              help="pipeline mode: ngramspec's fixed spec types to run beside auto ('none': "
                   "only off, auto and the oracle)")
@click.option("--rounds", type=int, default=1, show_default=True,
              help="pipeline mode: run every configuration this many times, interleaved "
                   "(forward, backward, ...), every server loaded and all but the timed one "
                   "stopped; the table shows each one's median round")
@click.pass_context
def bench(ctx: click.Context, prompt_files, n_predict, reps, workloads, no_oracle, json_out,
          plot_path, llama_server, parallel, docs, n_docs, peer_types, own_types, rounds,
          verbose, **kw) -> None:
    """Benchmark tok/s: speculation off vs every spec type (and the oracle), greedy.

    Each spec type in --spec-type is a separate mode; the table shows the median
    tok/s of `reps` interleaved runs and the speedup over `off` from this run.
    With --parallel, documents run through servers instead (`pipeline_bench.py`).
    """
    if parallel is not None:
        passed = {"targets": ("model", "spec"),
                  "skip": ("model", "ctx_size", "threads", "spec_type")}
        _bench_pipeline(parallel, docs, n_docs, n_predict, kw["threads"], kw["ctx_size"],
                        kw["model"], llama_server, peer_types, json_out, own_types,
                        (flags.given_argv(ctx, "bench", **passed),
                         flags.given_argv(ctx, "bench", **passed, peer=True)), rounds)
        return
    from . import bench as B
    from .config import check_draft_model, parse_spec_types
    from .runtime import load_engine

    if verbose:
        ctx.obj["verbose"] = True
    mode_types = [t.strip() for t in kw.pop("spec_type").split(",") if t.strip()]
    for t in mode_types:
        parse_spec_types(t)  # each mode is validated on its own
        check_draft_model(t, kw["model_draft"] is not None)
    spec = flags.spec_from_values(kw, kw["model_draft"])
    settings = flags.engine_settings(kw, verbose=bool(ctx.obj.get("verbose")),
                                     spec=spec.with_types("auto"))
    if reps < 1 or n_predict < 1:
        raise ConfigError("--reps and -n must be >= 1")
    works = _bench_workloads(B, workloads, prompt_files)
    modes = ["off", *[t for t in mode_types if t != "none"]] + ([] if no_oracle else ["oracle"])
    with err_console.status("loading model ..."):
        base = load_engine(settings, notify=lambda line: err_console.print(line))
    m, cost, threads = base.model, base.policy.cost, base.ctx.params.n_threads
    peer_types = [t for t in mode_types if t in B.SPEC_TYPES] if llama_server else []
    all_results, peers = _bench_runs(B, base, works, modes, spec, n_predict, reps,
                                     llama_server, peer_types, settings.n_ctx)
    for name, res in all_results.items():
        _print_bench(name, res, n_predict, reps, peers.get(name))
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

    from .engine import Engine
    from .policy import CostPolicy

    m, context, cost = base.model, base.ctx, base.policy.cost

    def make_engine(cfg, extra, draft_model):
        context.clear()
        policy = CostPolicy(cost, compare_all=cfg.auto) if cfg.policy == "cost" else None
        if extra is None and (cfg.enabled or draft_model):
            extra = base.draft_drafter  # -md drafts after the n-gram chain, as in generate
        return Engine(m, context, cfg, draft_drafter=extra, policy=policy)

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

    from . import pipeline_bench as PB
    from .runtime import default_threads

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
    _print_pipeline(rep, counts, len(documents), n_predict)
    from .doctor import measured_on, measured_on_line

    where = measured_on()
    out_console.print(measured_on_line(where), markup=False)
    if json_out:
        Path(json_out).write_text(json.dumps({"runs": [asdict(r) for r in rep.runs],
                                              "rounds": [asdict(r) for r in rep.rounds],
                                              "checks": rep.checks,
                                              "check_rounds": rep.check_rounds,
                                              "measured_on": where}, indent=1))


def _print_pipeline(rep, counts, n_docs, n_predict) -> None:
    n_rounds = len({r.round for r in rep.rounds}) or 1
    medians = f"; median of {n_rounds} interleaved rounds" if n_rounds > 1 else ""
    t = Table(title=f"pipeline: {n_docs} documents, {n_predict} tokens each, greedy; aggregate "
                    "tok/s = generated tokens / wall time (prompt processing included); gen "
                    f"tok/s = generation only (wall less a prompts-only run's){medians}")
    for col in ("slots", "server", "mode", "agg tok/s", "gen tok/s", "wall s", "tokens/step",
                "drafted", "accepted", "identical to off", "vs llama-server best",
                "vs llama-server off", "peak RSS MiB"):
        t.add_column(col, justify="left" if col in ("server", "mode") else "right")
    for n in counts:
        best, peer_off = rep.best_peer(n), rep.get("llama-server", "off", n)
        for r in [x for x in rep.runs if x.slots == n and x.mode != "prefill"]:
            off = rep.get(r.server, "off", n)
            same = f"{rep.identical(r, off)}/{len(r.outputs)}" if r.server == "ngramspec" else "-"
            gen = rep.gen_tok_per_s(r)
            t.add_row(str(n), r.server, r.mode, f"{r.tok_per_s:.1f}",
                      f"{gen:.1f}" if gen else "-",
                      f"{r.wall_s:.1f}", f"{r.tokens_per_step:.2f}", str(r.drafted),
                      str(r.accepted), same,
                      f"{r.tok_per_s / best.tok_per_s:.2f}x" if best else "-",
                      f"{r.tok_per_s / peer_off.tok_per_s:.2f}x" if peer_off else "-",
                      f"{r.peak_rss_mib:.0f}" if r.peak_rss_mib else "-")
    out_console.print(t)
    for n in counts:
        out_console.print(_pipeline_summary(rep, n))
        auto = rep.get("ngramspec", "auto", n)
        if auto and auto.sources:
            out_console.print(f"{n} slot(s), the default's drafts per source: "
                              + _sources_text(auto.sources))
        if n_rounds > 1:
            out_console.print(_pipeline_rounds(rep, n))
    _print_prompt_checks(rep, n_rounds)


def _sources_text(sources: dict[str, list[int]]) -> str:
    """Each drafter's drafts, tokens and accepted tokens, most tokens first."""
    return "; ".join(f"{d} {k} drafts, {tok} tokens, {acc} accepted ({acc / tok:.0%})"
                     for d, (k, tok, acc) in sorted(sources.items(), key=lambda x: -x[1][1]))


def _pipeline_summary(rep, n) -> str:
    """One slot count's line: the default against its spec-off, the oracle, its best fixed
    type, llama-server's best, and both servers' peak memory."""
    auto, off = rep.get("ngramspec", "auto", n), rep.get("ngramspec", "off", n)
    line = f"{n} slot(s): default {auto.tok_per_s / off.tok_per_s:.2f}x its spec-off"
    one = rep.get("ngramspec", "auto", 1)
    if one and n > 1:
        line += f", {auto.tok_per_s / one.tok_per_s:.2f}x its 1-slot aggregate"
        base = rep.get("ngramspec", "off", 1)
        line += f"; spec-off outputs identical to 1 slot: {rep.identical(off, base)}/{len(off.outputs)}"
    oracle = rep.get("ngramspec", "oracle", n)
    if oracle:
        line += f", {auto.tok_per_s / oracle.tok_per_s:.0%} of the oracle's tok/s"
    fixed = rep.best_own_fixed(n)
    if fixed:
        line += f"; vs its best fixed type ({fixed.mode}) {auto.tok_per_s / fixed.tok_per_s:.2f}x"
    best = rep.best_peer(n)
    if best:
        line += f"; vs llama-server's best ({best.mode}) {auto.tok_per_s / best.tok_per_s:.2f}x"
        gen, peer_gen = rep.gen_tok_per_s(auto), rep.gen_tok_per_s(best)
        if gen and peer_gen:
            line += f", generation only {gen / peer_gen:.2f}x"
    peer_off = rep.get("llama-server", "off", n)
    if peer_off and off.peak_rss_mib and peer_off.peak_rss_mib:
        line += (f"; peak RSS spec-off {off.peak_rss_mib:.0f} vs llama-server "
                 f"{peer_off.peak_rss_mib:.0f} MiB ({off.peak_rss_mib / peer_off.peak_rss_mib:.2f}x)")
    if peer_off and off.peak_pss_mib and peer_off.peak_pss_mib:
        line += (f"; peak PSS (shared file pages once) {off.peak_pss_mib:.0f} vs "
                 f"{peer_off.peak_pss_mib:.0f} MiB ({off.peak_pss_mib / peer_off.peak_pss_mib:.2f}x)")
    return line


def _pipeline_rounds(rep, n) -> str:
    """One slot count's ratios in each round (the rows of one round ran minutes apart at
    most, so a host that drifts between rounds moves both sides of a ratio)."""
    def get(runs, server, mode):
        return rep.get(server, mode, n, runs)

    def ratio(a, b):
        return a.tok_per_s / b.tok_per_s if a and b else None

    def gen_ratio(rs, a, b):
        x, y = (rep.gen_tok_per_s(a, rs), rep.gen_tok_per_s(b, rs)) if a and b else (None, None)
        return x / y if x and y else None

    pairs = {"spec-off vs llama-server spec-off": lambda rs: ratio(
                 get(rs, "ngramspec", "off"), get(rs, "llama-server", "off")),
             "the same, generation only": lambda rs: gen_ratio(
                 rs, get(rs, "ngramspec", "off"), get(rs, "llama-server", "off")),
             "prompts only (the prefill rows)": lambda rs: ratio(
                 get(rs, "ngramspec", "prefill"), get(rs, "llama-server", "prefill")),
             "default vs llama-server's best": lambda rs: ratio(
                 get(rs, "ngramspec", "auto"), rep.best_peer(n, rs)),
             "default vs its best fixed type": lambda rs: ratio(
                 get(rs, "ngramspec", "auto"), rep.best_own_fixed(n, rs))}
    parts = []
    for name, fn in pairs.items():
        xs = rep.per_round(n, fn)
        if xs:
            parts.append(f"{name} {', '.join(f'{x:.2f}x' for x in xs)} "
                         f"(median {statistics.median(xs):.2f}x)")
    return f"{n} slot(s), per round: " + "; ".join(parts)


def _print_prompt_checks(rep, n_rounds) -> None:
    ours, peer = rep.checks.get("ngramspec"), rep.checks.get("llama-server")
    if not ours:
        return
    line = f"prompt processing, {ours['prompt_n']}-token prompt: {ours['prompt_per_second']:.1f} tok/s"
    if peer:
        line += (f" vs llama-server {peer['prompt_per_second']:.1f} "
                 f"({ours['prompt_per_second'] / peer['prompt_per_second']:.2f}x)")
    rounds = list(zip(rep.check_rounds.get("ngramspec", []), rep.check_rounds.get("llama-server", [])))
    if n_rounds > 1 and rounds:
        line += "; per round " + ", ".join(f"{a / b:.2f}x" for a, b in rounds) + " (medians above)"
    out_console.print(line)
    out_console.print(f"prompt cache: second request cache_n {ours['cache_n']}, prompt "
                      f"{ours['cache_second_prompt_ms']:.0f} ms vs first "
                      f"{ours['cache_first_prompt_ms']:.0f} ms "
                      f"({ours['cache_second_prompt_ms'] / ours['cache_first_prompt_ms']:.0%})")


def _print_bench(name, res, n_predict, reps, peer=None) -> None:
    from .bench import speedups

    sp = speedups(res)
    t = Table(title=f"bench: {name} (greedy, {n_predict} tokens, median of {reps})")
    cols = ["mode", "tok/s", "speedup", "accept rate", "tokens/step", "drafter share", "exact"]
    if peer:
        cols += ["llama-server tok/s", "ours / llama-server"]
    for col in cols:
        t.add_column(col, justify="left" if col == "mode" else "right")
    for mode, r in res.items():
        row = [mode, f"{r.median_tps:.1f}", f"{sp[mode]:.2f}x",
               f"{r.acceptance_rate:.1%}" if r.drafted else "-",
               f"{r.tokens_per_step:.2f}", f"{r.drafter_share:.1%}",
               "yes" if r.exact else "NO"]
        if peer:
            p = peer.get(mode)
            row += [f"{p:.1f}" if p else "-", f"{r.median_tps / p:.2f}x" if p else "-"]
        t.add_row(*row)
    out_console.print(t)
    if peer and "auto" in res:
        best = max((v, k) for k, v in peer.items() if k != "off")
        out_console.print(f"auto vs llama-server's best ngram type ({best[1]}, {best[0]:.1f} tok/s):"
                          f" {res['auto'].median_tps / best[0]:.2f}x")


def run() -> None:
    """Console-script entry point."""
    main(obj={})


from .server.command import serve  # noqa: E402
main.add_command(serve)
from .batch.command import batch  # noqa: E402
main.add_command(batch)
from .doctor import doctor  # noqa: E402
main.add_command(doctor)


if __name__ == "__main__":  # pragma: no cover
    run()
