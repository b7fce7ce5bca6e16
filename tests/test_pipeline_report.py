"""`bench --parallel`'s report: the ratios and the peak resident memory it prints come
from the runs it was given (hand-written runs, no servers)."""
from __future__ import annotations

import os
import sys

import pytest

from ngramspec.cli import _print_pipeline
from ngramspec.pipeline_bench import PipelineReport, RunResult
from ngramspec.server.launch import status_kib


def _run(server, mode, wall, peak):
    return RunResult(server, mode, 1, wall, outputs={"a": [1, 2], "b": [3]}, generated=320,
                     peak_rss_mib=peak)


def test_the_report_prints_peak_rss_beside_llama_servers(capsys):
    rep = PipelineReport(runs=[_run("ngramspec", "off", 10.0, 900.0),
                               _run("ngramspec", "auto", 8.0, 950.0),
                               _run("llama-server", "off", 9.0, 800.0),
                               _run("llama-server", "ngram-mod", 8.5, 810.0)])
    _print_pipeline(rep, [1], 2, 160)
    out = capsys.readouterr().out
    assert "peak RSS spec-off 900 vs llama-server 800 MiB (1.12x)" in out
    assert "vs llama-server's best (ngram-mod) 1.06x" in out  # 40.0 / 37.6 tok/s
    assert "1.25x its spec-off" in out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_status_kib_reads_this_process_and_tolerates_a_gone_one():
    assert status_kib(os.getpid(), "VmHWM") >= status_kib(os.getpid()) > 0
    assert status_kib(2 ** 22 + 12345, "VmHWM") == 0
