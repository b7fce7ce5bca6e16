"""Rule U1 pads a lone token only where its kernels differ (docs/exactness.md).

ggml's flash attention splits a single query's KV range over the threads only for an
F16 K and V cache, and never on the CPU backend's reference path (ref_attention.py, on
by default); with either, a token alone in a ubatch is computed as among other rows, on
a model whose matrices are quantized. Then a one-token step needs no padding row
(18-38% of its time on a 2-core CPU)."""
from __future__ import annotations

import platform
import struct
import sys

import numpy as np
import pytest

from ngramspec import NgramModParams, SpecConfig
from ngramspec.llama import ref_attention
from ngramspec.bench.corpus import documents
from ngramspec.engine.engine import Engine
from ngramspec.engine.generate import generate
from ngramspec.llama.gguf_types import matrix_types
from ngramspec.llama.context import Context, ContextParams
from ngramspec.settings.sampling import SamplingParams
from ngramspec.llama.twin import open_context
from ngramspec.llama.ubatch import invariant_violation, layout, lone_token_invariant, split

QUANT = frozenset({"type8", "type12"})


def test_the_fa_split_and_float_weights_decide():
    assert not lone_token_invariant("f16", "f16", lambda: QUANT)
    assert not lone_token_invariant("f32", "f16", lambda: QUANT)  # llama.cpp casts F32 to F16
    assert not lone_token_invariant("f32", "f32", lambda: QUANT)
    for k, v in [("q8_0", "q8_0"), ("q8_0", "f16"), ("f16", "q8_0"), ("q4_0", "q4_0"), ("bf16", "bf16")]:
        assert lone_token_invariant(k, v, lambda: QUANT), (k, v)
    assert not lone_token_invariant("q8_0", "q8_0", lambda: QUANT | {"f16"})  # sgemm's FMA tiles
    assert not lone_token_invariant("q8_0", "q8_0", lambda: None)  # unknown weights
    assert lone_token_invariant("f16", "f16", lambda: QUANT, reference_attention=True)
    assert not lone_token_invariant("f16", "f16", lambda: QUANT | {"bf16"}, reference_attention=True)
    asked = []
    lone_token_invariant("f16", "f16", lambda: asked.append(1))
    assert not asked  # the header is read only when the K/V pair rules the split out


def test_the_reference_path_only_where_it_is_needed_and_exact():
    """F16/F16 (F32 is cast) takes flash attention's split-KV path, so it needs the switch;
    a quantized cache does not, and would get its Hadamard rotation moved to a
    column-count-dependent matmul by it; some architectures rotate whatever the type."""
    assert ref_attention.wanted("f16", "f16", "gemma3") and ref_attention.wanted("f32", "f16", "llama")
    assert not ref_attention.wanted("q8_0", "q8_0", "gemma3")
    assert not ref_attention.wanted("f16", "q8_0", "gemma3")
    assert not ref_attention.wanted("f16", "f16", "deepseek32")
    assert not ref_attention.wanted("f16", "f16", "")  # unknown architecture


def test_layout_without_lone_padding():
    assert layout([(0, 1, 1)], 512, False).pads == {0: 1}
    assert layout([(0, 1, 1)], 512, False, lone_ok=True).pads == {}
    lay = layout([(0, 3, 3), (1, 2, 2), (2, 2, 2), (3, 2, 2)], 512, True, lone_ok=True)
    assert lay.pads == {} and [ub.n_tokens for ub in lay.ubatches] == [8, 1]
    assert invariant_violation(split([(0, 1)], 512, False), lone_ok=True) is None
    assert invariant_violation(split([(0, 64)], 512, False), lone_ok=True) is not None  # U2 holds


def _gguf(tensors) -> bytes:
    """A GGUF v3 header: one string and one string-array metadata entry, then tensors
    (name, dims, ggml type)."""
    def s(b: bytes) -> bytes:
        return struct.pack("<Q", len(b)) + b
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 2)
    out += s(b"general.name") + struct.pack("<I", 8) + s(b"tiny")
    out += s(b"tokens") + struct.pack("<IIQ", 9, 8, 2) + s(b"a") + s(b"bc")
    for name, dims, t in tensors:
        out += s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        out += struct.pack("<IQ", t, 0)
    return out


def test_matrix_types_from_a_header(tmp_path, model):
    f = tmp_path / "tiny.gguf"
    f.write_bytes(_gguf([(b"norm", [64], 0), (b"w", [64, 32], 1), (b"q", [64, 32], 8),
                         (b"col", [64, 1], 30)]))
    assert matrix_types(f) == {"f16", "type8"}  # norms and vectors are not matrices
    f.write_bytes(b"GGUF" + b"\xff" * 40)
    assert matrix_types(f) is None
    assert matrix_types(tmp_path / "missing.gguf") is None
    assert matrix_types(model.path) == {"type6", "type8", "type12", "type14"}  # Q5_0 Q8_0 Q4_K Q6_K


def _rows_alone_and_together(m, kv: str, threads: int, n: int = 6, ref: bool = True,
                             lone: bool | None = None):
    """Logit rows of n tokens after a 600-token prefix (over 512 KV cells: flash
    attention's split-KV length), decoded one at a time and in one decode; `ref`: the
    reference attention path; `lone`: force the context's lone_ok (None: its own).
    llama.cpp's attention (no own_attention.py): the paths it falls back to."""
    toks = m.tokenize(documents(n_edit=1, n_summary=0, n_open=0)[0].prompt * 2)[:600 + n]
    ctx = Context(m, ContextParams(n_ctx=2048, n_threads=threads, type_k=kv, type_v=kv,
                                   reference_attention=ref, own_attention=False))
    if lone is not None:
        ctx.lone_ok = lone
    try:
        out = []
        for together in (False, True):
            ctx.clear()
            ctx.prefill(0, toks[:300], 0)
            ctx.prefill(0, toks[300:600], 300)
            if together:
                rows = ctx.decode([(0, toks[600:], 600, True)])[0]
                out.append([ctx.logits_at(i).copy() for i in rows])
            else:
                one = []
                for k in range(n):
                    r = ctx.decode([(0, toks[600 + k:601 + k], 600 + k, True)])[0]
                    one.append(ctx.logits_at(r[0]).copy())
                out.append(one)
        return ctx.lone_ok, out
    finally:
        ctx.close()


@pytest.mark.model
@pytest.mark.parametrize("kv,ref", [("q8_0", False), ("f16", True)])
@pytest.mark.parametrize("which", ["gemma", "smollm2"])
def test_a_lone_token_equals_its_row_among_others(request, which, kv, ref, threads):
    m = request.getfixturevalue("model" if which == "gemma" else "smollm2")
    lone_ok, (alone, together) = _rows_alone_and_together(m, kv, threads, ref=ref)
    assert lone_ok
    for a, b in zip(alone, together):
        assert np.array_equal(a, b)


@pytest.mark.model
def test_the_reference_path_is_what_makes_an_f16_lone_token_exact(model, twin_model, threads):
    """The switch reaches the context's backend: an unpadded lone token over an F16 cache
    differs from its row among others without it (split-KV), and not with it. A main
    context of several slots gets it, its prefill twin does not (rule T's tiled path)."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not sys.platform.startswith("linux"):
        pytest.skip("the reference path is looked up on x86-64 Linux only")
    ctx = open_context(model, ContextParams(n_ctx=2048, n_seq_max=2, n_threads=max(threads, 2)),
                       twin_model)
    try:
        assert ctx.ref_backend is not None and ctx.lone_ok
        assert ctx.twin is None or ctx.twin.ctx.ref_backend is None
        assert ctx.layout_for([(0, 1, 1)]).pads == {}
    finally:
        ctx.close()
    _, (alone, together) = _rows_alone_and_together(model, "f16", max(threads, 2), ref=False,
                                                    lone=True)
    assert any(not np.array_equal(a, b) for a, b in zip(alone, together))


@pytest.mark.model
def test_f16_kv_without_the_reference_path_still_pads(model, threads):
    ctx = Context(model, ContextParams(n_ctx=1024, n_threads=threads, reference_attention=False))
    try:
        assert ctx.ref_backend is None and not ctx.lone_ok
        assert ctx.layout_for([(0, 1, 1)]).pads == {0: 1}
    finally:
        ctx.close()


@pytest.mark.model
@pytest.mark.parametrize("kv", ["q8_0", "f16"])
@pytest.mark.parametrize("which", ["gemma", "smollm2"])
def test_unpadded_spec_on_equals_spec_off_on_a_long_prompt(request, which, kv, threads):
    """Greedy, a held-out 700-token refactor prompt: one-token steps without a padding
    row (q8_0 K/V, or F16 on the reference path), verify steps of many rows, the same
    tokens."""
    m = request.getfixturevalue("model" if which == "gemma" else "smollm2")
    prompt = documents(n_edit=1, n_summary=0, n_open=0)[0].prompt
    ctx = Context(m, ContextParams(n_ctx=2048, n_threads=threads, type_k=kv, type_v=kv))
    try:
        assert ctx.lone_ok
        on_cfg = SpecConfig(types=("ngram-simple", "ngram-mod"),
                            ngram_mod=NgramModParams(n_match=8, n_min=2, n_max=64))
        greedy = SamplingParams(temperature=0.0)
        off = generate(Engine(m, ctx, SpecConfig(types=())), prompt, greedy, 96, speculative=False)
        ctx.clear()
        on = generate(Engine(m, ctx, on_cfg), prompt, greedy, 96)
        assert on.text == off.text and on.final.draft_n_accepted > 0  # verify steps ran
    finally:
        ctx.close()


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("kv", ["q8_0", "f16"])
@pytest.mark.parametrize("which,n_seq", [("gemma", 8), ("smollm2", 8), ("gemma", 16)])
def test_unpadded_slots_together_equal_each_alone(request, which, n_seq, kv, twin_model, threads):
    """q8_0 K/V or F16 on the reference path, held-out documents in n_seq slots decoding together with speculation (lone
    tokens of one stream in a ubatch, unpadded) give each document's text alone, spec-off."""
    from together import run_together

    from ngramspec.llama.twin import load_twin

    m = request.getfixturevalue("model" if which == "gemma" else "smollm2")
    twin = twin_model if which == "gemma" else load_twin(m.path)
    prompts = ([d.prompt for d in documents()] * 2)[:n_seq]
    greedy = SamplingParams(temperature=0.0)
    kv = {"n_threads": threads, "type_k": kv, "type_v": kv}
    one = open_context(m, ContextParams(n_ctx=4096, **kv), twin)
    solo = []
    for p in prompts:
        one.clear()
        solo.append(generate(Engine(m, one, SpecConfig(types=())), p, greedy, 96,
                             speculative=False).text)
    one.close()
    ctx = open_context(m, ContextParams(n_ctx=4096 * n_seq, n_seq_max=n_seq, **kv), twin)
    try:
        assert ctx.lone_ok
        cfg = SpecConfig(types=("ngram-simple", "ngram-mod"), policy="cost",
                         ngram_mod=NgramModParams(n_match=8, n_min=2, n_max=64))
        toks, states = run_together(Engine(m, ctx, cfg), [m.tokenize(p) for p in prompts],
                                    [greedy] * n_seq, 96)
        assert [m.detokenize(t) for t in toks] == solo
        assert sum(st.draft_n_accepted for st in states) > 0
    finally:
        ctx.close()
        if twin is not None and twin is not twin_model:
            twin.close()
