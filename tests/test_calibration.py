"""Start-up calibration on the real model: never a full re-measurement once a curve is
cached, its time reported, and the run's own decodes refine the curve."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ngramspec import SpecConfig

pytestmark = pytest.mark.model

REPEAT = "The quick brown fox jumps over the lazy dog. " * 12


def _load(threads):
    from ngramspec.runtime import load_engine

    return load_engine(None, None, n_ctx=1024, threads=threads,
                       spec=SpecConfig(types=("auto",), policy="cost"))


def test_second_start_reuses_the_cache_without_rewriting_it(threads, tmp_path, monkeypatch):
    from ngramspec.cost import cache_path

    monkeypatch.setenv("NGRAMSPEC_CACHE_DIR", str(tmp_path))
    first = _load(threads).calibration
    assert first.source == "measured"
    written = cache_path().read_bytes()
    for _ in range(2):
        again = _load(threads).calibration
        assert again.source in ("cache", "cache+probes")
        assert again.seconds < 1.0, again
    assert cache_path().read_bytes() == written


def test_a_slower_machine_is_picked_up_within_a_run(threads):
    """Every decode made 8 ms slower after the start (a neighbour on the CPU): within one
    generation the policy's curve prices a step that much higher, from the run's own
    decodes (no re-measurement)."""
    from ngramspec.generate import generate
    from ngramspec.sampling import SamplingParams

    engine = _load(threads)
    t1 = engine.policy.cost.t(1)
    real = engine.ctx.decode

    def slow(entries, *a, **kw):
        rows = real(entries, *a, **kw)
        time.sleep(0.008)
        return rows

    engine.ctx.decode = slow
    generate(engine, "Describe a walk through a city market in the early morning.",
             SamplingParams(temperature=0), n_predict=64)
    assert engine.policy.cost.t(1) > t1 + 0.005, (t1, engine.policy.cost.t(1))


def test_generate_reports_the_calibration_time(threads):
    p = subprocess.run([sys.executable, "-m", "ngramspec", "generate", "-p", REPEAT, "-n", "8",
                        "--temp", "0", "-t", str(threads), "-c", "512", "--json"],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert p.returncode == 0, p.stderr[-2000:]
    cal = json.loads(p.stdout)["calibration"]
    assert cal["source"] in ("measured", "cache", "cache+probes") and cal["seconds"] > 0
    assert "decode-cost calibration:" in p.stderr
