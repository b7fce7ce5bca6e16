"""`bench --parallel`'s report: the ratios and the peak resident memory it prints come
from the runs it was given (hand-written runs, no servers); its interleaved rounds run
one server at a time (stand-in processes)."""
from __future__ import annotations

import mmap
import os
import sys
from dataclasses import replace

import pytest

from ngramspec.bench.pipeline_table import print_pipeline as _print_pipeline
from ngramspec.bench.pipeline import PipelineReport, RunResult
from ngramspec.server.launch import PeakPss, pss_kib, status_kib


def _run(server, mode, wall, peak):
    return RunResult(server, mode, 1, wall, outputs={"a": [1, 2], "b": [3]}, generated=320,
                     peak_rss_mib=peak, peak_pss_mib=peak - 100)


def test_the_report_prints_peak_rss_beside_llama_servers(capsys):
    rep = PipelineReport(runs=[_run("ngramspec", "off", 10.0, 900.0),
                               _run("ngramspec", "auto", 8.0, 950.0),
                               _run("llama-server", "off", 9.0, 800.0),
                               _run("llama-server", "ngram-mod", 8.5, 810.0)])
    _print_pipeline(rep, [1], 2, 160)
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "peak RSS spec-off 900 vs llama-server 800 MiB (1.12x)" in out
    assert "peak PSS (shared file pages once) 800 vs 700 MiB (1.14x)" in out
    assert "vs llama-server's best (ngram-mod) 1.06x" in out  # 40.0 / 37.6 tok/s
    assert "1.25x its spec-off" in out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_status_kib_reads_this_process_and_tolerates_a_gone_one():
    assert status_kib(os.getpid(), "VmHWM") >= status_kib(os.getpid()) > 0
    assert status_kib(2 ** 22 + 12345, "VmHWM") == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_peak_pss_counts_a_file_mapped_twice_once(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(16 << 20))
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as a, \
            mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as b:
        rss0, pss0 = status_kib(os.getpid()), pss_kib(os.getpid())
        with PeakPss(os.getpid(), period=0.01) as peak:
            assert a[:] == b[:]  # both mappings resident
        rss_grew = status_kib(os.getpid()) - rss0
        pss_grew = peak.kib - pss0
    assert rss_grew >= 31 << 10  # RSS counts the 16 MiB twice
    assert 15 << 10 <= pss_grew < 24 << 10  # PSS once
    assert pss_kib(2 ** 22 + 12345) == 0


# ---------------------------------------------------------------- interleaved rounds

def _r(server, mode, wall, rnd=0, slots=1, outputs=None, generated=320):
    return RunResult(server, mode, slots, wall, outputs=outputs or {"a": [1, 2], "b": [3]},
                     generated=generated, round=rnd)


def test_schedule_alternates_servers_and_runs_later_rounds_backward():
    from ngramspec.bench.pipeline import schedule
    from ngramspec.bench.servers import starter as PB_starter

    plan = schedule(["off", "auto", "ngram-mod"], ["ngram-mod", "ngram-simple"], True, 3)
    names = [(r.server[0], r.mode) for r in plan[0]]
    assert names == [("n", "off"), ("l", "off"), ("n", "prefill"), ("l", "prefill"),
                     ("n", "auto"), ("l", "ngram-mod"), ("n", "ngram-mod"), ("l", "ngram-simple"),
                     ("n", "oracle"), ("n", "prompt"), ("l", "prompt")]
    key = lambda rows: [(r.server, r.mode) for r in rows]  # noqa: E731
    assert key(plan[1]) == key(plan[0])[::-1] and key(plan[2]) == key(plan[0])
    procs = {(r.server, r.mode): r.process for r in plan[0]}
    assert procs[("llama-server", "off")] == procs[("llama-server", "prefill")] \
        == procs[("llama-server", "prompt")] == "llama-server:none"
    # a row that drafts from n-gram pools gets a process of its own, each round a new one
    assert procs[("llama-server", "ngram-simple")] == "llama-server:ngram-simple@0"
    assert procs[("ngramspec", "auto")] == "ngramspec#auto@0"
    assert {r.process for r in plan[0] if r.server == "ngramspec"} == {
        "ngramspec", "ngramspec#auto@0", "ngramspec#ngram-mod@0"}
    assert {r.process for r in plan[1] if r.mode == "auto"} == {"ngramspec#auto@1"}
    assert PB_starter("ngramspec#auto@1") == "ngramspec"
    assert PB_starter("llama-server:ngram-mod@2") == "llama-server:ngram-mod"
    alone = schedule(["off", "auto"], None, False, 1)
    assert [(r.server, r.mode) for r in alone[0]] == [
        ("ngramspec", "off"), ("ngramspec", "prefill"), ("ngramspec", "auto"), ("ngramspec", "oracle")]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_only_the_timed_server_runs_and_each_ends_after_its_last_row(monkeypatch):
    """run_plan with stand-in servers (sleeping processes): while a row is timed its
    process runs and every other started one is stopped; a process ends after its last
    row, and one stopped at the end is ended too. The prompt checks alternate the two
    servers request by request, one runnable at a time, the cache check in round 0."""
    import subprocess

    from ngramspec.bench import pipeline as PB
    from ngramspec.bench import prompt_checks as PC
    from ngramspec.bench import servers as S

    procs = {}  # url -> process; a row's own process gets its own url

    def starter(name):
        def start():
            p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
            url = f"http://{name}" if name not in procs else f"http://{name}/{len(procs)}"
            procs[url[7:]] = p
            return S.Started(url, p.pid, lambda: (p.terminate(), p.wait(10)))
        return start

    seen = []

    def fake_row(row, srv, docs, slots, n_predict, clients, earlier, off):
        states = {p.pid: S.process_state(p.pid) for p in procs.values() if p.poll() is None}
        seen.append((srv.pid, states))
        if row.mode == "oracle":
            assert off is not None and off.mode == "off" and off.round == 0
        return RunResult(row.server, row.mode, slots, 1.0 + len(seen), generated=10)

    urls = {f"http://{n}": n for n in ("ngramspec", "llama-server:none", "llama-server:ngram-mod")}
    asked = []

    def fake_speed(url):
        name = urls[url]
        states = {n: S.process_state(p.pid) for n, p in procs.items() if p.poll() is None}
        # running: R, S, or D (a page fault waiting on the disk, as under load)
        assert states[name] in "RSD" and all(s == "T" for n, s in states.items() if n != name)
        asked.append(name)
        return {"prompt_n": 2000, "prompt_per_second": 100.0 + len(asked)}

    monkeypatch.setattr(PB, "time_row", fake_row)
    monkeypatch.setattr(PC, "prompt_speed", fake_speed)
    monkeypatch.setattr(PC, "cache_check", lambda url: {"cache": True})
    plan = PB.schedule(["off", "auto"], ["ngram-mod"], True, 2)
    rep = PB.PipelineReport()
    starters = {n: starter(n) for n in ("ngramspec", "llama-server:none", "llama-server:ngram-mod")}
    PB.run_plan(plan, starters, [], 1, 8, rep)
    assert len(seen) == 2 * 7  # 9 rows a round, 2 of them prompt checks
    for timed, states in seen:
        assert states[timed] in "RSD"  # running (D: waiting on the disk)
        assert all(s == "T" for n, s in states.items() if n != timed), states
    assert all(p.poll() is not None for p in procs.values())
    assert rep.checks["ngramspec"]["cache"] is True  # the cache check in round 0 only
    n = PC.PROMPT_REQUESTS
    assert asked == (["ngramspec", "llama-server:none"] * n  # round 0 forward, round 1 backward
                     + ["llama-server:none", "ngramspec"] * n)
    assert rep.check_rounds == {"ngramspec": [99.0 + 2 * n, 100.0 + 4 * n],  # each one's best
                                "llama-server": [100.0 + 2 * n, 99.0 + 4 * n]}
    assert sorted({r.round for r in rep.rounds}) == [0, 1]


def test_the_median_round_keeps_round_0s_peaks_and_identical_counts_every_round():
    from ngramspec.bench.pipeline import median_run

    runs = [replace(_r("ngramspec", "off", w, i), peak_rss_mib=p)
            for i, (w, p) in enumerate([(12.0, 500.0), (10.0, 510.0), (11.0, 520.0)])]
    med = median_run(runs)
    assert (med.wall_s, med.round, med.peak_rss_mib) == (11.0, 2, 500.0)
    assert median_run(runs[:2]).wall_s == 10.0  # the lower of two
    off = _r("ngramspec", "off", 10.0)
    auto = [_r("ngramspec", "auto", 8.0, 0), _r("ngramspec", "auto", 9.0, 1,
                                                outputs={"a": [1, 2], "b": [4]})]
    rep = PipelineReport(runs=[off, auto[0]], rounds=[off, *auto])
    assert rep.identical(auto[0], off) == 1  # b differs in round 1
    assert PipelineReport(runs=[off, auto[0]]).identical(auto[0], off) == 2


def test_generation_only_subtracts_the_prefill_row_and_rounds_print_their_ratios(capsys):
    rounds = []
    for i, (ours, peer) in enumerate([(10.0, 9.0), (12.0, 12.0), (10.0, 11.0)]):
        rounds += [_r("ngramspec", "off", ours, i), _r("llama-server", "off", peer, i),
                   _r("ngramspec", "prefill", 4.0, i, generated=2),
                   _r("llama-server", "prefill", 5.0, i, generated=2),
                   _r("ngramspec", "auto", ours - 2, i), _r("llama-server", "ngram-mod", peer - 1, i)]
    rep = PipelineReport(rounds=rounds, runs=[r for r in rounds if r.round == 0])
    rep.get("ngramspec", "auto", 1).sources = {"ngram-mod": [10, 200, 150], "prediction": [1, 4, 1]}
    assert rep.gen_tok_per_s(rep.get("ngramspec", "off", 1)) == pytest.approx(318 / 6.0)
    assert rep.gen_tok_per_s(rep.get("llama-server", "off", 1)) == pytest.approx(318 / 4.0)
    assert rep.gen_tok_per_s(rep.get("ngramspec", "prefill", 1)) is None
    assert rep.per_round(1, lambda rs: len(rs)) == [6, 6, 6]
    _print_pipeline(rep, [1], 2, 160)
    out = " ".join(capsys.readouterr().out.split())
    assert "median of 3 interleaved rounds" in out
    assert ("the default's drafts per source: ngram-mod 10 drafts, 200 tokens, 150 accepted "
            "(75%); prediction 1 drafts, 4 tokens, 1 accepted (25%)") in out
    # 9/10, 12/12, 11/10 in tok/s terms
    assert "spec-off vs llama-server spec-off 0.90x, 1.00x, 1.10x (median 1.00x)" in out
    assert "prompts only (the prefill rows) 1.25x, 1.25x, 1.25x" in out
    assert "prefill" not in out.split("┃ peak RSS")[1].split("1 slot(s)")[0]  # not a table row


def test_a_fixed_policy_mode_runs_the_fixed_policy():
    """A `TYPE:POLICY` row's server is started so that its engine takes POLICY: the default
    spec type (auto) would turn --draft-policy fixed into the cost policy."""
    from ngramspec.bench.pipeline import mode_body, policy_args, server_of
    from ngramspec.server.command import serve
    from ngramspec.settings.typed import typed
    from ngramspec.settings import click_options

    args = policy_args(["-t", "2"], "fixed")
    values = dict(serve.make_context("serve", args, obj={}).params)
    click_options.pop_unused(values)
    spec = typed(values, serve=True).server.spec
    assert spec.policy == "fixed" and spec.types == ()
    assert server_of("ngram-mod:fixed") == "ngramspec:fixed"
    assert mode_body("ngram-mod:fixed") == {"speculative": {"type": "ngram-mod"}}
