"""Prompt evaluation on the real model: chunked prefill interleaved with running slots,
and the prompt cache. Both must leave every generated token (and every logit row)
exactly as a sequence decoded alone, from scratch, would have it."""
from __future__ import annotations

import numpy as np
import pytest

from ngramspec import NgramMapParams, SpecConfig
from ngramspec.bench.corpus import documents, edit_prompt
from ngramspec.engine.engine import Engine
from ngramspec.llama.context import Context, ContextParams
from ngramspec.llama.twin import open_context
from ngramspec.engine.request import Request
from ngramspec.settings.sampling import SamplingParams
from together import run_alone

pytestmark = pytest.mark.model
GREEDY = SamplingParams(temperature=0.0)
N = 32


def run(engine, seq_id, prompt, chunk=512, n=N, **kw):
    """One sequence alone: (tokens, state)."""
    return run_alone(engine, prompt, n, seq_id, chunk, **kw)


@pytest.fixture(scope="module")
def solo(model, twin_model, threads):
    return Engine(model, open_context(model, ContextParams(n_ctx=4096, n_threads=threads), twin_model), SpecConfig(types=()))


@pytest.fixture(scope="module")
def prompts(model):
    long = model.tokenize(edit_prompt("textwrap", "TextWrapper", "LineWrapper", lines=140))
    short = model.tokenize(documents(1, 0, 0)[0].prompt)
    assert len(long) > 1100 and 300 < len(short) < 1000
    return long, short


def test_long_prefill_interleaved_with_a_generating_slot(model, twin_model, threads, solo, prompts,
                                                        logit_log):
    long, short = prompts
    want_short, st = run(solo, 0, short)
    ref_short = logit_log.pop(id(st.sampler))
    want_long, st = run(solo, 0, long)
    ref_long = logit_log.pop(id(st.sampler))
    two = Engine(model, open_context(model, ContextParams(n_ctx=8192, n_seq_max=2, n_threads=threads), twin_model), SpecConfig(types=("ngram-simple",)))
    a = two.start(0, Request(prompt=short, sampling=GREEDY, n_predict=N))
    first = None
    while first is None:
        first = two.prefill(a)
    out_a, out_b = list(first.tokens), []
    a_steps = [two.step([a])[0] for _ in range(3)]  # slot 0 is generating ...
    out_a += [t for o in a_steps for t in o.tokens]
    b = two.start(1, Request(prompt=long, sampling=GREEDY, n_predict=N))
    for chunk in (128, 300, 512, 200, 512):  # ... while slot 1's prompt goes in, chunk by chunk
        if not b.prefilling:
            break
        got = two.prefill(b, chunk)
        if got is not None:
            out_b += got.tokens
        if not a.done:
            outs = two.step([a, b])  # b joins the step once its prompt is in
            out_a, out_b = out_a + outs[0].tokens, out_b + outs[1].tokens
    while not (a.done and b.done):
        outs = two.step([a, b])
        out_a += outs[0].tokens
        out_b += outs[1].tokens
    assert out_a == want_short and out_b == want_long
    assert logit_log[id(a.sampler)] == ref_short and logit_log[id(b.sampler)] == ref_long


def test_prompt_cache_hit_equals_miss(model, threads, solo, prompts, logit_log):
    long, _ = prompts
    prefix = long[:900]
    p1 = np.concatenate([prefix, model.tokenize("\n# first", add_special=False)])
    p2 = np.concatenate([prefix, model.tokenize("\n# the second request asks this", add_special=False)])
    miss, st = run(solo, 0, p2, cache_prompt=False)
    ref = logit_log.pop(id(st.sampler))
    assert st.n_cached == 0
    run(solo, 0, p1)
    hit, st = run(solo, 0, p2)
    assert st.n_cached >= len(prefix) and hit == miss
    assert logit_log[id(st.sampler)] == ref
    again, st = run(solo, 0, p2)  # the whole prompt cached: only its last token is evaluated
    assert st.n_cached == len(p2) - 1 and again == miss


@pytest.fixture(scope="module")
def short_spec(model, threads):
    """Speculation that drafts on short, repetitive text (2-token keys)."""
    cfg = SpecConfig(types=("ngram-simple",), ngram_simple=NgramMapParams(size_n=2, size_m=8))
    return Engine(model, Context(model, ContextParams(n_ctx=512, n_threads=threads)), cfg)


def test_short_prompt_cache_hit_equals_miss(model, short_spec, logit_log):
    """Prompts under 64 tokens and generation steps both take the small-row path, so a
    short prompt reuses every cell of a slot whose last prompt was short: its prompt and
    its generated tokens (verified in drafted batches), as a chat's next turn does."""
    eng = short_spec
    p1 = model.tokenize("List: apple, pear, apple, plum, apple,")
    miss1, st = run(eng, 0, p1, n=24, cache_prompt=False, speculative=False)
    ref1 = logit_log.pop(id(st.sampler))
    hit1, st = run(eng, 0, p1, n=24, speculative=False)
    assert st.n_cached == len(p1) - 1 and hit1 == miss1
    assert logit_log.pop(id(st.sampler)) == ref1
    p2 = np.concatenate([p1, miss1[:12], model.tokenize(" And now", add_special=False)])
    assert len(p2) < 64
    miss2, st = run(eng, 0, p2, n=24, cache_prompt=False, speculative=False)
    ref2 = logit_log.pop(id(st.sampler))
    spec1, st = run(eng, 0, p1, n=24)  # the slot's generated cells come from drafted batches
    assert spec1 == miss1 and st.draft_n > 0 and st.draft_n > st.draft_n_accepted
    hit2, st = run(eng, 0, p2, n=24, speculative=False)
    assert st.n_cached >= len(p1) + 12 and hit2 == miss2
    assert logit_log.pop(id(st.sampler)) == ref2


def test_short_and_tiled_cells_are_not_mixed(model, solo, prompts):
    """A short prompt never reuses tiled cells, nor a long one small-row cells."""
    long, _ = prompts
    head = long[:40]
    run(solo, 0, long[:200], n=4)
    _, st = run(solo, 0, head, n=4)
    assert st.n_cached == 0  # the cells were evaluated by the tiled prefill
    _, st = run(solo, 0, long[:200], n=4)
    assert st.n_cached == 0  # the cells were evaluated on the small-row path


def test_chunking_does_not_change_the_first_token_logits(solo, prompts, logit_log):
    long, _ = prompts
    hashes = []
    for chunk in (128, 333, 512):
        _, st = run(solo, 0, long, chunk=chunk, n=1, cache_prompt=False)
        hashes.append(logit_log.pop(id(st.sampler)))
    assert hashes[0] == hashes[1] == hashes[2]
