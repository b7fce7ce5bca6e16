"""llama-server's other samplers (issue 25): DRY, XTC, typical, top-n-sigma, mirostat 1
and 2, dynamic temperature and the sampler order. Each one is applied (the candidates
it leaves differ from the default chain's on a real row), and with a fixed seed the
speculative output equals the spec-off output, alone and at four slots."""
from __future__ import annotations

import pytest

from ngramspec import NgramModParams, SpecConfig
from ngramspec.errors import ConfigError
from ngramspec.engine.generate import stream_generate
from ngramspec.engine.sampling import Sampler
from ngramspec.settings.sampling import DEFAULT_ORDER, SamplingParams, order_string, parse_order
from together import run_together

OFF = SpecConfig(types=())
ON = SpecConfig(types=("ngram-simple", "ngram-mod"),
                ngram_mod=NgramModParams(n_match=8, n_min=2, n_max=64))
PROMPT = ("def area(w, h):\n    return w * h\n\n" * 4
          + "Rewrite the function above with type hints and a docstring:\n")
N = 40
#: one setting per sampler, strong enough to matter on a 270M model
SETTINGS = {
    "dry": dict(dry_multiplier=0.8, dry_allowed_length=1),
    "xtc": dict(xtc_probability=1.0, xtc_threshold=0.05),
    "typical": dict(typical_p=0.3),
    "top_n_sigma": dict(top_n_sigma=0.5),
    "mirostat1": dict(mirostat=1, mirostat_tau=3.0),
    "mirostat2": dict(mirostat=2, mirostat_tau=3.0),
    "dynatemp": dict(dynatemp_range=0.7, dynatemp_exponent=2.0),
    "order": dict(samplers=("temperature", "top_k", "top_p", "min_p")),
}


def test_order_names_aliases_and_letters():
    assert parse_order("edskypmxt") == DEFAULT_ORDER
    assert order_string(DEFAULT_ORDER) == "edskypmxt"
    assert parse_order(["Top-K", "nucleus", "typical_p", "minp", "temp"]) == \
        ("top_k", "top_p", "typ_p", "min_p", "temperature")
    assert parse_order("dry;top_k;temperature") == ("dry", "top_k", "temperature")
    with pytest.raises(ConfigError, match="unknown sampler 'mystery'"):
        parse_order(["top_k", "mystery"])


@pytest.mark.parametrize("bad", [dict(xtc_probability=1.5), dict(xtc_threshold=-0.1),
                                 dict(mirostat=3), dict(dry_allowed_length=-1),
                                 dict(dry_penalty_last_n=-2), dict(min_keep=-1),
                                 dict(typical_p=float("nan")), dict(samplers=("top_q",)),
                                 dict(dry_sequence_breakers=("",))])
def test_out_of_range_settings_are_refused(bad):
    with pytest.raises(ConfigError):
        SamplingParams(**bad)


def test_flags_set_the_samplers():
    from ngramspec.settings import flags
    from ngramspec.settings.typed import typed

    kw = flags.defaults("generate")
    kw.update(dry_multiplier=0.5, dry_base=0.5, dry_sequence_breaker=("\n", "none"),
              mirostat=2, mirostat_tau=4.0, sampler_seq="kt", typical_p=0.9)
    sp = typed(kw).sampling
    assert (sp.dry_multiplier, sp.dry_base, sp.dry_sequence_breakers) == (0.5, 1.75, ("\n",))
    assert (sp.mirostat, sp.mirostat_tau, sp.typical_p) == (2, 4.0, 0.9)
    assert sp.samplers == ("top_k", "temperature")
    kw = flags.defaults("generate")
    kw.update(samplers="top_k;min_p", sampler_seq="kt")
    with pytest.raises(ConfigError, match="only one of --samplers and --sampler-seq"):
        typed(kw).sampling


def _candidates(ctx, row: int, sp: SamplingParams, prompt=()) -> tuple:
    """The top (token, probability) candidates the chain of `sp` leaves at `row`."""
    s = Sampler(ctx, SamplingParams(**{**sp.__dict__, "n_probs": 8, "post_sampling_probs": True}),
                prompt)
    try:
        s.sample(row)
        probs = s.take_probs()[0]
        return tuple((t, round(p, 4)) for t, p in probs.top)
    finally:
        s.close()


@pytest.mark.model
def test_each_sampler_changes_the_distribution(make_engine):
    """Not ignored: on one real row (after a repetitive prompt, so DRY has something to
    penalize), each setting leaves other candidates or probabilities than the default."""
    engine = make_engine(OFF)
    ctx = engine.ctx
    toks = engine.model.tokenize(PROMPT + "def area(w, h):\n    return")
    ctx.clear(0)
    rows = ctx.decode([(0, toks[:63], 0, False)])
    for p in range(63, len(toks), 63):
        rows = ctx.decode([(0, toks[p:p + 63], p, p + 63 >= len(toks))])
    row = rows[-1][-1]
    base = SamplingParams(temperature=1.5, seed=3, top_k=0, top_p=0.9, min_p=0.0)
    unset = SamplingParams()
    for name, setting in SETTINGS.items():
        sp = SamplingParams(**{**base.__dict__, **setting})
        without = SamplingParams(**{**sp.__dict__, **{k: getattr(unset, k) for k in setting}})
        # DRY penalizes what the sequence holds: both are given the prompt, as llama-server
        prompt = toks if name == "dry" else ()
        assert _candidates(ctx, row, sp, prompt) != _candidates(ctx, row, without, prompt), name
    ctx.clear(0)


def _tokens(engine, sp, speculative):
    rs = list(stream_generate(engine, PROMPT, sp, N, speculative))
    return [t for r in rs for t in r.tokens], rs[-1]


@pytest.mark.model
@pytest.mark.parametrize("name", list(SETTINGS))
def test_fixed_seed_speculative_output_equals_spec_off(make_engine, name):
    sp = SamplingParams(temperature=0.8, seed=21, **SETTINGS[name])
    off, _ = _tokens(make_engine(OFF), sp, False)
    on, final = _tokens(make_engine(ON), sp, True)
    assert on == off
    default, _ = _tokens(make_engine(OFF), SamplingParams(temperature=0.8, seed=21), False)
    if name not in ("typical", "top_n_sigma", "order"):  # these may keep a confident text
        assert off != default, name


@pytest.mark.model
def test_greedy_with_samplers_that_move_the_top_token_is_exact(make_engine):
    """temperature 0 with DRY and XTC (which can remove the top token): spec-on equals
    spec-off, and differs from plain greedy."""
    sp = SamplingParams(temperature=0.0, seed=5, dry_multiplier=1.5, dry_allowed_length=1,
                        xtc_probability=0.5, xtc_threshold=0.1)
    off, _ = _tokens(make_engine(OFF), sp, False)
    on, _ = _tokens(make_engine(ON), sp, True)
    plain, _ = _tokens(make_engine(OFF), SamplingParams(temperature=0.0), False)
    assert on == off and off != plain


@pytest.mark.model
def test_four_slots_with_different_samplers_equal_each_alone(make_engine):
    prompts = [PROMPT, "Write a short poem about the sea.\n",
               "List the days of the week, one per line:\n", PROMPT.replace("area", "volume")]
    params = [SamplingParams(temperature=0.8, seed=31, **SETTINGS["dry"]),
              SamplingParams(temperature=0.9, seed=32, **SETTINGS["mirostat2"]),
              SamplingParams(temperature=0.7, seed=33, **SETTINGS["xtc"]),
              SamplingParams(temperature=0.8, seed=34, **SETTINGS["dynatemp"], typical_p=0.9)]
    alone = [[t for r in stream_generate(make_engine(OFF), p, sp, N, False) for t in r.tokens]
             for p, sp in zip(prompts, params)]
    eng = make_engine(ON, n_seq=4, n_ctx=4 * 1024)
    toks, states = run_together(eng, [eng.model.tokenize(p) for p in prompts], params, N)
    assert toks == alone and sum(st.draft_n for st in states) > 0


def test_ignore_eos_and_logit_bias_flags():
    from ngramspec.settings.typed import typed
    from ngramspec.settings import flags

    kw = flags.defaults("generate")
    kw.update(ignore_eos=True, logit_bias=("15043+1", "7-inf", "9 - 2.5"))
    sp = typed(kw).sampling
    assert sp.ignore_eos and sp.logit_bias == ((15043, 1.0), (7, float("-inf")), (9, -2.5))
    kw = flags.defaults("generate")
    kw.update(logit_bias=("hello+1",))
    with pytest.raises(ConfigError, match="TOKEN"):
        typed(kw).sampling


@pytest.mark.model
def test_a_bias_outside_the_vocabulary_is_an_error(make_engine):
    engine = make_engine(OFF)
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        Sampler(engine.ctx, SamplingParams(logit_bias=((engine.model.n_vocab + 5, 1.0),)))
