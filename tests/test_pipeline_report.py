"""`bench --parallel`'s report: the ratios and the peak resident memory it prints come
from the runs it was given (hand-written runs, no servers)."""
from __future__ import annotations

import mmap
import os
import sys

import pytest

from ngramspec.cli import _print_pipeline
from ngramspec.pipeline_bench import PipelineReport, RunResult
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
