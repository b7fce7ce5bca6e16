"""Seeded sampling with speculation on the real model: the n-gram drafters and the
draft model (the embedded model drafting for itself, as llama.cpp's
test_speculative swaps it in) give spec-off's tokens and logit rows; synthetic
acceptance (--spec-synth-rates) and a request's draft p_min do what llama-server does.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from ngramspec import NgramModParams, SpecConfig
from ngramspec.engine import synth
from ngramspec.engine.generate import generate
from ngramspec.engine.sampling import SamplingParams

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


def test_synthetic_rate_zero_gives_spec_off_tokens(make_engine, draft, logit_log):
    """llama.cpp's test_with_and_without_draft (third part): every draft rejected."""
    prompt = "I believe the meaning of life is"
    off, _ = run(make_engine(OFF), prompt, LLAMA_TEST, logit_log, speculative=False, n=16)
    eng = make_engine(OFF, draft_drafter=draft)
    eng.synth = synth.conditional(synth.resolve_rates(None, [0.0] * 8, 8))
    on, _ = run(eng, prompt, LLAMA_TEST, logit_log, n=16)
    assert on.final.draft_n > 0 and on.final.draft_n_accepted == 0
    assert on.tokens == off.tokens


def test_synthetic_rates_are_seeded_and_rate_one_accepts_all(make_engine, draft, logit_log):
    prompt = VARIED[3]
    eng = make_engine(OFF, draft_drafter=draft)
    eng.synth = synth.conditional([0.75 ** (i + 1) for i in range(8)])
    a, _ = run(eng, prompt, LLAMA_TEST, logit_log, n=32)
    b, _ = run(eng, prompt, LLAMA_TEST, logit_log, n=32)
    assert a.final.draft_n > 0 and a.final.draft_n_accepted < a.final.draft_n
    assert (a.tokens, a.final.draft_n, a.final.draft_n_accepted) == \
        (b.tokens, b.final.draft_n, b.final.draft_n_accepted)
    eng.synth = synth.conditional([1.0] * 8)
    c, _ = run(eng, prompt, SamplingParams(temperature=0.0), logit_log, n=32)
    assert c.final.draft_n > 0 and c.final.draft_n_accepted == c.final.draft_n


def test_synthetic_rates_resolve_as_llama_server():
    assert synth.resolve_rates(None, None, 8) == ()
    rates = synth.resolve_rates(3.0, None, 4)
    assert abs(1 + sum(rates) - 3.0) < 1e-9 and all(b < a for a, b in zip(rates, rates[1:]))
    assert synth.resolve_rates(5.0, None, 4) == (1.0,) * 4
    assert synth.conditional((0.8, 0.4, 0.0, 0.0)) == (0.8, 0.5, 0.0, 0.0)
    for bad in [(3.0, [0.5] * 4, 4), (None, [0.5, 0.6], 2), (None, [0.5], 2), (0.5, None, 4),
                (None, [0.5], 0)]:
        with pytest.raises(synth.ConfigError):
            synth.resolve_rates(*bad)


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
