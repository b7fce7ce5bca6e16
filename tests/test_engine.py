"""The speculative engine on the real embedded model.

Exactness: greedy speculative output must equal spec-off output token for token.
The default run samples the sweep (every spec type, draft lengths 1, 3, 8, 64 on
the fixture prompts and 20 varied prompts); `-m slow` sweeps every draft length.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ngramspec import SPEC_TYPES, NgramModParams, SpecConfig
from ngramspec.engine.generate import generate
from ngramspec.errors import ConfigError
from ngramspec.llama.model import ContextOverflow
from ngramspec.settings.grammar import json_grammar
from ngramspec.settings.sampling import SamplingParams

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = sorted((ROOT / "ngramspec" / "bench" / "fixtures" / "prompts").glob("*.txt"))
VARIED = [line.replace("\\n", "\n") for line in
          (ROOT / "tests" / "data" / "prompts.txt").read_text().splitlines() if line.strip()]
GREEDY = SamplingParams(temperature=0.0)
N = 48  # tokens per exactness run in the default suite


def spec(types, draft_max=None):
    """A config whose drafters fire on short repeats too (n-gram sizes scaled down)."""
    return SpecConfig(types=types, draft_max=draft_max,
                      ngram_mod=NgramModParams(n_match=8, n_min=2, n_max=64))


def _tokens(make_engine, prompt, cfg, n=N):
    return generate(make_engine(cfg), prompt, GREEDY, n_predict=n).tokens


@pytest.fixture(scope="module")
def baseline(make_engine):
    """Spec-off greedy tokens per prompt (computed once)."""
    cache = {}

    def get(prompt, n=N):
        if (prompt, n) not in cache:
            cache[(prompt, n)] = _tokens(make_engine, prompt, SpecConfig(types=()), n)
        return cache[(prompt, n)]

    return get


ALL_PROMPTS = [p.read_text() for p in FIXTURES] + VARIED


@pytest.mark.model
@pytest.mark.parametrize("draft_max", [1, 3, 8, 64])
@pytest.mark.parametrize("spec_type", SPEC_TYPES)
def test_greedy_speculative_equals_spec_off(make_engine, baseline, spec_type, draft_max):
    # each (type, length) pair sees a rotating share of the prompts; together all of them
    k = SPEC_TYPES.index(spec_type) * 4 + [1, 3, 8, 64].index(draft_max)
    prompts = ALL_PROMPTS[k % 4::4][:6] + ([p.read_text() for p in FIXTURES][:1])
    for prompt in prompts:
        want = baseline(prompt)
        got = _tokens(make_engine, prompt, spec((spec_type,), draft_max))
        assert got == want, (spec_type, draft_max, prompt[:60])


@pytest.mark.model
def test_speculation_actually_drafts_on_repetitive_text(make_engine, baseline):
    prompt = VARIED[0]
    r = generate(make_engine(spec(("ngram-simple", "ngram-mod"))), prompt, GREEDY, n_predict=N)
    assert r.final.draft_n > 0 and r.final.draft_n_accepted > 0
    assert r.final.steps < N - 1
    assert r.tokens == baseline(prompt)


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.parametrize("spec_type", SPEC_TYPES)
def test_exactness_every_draft_length(make_engine, baseline, spec_type):
    for draft_max in range(1, 65):
        for prompt in ALL_PROMPTS:
            assert _tokens(make_engine, prompt, spec((spec_type,), draft_max), 96) == \
                baseline(prompt, 96), (spec_type, draft_max, prompt[:60])


@pytest.mark.model
def test_json_grammar_output_parses_with_speculation(make_engine):
    prompt = 'A JSON object describing a cat, with "name" and "age":\n'
    cfg = spec(("ngram-mod", "ngram-simple"))
    p = SamplingParams(temperature=0.0, grammar=json_grammar())
    r = generate(make_engine(cfg), prompt, p, n_predict=200)
    assert r.final.finish_reason == "stop", r.text
    json.loads(r.text)
    off = generate(make_engine(SpecConfig(types=())), prompt, p, n_predict=200)
    assert off.tokens == r.tokens


@pytest.mark.model
def test_sampling_with_seed_is_reproducible_and_matches_spec_off(make_engine):
    prompt = VARIED[2]
    p = SamplingParams(temperature=0.8, seed=1234)
    a = generate(make_engine(spec(("ngram-mod",))), prompt, p, n_predict=40).tokens
    b = generate(make_engine(spec(("ngram-mod",))), prompt, p, n_predict=40).tokens
    assert a == b
    off = generate(make_engine(SpecConfig(types=())), prompt, p, n_predict=40).tokens
    assert a == off


@pytest.mark.model
def test_stops_at_n_predict_and_reports_timings(make_engine):
    r = generate(make_engine(spec(("ngram-simple",))), VARIED[0], GREEDY, n_predict=10)
    assert len(r.tokens) == 10 and r.final.finish_reason == "length"
    t = r.final.timings()
    assert t["predicted_n"] == 10 and t["prompt_n"] > 0 and t["predicted_ms"] > 0


@pytest.mark.model
def test_stop_strings_cut_the_text(make_engine):
    r = generate(make_engine(SpecConfig(types=())), VARIED[2], GREEDY, n_predict=40,
                 stop=["Thursday"])
    assert "Thursday" not in r.text and r.final.finish_reason == "stop"


@pytest.mark.model
def test_prompt_longer_than_context_is_a_clear_error(make_engine):
    eng = make_engine(SpecConfig(types=()), n_ctx=64)
    with pytest.raises(ContextOverflow, match="raise -c/--ctx-size") as e:
        generate(eng, "word " * 600, GREEDY, n_predict=4)
    assert e.value.n_ctx == eng.ctx.n_ctx and e.value.n_prompt_tokens > eng.ctx.n_ctx


@pytest.mark.model
def test_bad_grammar_and_empty_prompt_are_config_errors(make_engine):
    eng = make_engine(SpecConfig(types=()))
    with pytest.raises(ConfigError, match="invalid grammar"):
        generate(eng, "x", SamplingParams(grammar="root ::= ("), n_predict=4)
    with pytest.raises(ConfigError, match="empty"):
        generate(eng, [], GREEDY, n_predict=4)


def _chi2_sf(x: float, df: int) -> float:
    """Upper tail of chi-square (Wilson-Hilferty normal approximation)."""
    import math

    if df <= 0:
        return 1.0
    z = ((x / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


@pytest.mark.model
def test_speculative_sampling_preserves_the_target_distribution(make_engine):
    # temperature 1, 60 seeds: the token right after the first verified draft has the
    # same distribution with speculation on and off (chi-square homogeneity test)
    prompt = VARIED[0]
    p_pos = 4
    on_counts, off_counts, drafted = {}, {}, 0
    for seed in range(60):
        p = SamplingParams(temperature=1.0, top_k=40, top_p=1.0, min_p=0.0, seed=seed)
        on = generate(make_engine(spec(("ngram-mod", "ngram-simple"))), prompt, p, n_predict=6)
        off = generate(make_engine(SpecConfig(types=())), prompt, p, n_predict=6)
        drafted += on.final.draft_n > 0
        if len(on.tokens) > p_pos and len(off.tokens) > p_pos:
            on_counts[on.tokens[p_pos]] = on_counts.get(on.tokens[p_pos], 0) + 1
            off_counts[off.tokens[p_pos]] = off_counts.get(off.tokens[p_pos], 0) + 1
    assert drafted >= 30  # speculation really happened in most runs
    cats = sorted(set(on_counts) | set(off_counts))
    n_on, n_off = sum(on_counts.values()), sum(off_counts.values())
    chi2 = 0.0
    for c in cats:
        a, b = on_counts.get(c, 0), off_counts.get(c, 0)
        for obs, n in ((a, n_on), (b, n_off)):
            exp = (a + b) * n / (n_on + n_off)
            chi2 += (obs - exp) ** 2 / exp
    assert _chi2_sf(chi2, len(cats) - 1) > 0.01, (on_counts, off_counts)


@pytest.mark.model
def test_draft_model_drafts_when_ngrams_have_nothing(model, make_engine, threads):
    # the embedded model as its own draft model: n-gram chain first, draft model after;
    # greedy output is unchanged and the draft model's drafts are all accepted
    from ngramspec.speculative.draft_model import DraftModelDrafter
    from ngramspec.llama.context import Context, ContextParams

    dctx = Context(model, ContextParams(n_ctx=4096, n_threads=threads))
    dd = DraftModelDrafter(model, dctx, n_max=4)
    eng = make_engine(spec(("ngram-simple",)), draft_drafter=dd)
    prompt = VARIED[13]  # little repetition: the n-gram drafter rarely fires
    r = generate(eng, prompt, GREEDY, n_predict=24)
    stats = eng.stats()["draft-model"]
    assert stats.n_gen_drafts > 0 and stats.n_acc_tokens >= 0.8 * stats.n_gen_tokens
    off = generate(make_engine(SpecConfig(types=())), prompt, GREEDY, n_predict=24)
    assert r.tokens == off.tokens


def test_draft_model_with_another_vocabulary_is_refused():
    # vocabulary check on two stand-in models with different sizes / pieces
    from types import SimpleNamespace

    from ngramspec.speculative.draft_model import check_same_vocab
    from ngramspec.llama.model import ModelError

    def fake(n, salt=b""):
        return SimpleNamespace(n_vocab=n, path=f"m{n}{salt!r}.gguf",
                               vocab_fingerprint=lambda: (n, salt))

    with pytest.raises(ModelError, match="vocabulary of 100 tokens"):
        check_same_vocab(fake(200), fake(100))
    with pytest.raises(ModelError, match="different vocabulary"):
        check_same_vocab(fake(200), fake(200, b"x"))
    check_same_vocab(fake(200), fake(200))


@pytest.mark.model
def test_logit_rows_are_llama_cpps_rows_after_every_decode(make_engine):
    """`Context.logits_at` hands out one numpy view per buffer address (logit_rows.py):
    after each of several decodes of different widths, every row it gives equals the
    row llama.cpp's own accessor gives, so a reused view never shows a stale row."""
    import numpy as np
    from ngramspec.llama.backend import _llama

    eng = make_engine(SpecConfig(types=()))
    ctx, lc = eng.ctx, _llama()
    ctx.clear(0)
    toks = eng.model.tokenize("The quick brown fox jumps over the lazy dog.")
    ctx.decode([(0, toks[:4], 0, False)])
    for width in (3, 1, 5, 2):
        pos = len(toks[:4])
        rows = ctx.decode([(0, toks[4:4 + width], pos, True)])[0]
        for i in rows:
            raw = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx.ptr, i), shape=(ctx.n_vocab,))
            assert np.array_equal(ctx.logits_at(i), raw)
            assert ctx.argmax_at(i) == int(np.argmax(raw))
        ctx.truncate(0, pos)
    ctx.clear(0)
