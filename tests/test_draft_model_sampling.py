"""Seeded sampling with speculation on the real model: the n-gram drafters and the
draft model (the embedded model drafting for itself, as llama.cpp's
test_speculative swaps it in) give spec-off's tokens and logit rows; a request's draft
p_min does what llama-server does.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from ngramspec import NgramModParams, SpecConfig
from ngramspec.engine.generate import generate
from ngramspec.settings.sampling import SamplingParams

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parent.parent
VARIED = [line.replace("\\n", "\n") for line in
          (ROOT / "tests" / "data" / "prompts.txt").read_text().splitlines() if line.strip()]
N = 40
OFF = SpecConfig(types=())
NGRAMS = SpecConfig(types=("ngram-simple", "ngram-mod"),
                    ngram_mod=NgramModParams(n_match=8, n_min=2, n_max=64))
LLAMA_TEST = SamplingParams(temperature=0.2, top_k=5, seed=4242)  # test_with_and_without_draft
WARM = SamplingParams(temperature=0.9, top_k=40, seed=7)


@pytest.fixture(scope="module")
def draft(model, threads):
    from ngramspec.speculative.draft_model import DraftModelDrafter
    from ngramspec.llama.context import Context, ContextParams

    dctx = Context(model, ContextParams(n_ctx=4096, n_threads=threads, batch_invariant=False))
    return DraftModelDrafter(model, dctx, n_max=8)


def _logged(logit_log, before: set) -> list[str]:
    """The logit-row hashes of the one Sampler created since `before`."""
    new = [k for k in logit_log if k not in before]
    assert len(new) == 1
    return logit_log[new[0]]


def run(engine, prompt, sampling, logit_log, speculative=True, n=N):
    before = set(logit_log)
    r = generate(engine, prompt, sampling, n_predict=n, speculative=speculative)
    return r, _logged(logit_log, before)


@pytest.mark.parametrize("sampling", [LLAMA_TEST, WARM], ids=["llama-test", "warm"])
@pytest.mark.parametrize("drafter", ["ngrams", "draft-model"])
def test_seeded_sampling_spec_on_equals_spec_off(make_engine, draft, logit_log, sampling, drafter):
    """Every verified row is sampled in order with the same chain and RNG, and the rows
    after the first rejection are never sampled: the RNG sees exactly spec-off's calls."""
    prompt = VARIED[0]
    off, off_rows = run(make_engine(OFF), prompt, sampling, logit_log, speculative=False)
    eng = (make_engine(NGRAMS) if drafter == "ngrams"
           else make_engine(OFF, draft_drafter=draft))
    on, on_rows = run(eng, prompt, sampling, logit_log)
    assert on.final.draft_n > 0
    assert on.tokens == off.tokens and on_rows == off_rows
    again, _ = run(eng, prompt, sampling, logit_log)
    assert again.tokens == on.tokens  # the seed makes the run repeatable


def test_request_p_min_stops_the_draft_model(make_engine, draft, logit_log):
    """speculative.p_min (a request's draft_p_min) applies to that sequence only."""
    prompt = VARIED[13]
    eng = make_engine(OFF, draft_drafter=draft)
    greedy = SamplingParams(temperature=0.0)
    base, _ = run(eng, prompt, greedy, logit_log, n=16)
    eng = make_engine(SpecConfig(types=(), draft_p_min=1.0), draft_drafter=draft)
    strict, _ = run(eng, prompt, greedy, logit_log, n=16)
    assert base.final.draft_n > 0 and strict.final.draft_n == 0
    assert strict.tokens == base.tokens
    eng = make_engine(OFF, draft_drafter=draft)
    again, _ = run(eng, prompt, greedy, logit_log, n=16)
    assert again.final.draft_n == base.final.draft_n  # the override went with its sequence
