"""Request-level sampling options keep the exactness promise on the real model: with
`logit_bias`, `ignore_eos`, `n_probs` (pre- and post-sampling) and a grammar, greedy
speculative output equals spec-off output token for token, and the reported
probabilities are the same numbers (they come from the rows that sampled each token).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from ngramspec import NgramModParams, SpecConfig
from ngramspec.engine.generate import GenerationResponse, TokenOutput, stream_generate
from ngramspec.settings.grammar import json_grammar
from ngramspec.settings.sampling import SamplingParams
from together import run_together

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parent.parent
VARIED = [line.replace("\\n", "\n") for line in
          (ROOT / "tests" / "data" / "prompts.txt").read_text().splitlines() if line.strip()]
PROMPT = VARIED[0]
N = 48
OFF = SpecConfig(types=())
ON = SpecConfig(types=("ngram-simple", "ngram-mod"),
                ngram_mod=NgramModParams(n_match=8, n_min=2, n_max=64))


@dataclass
class Run:
    text: str
    tokens: list[int]
    final: GenerationResponse
    outputs: list[TokenOutput]  # per token, when n_probs > 0


def run(engine, prompt, sampling, n, speculative=True) -> Run:
    rs = list(stream_generate(engine, prompt, sampling, n, speculative))
    return Run("".join(r.text for r in rs), [t for r in rs for t in r.tokens], rs[-1],
               [o for r in rs for o in r.probs])


def both(make_engine, prompt, sampling, n=N) -> tuple[Run, Run]:
    """(spec-off run, speculative run) for one prompt and sampling."""
    return (run(make_engine(OFF), prompt, sampling, n, speculative=False),
            run(make_engine(ON), prompt, sampling, n))


def probs_of(r: Run):
    return [o.probs for o in r.outputs]


def test_logit_bias_changes_greedy_output_and_speculation_keeps_it_exact(model, make_engine):
    plain_off, plain_on = both(make_engine, PROMPT, SamplingParams())
    assert plain_on.final.draft_n_accepted > 0  # the prompt makes speculation work
    banned = plain_off.tokens[len(plain_off.tokens) // 2]  # a token greedy output uses
    sp = SamplingParams(logit_bias=((banned, float("-inf")), (plain_off.tokens[0], -5.0)))
    off, on = both(make_engine, PROMPT, sp)
    assert on.tokens == off.tokens and on.text == off.text
    assert banned not in off.tokens and off.tokens != plain_off.tokens
    assert on.final.draft_n_accepted > 0


def test_ignore_eos_runs_to_n_predict_exactly(model, make_engine):
    to_eog = tuple((t, 100.0) for t in model.eog_tokens())  # end-of-generation at once...
    stops, _ = both(make_engine, PROMPT, SamplingParams(logit_bias=to_eog), n=40)
    assert stops.final.finish_reason == "stop" and stops.tokens == []
    plain, _ = both(make_engine, PROMPT, SamplingParams(), n=40)
    off, on = both(make_engine, PROMPT, SamplingParams(logit_bias=to_eog, ignore_eos=True), n=40)
    assert off.final.finish_reason == "length" and len(off.tokens) == 40  # ...unless banned
    assert on.tokens == off.tokens == plain.tokens and on.final.draft_n_accepted > 0


def test_n_probs_are_the_same_numbers_with_speculation(model, make_engine):
    off, on = both(make_engine, PROMPT, SamplingParams(n_probs=5))
    assert on.tokens == off.tokens and on.final.draft_n_accepted > 0
    p_off, p_on = probs_of(off), probs_of(on)
    assert p_on == p_off  # bit-identical floats: the same logit rows
    assert [p.token for p in p_off] == off.tokens
    for p in p_off:
        assert len(p.top) == 5 and p.top[0][0] == p.token  # greedy picks the most likely
        assert all(a[1] >= b[1] for a, b in zip(p.top, p.top[1:]))
        assert math.isclose(p.prob, p.top[0][1]) and 0.0 < p.prob <= 1.0
    texts = "".join(o.text for o in off.outputs)
    assert texts == off.text  # each token's text, in order, is the output


def test_grammar_bias_and_post_sampling_probs_exact(model, make_engine):
    prompt = "Copy the JSON object:\n" + '{"name": "Tom", "age": 3, "color": "black"}\n' * 3
    name = model.tokenize("Tom", add_special=False)[0]
    ban = ((int(name), float("-inf")),)
    sp = SamplingParams(grammar=json_grammar(), logit_bias=ban, n_probs=3,
                        post_sampling_probs=True)
    off, on = both(make_engine, prompt, sp, n=24)  # grammar sampling is slow: a short run
    assert on.tokens == off.tokens and name not in off.tokens
    assert off.text.lstrip().startswith("{") and on.final.draft_n_accepted > 0
    assert probs_of(on) == probs_of(off)
    assert all(p.prob == 1.0 and p.top == ((p.token, 1.0),) for p in probs_of(off))


def test_sampled_post_sampling_probs_match_spec_off(model, make_engine):
    sp = SamplingParams(temperature=0.7, seed=42, n_probs=4, post_sampling_probs=True)
    off, on = both(make_engine, PROMPT, sp, n=32)
    assert on.tokens == off.tokens
    p_off = probs_of(off)
    assert probs_of(on) == p_off
    for p in p_off:
        assert 0.0 < p.prob <= 1.0 and 1 <= len(p.top) <= 4
        assert p.token in [t for t, _ in p.top] or p.prob <= p.top[-1][1]
        assert sum(q for _, q in p.top) <= 1.0 + 1e-6


@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty"])
def test_openai_penalties_apply_and_stay_exact(make_engine, field):
    """presence/frequency penalties (llama.cpp's penalties sampler, which keeps the history
    of emitted tokens) change the greedy output on a repeating prompt, and speculative
    output equals spec-off output with them, greedy and with a fixed seed."""
    prompt = "Repeat after me: " + "the cat sat on the mat, " * 8
    plain = run(make_engine(OFF), prompt, SamplingParams(temperature=0.0), N, False)
    greedy = SamplingParams(temperature=0.0, **{field: 1.5})
    off = run(make_engine(OFF), prompt, greedy, N, False)
    assert off.tokens != plain.tokens  # the penalty is applied, not ignored
    assert run(make_engine(ON), prompt, greedy, N).tokens == off.tokens
    seeded = SamplingParams(temperature=0.9, seed=7, **{field: 0.8})
    s_off = run(make_engine(OFF), prompt, seeded, N, False)
    assert run(make_engine(ON), prompt, seeded, N).tokens == s_off.tokens
    with pytest.raises(Exception, match="between -2 and 2"):
        SamplingParams(**{field: 2.5})


def test_penalties_at_four_slots_equal_one_slot_spec_off(make_engine):
    """Four slots decoding together with speculation, each with its own penalties (two
    greedy, two sampled with a seed): every output equals the same prompt alone, spec-off."""
    prompts = [PROMPT, VARIED[1], "Repeat after me: " + "the cat sat on the mat, " * 8, VARIED[2]]
    params = [SamplingParams(temperature=0.0, presence_penalty=0.7, frequency_penalty=0.3),
              SamplingParams(temperature=0.8, seed=11, presence_penalty=0.5),
              SamplingParams(temperature=0.0, frequency_penalty=1.0, repeat_penalty=1.1),
              SamplingParams(temperature=0.9, seed=12, frequency_penalty=0.6)]
    alone = [run(make_engine(OFF), p, sp, N, False).tokens for p, sp in zip(prompts, params)]
    eng = make_engine(ON, n_seq=4, n_ctx=4 * 1024)
    toks, states = run_together(eng, [eng.model.tokenize(p) for p in prompts], params, N)
    assert toks == alone and sum(st.draft_n for st in states) > 0
