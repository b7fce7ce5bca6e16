"""Auto where a decode is fast (SmolLM2 cut to 4 blocks, ~1.6 ms a step on 2 cores):
exact at 1 and 4 slots, and a planner that learns this backend's costs from the run
(scaled prior, probes) instead of declining every draft under the 2-core prior."""
from __future__ import annotations

from pathlib import Path

import pytest

from ngramspec import SpecConfig
from ngramspec.engine.generate import generate
from ngramspec.settings.sampling import SamplingParams

pytestmark = pytest.mark.model
FIXTURES = Path(__file__).resolve().parents[1] / "ngramspec" / "bench" / "fixtures" / "prompts"
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def fast(fast_model_path, threads, tmp_path_factory):
    import os

    from ngramspec.engine.runtime import load_engine
    from ngramspec.settings.engine import EngineSettings

    os.environ["NGRAMSPEC_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))  # a cold start
    return load_engine(EngineSettings(model=fast_model_path, threads=threads, n_ctx=2048,
                                      spec=SpecConfig(types=("auto",), policy="cost")))


@pytest.mark.parametrize("fixture", ["story", "refactor"])
def test_auto_equals_spec_off_and_drafts_on_a_fast_decode(fast, fixture):
    """From a cold cost cache (the 2-core prior, ~8x too dear here) auto drafts and
    gives spec-off's tokens; the curve it learnt prices a one-token decode near what
    this machine's decodes take, not the prior's."""
    from ngramspec.engine.runtime import engine_on

    prompt = (FIXTURES / f"{fixture}.txt").read_text()
    fast.ctx.clear()
    off = generate(engine_on(fast.model, fast.ctx, SpecConfig(types=())), prompt, GREEDY, 200,
                   speculative=False)
    fast.ctx.clear()
    eng = engine_on(fast.model, fast.ctx, SpecConfig(types=("auto",), policy="cost"), None,
                    fast.calibration, keep_refined=False)
    auto = generate(eng, prompt, GREEDY, 200)
    assert auto.tokens == off.tokens
    assert auto.final.draft_n > 0
    learnt = eng.policy.cost.t(1, 300)
    assert learnt < 0.5 * fast.calibration.cost.t(1, 300)
    assert eng.host_s > 0 and eng.n_steps == auto.final.steps


def test_four_slots_equal_one_slot_spec_off(fast_model_path, threads):
    """Held-out documents through `serve -np 4` on the fast model: auto and every fixed
    type give what one slot gives with speculation off."""
    from ngramspec.bench.corpus import documents
    from ngramspec.bench.pipeline import run_ngramspec

    docs = documents(4, 2, 2)
    (ref,) = run_ngramspec(docs, 1, ["off"], 96, threads, 2048, fast_model_path)
    runs = run_ngramspec(docs, 4, ["auto", "ngram-mod", "ngram-simple", "off"], 96, threads,
                         2048, fast_model_path)
    for r in runs:
        differ = [d.id for d in docs if r.outputs[d.id] != ref.outputs[d.id]]
        assert not differ, f"4 slots, {r.mode}: {differ}"
    assert any(r.drafted for r in runs if r.mode == "auto")
