"""The tables and lines `bench --parallel` prints from a `pipeline.PipelineReport`: every
row, then per slot count the default against its spec-off, its best single type and
llama-server's best, per round where there were several, and the prompt checks."""
from __future__ import annotations

import statistics

from rich.table import Table

from ..console import out_console


def print_pipeline(rep, counts, n_docs, n_predict) -> None:
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
    """One slot count's line: the default against its spec-off, the oracle, its best single
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
    single = rep.best_own_type(n)
    if single:
        line += (f"; vs its best single type ({single.mode}) "
                 f"{auto.tok_per_s / single.tok_per_s:.2f}x")
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
             "default vs its best single type": lambda rs: ratio(
                 get(rs, "ngramspec", "auto"), rep.best_own_type(n, rs))}
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
