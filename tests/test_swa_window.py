"""The main context's window-size SWA cache (docs/exactness.md, "The sliding-window
cache"): with a prefill twin, the main context keeps llama.cpp's window-size cache for
Gemma's sliding-window layers instead of a full-size one, and re-imports a sequence's
window cells before its stream would wrap. Every logit must stay bit-identical to the
full-size cache's, whatever the draft lengths and rollbacks, across several
re-imports, with two sequences in each decode."""
from __future__ import annotations

import hashlib
import random

import numpy as np

from ngramspec.engine.request import Request
import pytest

from ngramspec.llama.context import ContextParams
from ngramspec.llama.twin import open_context

PROMPTS = (
    "class Stack:\n    def push(self, item):\n        self.items.append(item)\n" * 30,
    "def area(w, h):\n    '''Area of a w x h rectangle.'''\n    return w * h\n" * 30,
)


def _draft(hist: list[int], tok: int, k: int) -> list[int]:
    """Up to k tokens that followed the last earlier occurrence of `tok` (a 1-gram lookup)."""
    seq = hist + [tok]
    for i in range(len(seq) - 2, -1, -1):
        if seq[i] == tok:
            return seq[i + 1:i + 1 + k]
    return []


def _run(ctx, prompts, n_gen: int, seed: int | None):
    """Greedy generation of every prompt at once (one decode per step), drafts of random
    length (seed None: no drafts). Returns (tokens per sequence, a digest of every logit
    row of every step in order)."""
    rng = random.Random(seed)
    hist, tok = {}, {}
    for s, p in enumerate(prompts):
        ctx.clear(s)
        ctx.begin_prompt(s, 0)
        for i in range(0, len(p), 512):
            src, rows = ctx.prefill(s, p[i:i + 512], i, last=i + 512 >= len(p))
        hist[s], tok[s] = list(p), int(np.argmax(src.logits_at(rows[-1])))
    digest = hashlib.sha256()
    while min(len(h) for h in hist.values()) < len(prompts[0]) + n_gen:
        drafts = {s: _draft(hist[s], tok[s], rng.randint(0, 8)) if seed is not None else []
                  for s in hist}
        rows = ctx.decode([(s, [tok[s], *drafts[s]], len(hist[s]), True) for s in sorted(hist)])
        for s, r in zip(sorted(hist), rows):
            digest.update(ctx.logits_at(r[0]).tobytes())
            out = [int(np.argmax(ctx.logits_at(i))) for i in r]
            n_acc = 0
            while n_acc < len(drafts[s]) and drafts[s][n_acc] == out[n_acc]:
                n_acc += 1
            hist[s] += [tok[s], *drafts[s][:n_acc]]
            tok[s] = out[n_acc]
            if n_acc < len(drafts[s]):
                ctx.truncate(s, len(hist[s]))
    return hist, digest.hexdigest()


def test_window_cache_gives_the_full_caches_logits(model, twin_model, threads):
    if twin_model is None:
        pytest.skip("this CPU does not repack (no AVX2, or it advertises AMX)")
    prompts = [model.tokenize(p) for p in PROMPTS]
    n = min(len(p) for p in prompts)
    prompts = [p[:n] for p in prompts]
    assert n > 600
    params = ContextParams(n_ctx=2 * 2560, n_seq_max=2, n_threads=threads)
    window = open_context(model, params, twin_model)
    assert window.swa_span is not None and window.swa_span < window.n_ctx_seq
    full_params = ContextParams(n_ctx=2 * 2560, n_seq_max=2, n_threads=threads, swa_full=True)
    try:
        h_full, d_full = _run(window, prompts, 1100, None)  # spec-off, window cache
        h_spec, d_spec = _run(window, prompts, 1100, 1)
        # re-imported: the lowest cell left the prompt (which moves in as its last 512)
        assert window.positions(0)[0] > n
    finally:
        window.close()
    full = open_context(model, full_params, twin_model)
    try:
        assert full.swa_span is None
        h_ref, d_ref = _run(full, prompts, 1100, 1)
        assert full.positions(0)[0] == n - 512  # every cell since the prompt's window
    finally:
        full.close()
    for s in h_ref:
        m = min(len(h_full[s]), len(h_spec[s]), len(h_ref[s]))
        assert h_full[s][:m] == h_spec[s][:m] == h_ref[s][:m]
    assert d_spec == d_ref  # the same draft lengths: every logit row bit-identical


def test_context_shift_asks_for_a_full_size_cache(make_engine, model):
    """llama.cpp cannot shift a window-size cache (it would abort): a clear error instead;
    the server turns --swa-full on with --context-shift."""
    from ngramspec.settings.config import SpecConfig
    from ngramspec.errors import ConfigError
    from ngramspec.settings.sampling import SamplingParams

    engine = make_engine(SpecConfig(types=()))
    if engine.ctx.swa_span is None:
        pytest.skip("no prefill twin here: the SWA cache is full size")
    with pytest.raises(ConfigError, match="--swa-full"):
        engine.start(0, Request(prompt=model.tokenize("Hello"),
                                sampling=SamplingParams(temperature=0), n_predict=8,
                                context_shift=(-1, 0)))


def test_the_server_turns_swa_full_on_with_context_shift():
    from ngramspec.engine.runtime import context_params
    from ngramspec.settings.server import ServerSettings

    assert ServerSettings(context_shift=True).engine_settings().options.swa_full is True
    plain = ServerSettings().engine_settings().options
    assert plain.swa_full is False
    assert context_params(4096, 1, 2, plain, True)[0].swa_full is None  # window with a twin
    assert context_params(4096, 1, 2, plain, False)[0].swa_full is True  # as before
