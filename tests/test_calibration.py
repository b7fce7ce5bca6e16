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
OPEN = "Describe a walk through a city market in the early morning."


def _load(threads):
    from ngramspec.engine.runtime import load_engine
    from ngramspec.settings.engine import EngineSettings

    return load_engine(EngineSettings(n_ctx=1024, threads=threads,
                                      spec=SpecConfig(types=("auto",), policy="cost")))


def test_no_start_blocks_and_the_cache_is_written_once(threads, tmp_path, monkeypatch):
    """First start: nothing measured (the default curve); the curve the run learns is
    cached after CostPolicy.SAVE_AFTER decodes, once it has seen verifies (a repeating
    text: drafts from the start); later starts reuse it and never rewrite it."""
    from ngramspec.speculative.cost import cache_path
    from ngramspec.engine.generate import generate
    from ngramspec.settings.sampling import SamplingParams

    from ngramspec.speculative.policy import CostPolicy

    monkeypatch.setenv("NGRAMSPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(CostPolicy, "SAVE_AFTER", 8)  # a short generation is enough here
    engine = _load(threads)
    assert engine.calibration.source == "default" and engine.calibration.seconds < 0.1
    assert not cache_path().exists()
    generate(engine, REPEAT, SamplingParams(temperature=0), n_predict=400)
    assert engine.policy.tracker.n_observed >= engine.policy.SAVE_AFTER
    assert engine.policy.tracker.slope_seen()
    written = cache_path().read_bytes()
    for _ in range(2):
        again = _load(threads).calibration
        assert again.source == "cache" and again.seconds < 0.1, again
    assert cache_path().read_bytes() == written


def test_a_slower_machine_is_picked_up_within_a_run(threads):
    """Every decode made 8 ms slower after the start (a neighbour on the CPU): within one
    generation the policy's curve predicts what the steps now take, from the run's own
    decodes (no re-measurement)."""
    import numpy as np

    from ngramspec.engine.generate import generate
    from ngramspec.settings.sampling import SamplingParams

    engine = _load(threads)
    real, took = engine.ctx.decode, []

    def slow(entries, *a, **kw):  # the device's compute takes 8 ms longer
        t0 = time.perf_counter()
        rows = real(entries, *a, **kw)
        time.sleep(0.008)
        engine.ctx.compute_s += 0.008
        took.append(time.perf_counter() - t0)
        return rows

    engine.ctx.decode = slow
    engine.fold = None  # every step through ctx.decode (a folded run calls llama_decode in C)
    generate(engine, OPEN, SamplingParams(temperature=0), n_predict=96, speculative=False)
    now = float(np.median(took[-32:]))  # 1-token steps at ~60-110 cells
    assert engine.policy.cost.t(1, 90) == pytest.approx(now, rel=0.2), (now, engine.policy.cost)


def test_generate_reports_the_calibration_time(threads):
    """`--json` has it as `calibration`; the statistics lines as `decode-cost calibration:`."""
    def run(*extra):
        p = subprocess.run([sys.executable, "-m", "ngramspec", "generate", "-p", REPEAT, "-n", "8",
                            "--temp", "0", "-t", str(threads), "-c", "512", *extra],
                           capture_output=True, text=True, timeout=300, env=dict(os.environ))
        assert p.returncode == 0, p.stderr[-2000:]
        return p

    cal = json.loads(run("--json").stdout)["calibration"]
    assert cal["source"] in ("default", "cache") and 0 <= cal["seconds"] < 0.1
    assert "decode-cost calibration:" in run().stderr


def test_a_curve_that_never_saw_a_verify_is_not_cached(threads, tmp_path, monkeypatch):
    """An open prompt at SAVE_AFTER decodes whose tracker has seen no multi-row verify
    (probes are budgeted, so few): the scaled prior's guess is not written to the cache."""
    from ngramspec.engine.generate import generate
    from ngramspec.settings.sampling import SamplingParams
    from ngramspec.speculative.cost import cache_path
    from ngramspec.speculative.policy import CostPolicy

    monkeypatch.setenv("NGRAMSPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(CostPolicy, "SAVE_AFTER", 24)
    engine = _load(threads)
    generate(engine, OPEN, SamplingParams(temperature=0), n_predict=60)
    assert engine.policy.tracker.n_observed >= 24
    assert cache_path().exists() == engine.policy.tracker.slope_seen()
