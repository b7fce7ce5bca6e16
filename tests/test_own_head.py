"""Our output layer (kernels/head.py): the row order it assumes (each row's position
checked), and its logits bit-identical to llama.cpp's on the real model, whatever the
decode's shape."""
from __future__ import annotations

import numpy as np
import pytest

from ngramspec.llama.kernels import head as own_head
from ngramspec.llama.context import Context, ContextParams
from ngramspec.bench.prompt_checks import long_text
from kernel_toggle import require


def test_output_order_single_stream_is_batch_order():
    logits = (False, True, True, False, True)
    assert own_head.output_order(((0, 5),), logits, 512, per_seq_streams=False) == (1, 2, 4)
    # split_simple: ubatches of 2 tokens keep batch order
    assert own_head.output_order(((0, 5),), logits, 2, per_seq_streams=False) == (1, 2, 4)


def test_output_order_follows_split_equal():
    # [3, 2, 2, 2] tokens of sequences 0..3: {0..3: 2 each}, then {0: 1}; sequence 0's
    # third token (batch index 2) comes out last
    logits = (True,) * 9
    assert own_head.output_order(((0, 3), (1, 2), (2, 2), (3, 2)), logits, 512,
                                 per_seq_streams=True) == (0, 1, 3, 4, 5, 6, 7, 8, 2)
    # non-consecutive sequence ids are separate runs, hence separate ubatches
    assert own_head.output_order(((0, 2), (2, 1)), (False, True, True), 512,
                                 per_seq_streams=True) == (1, 2)


def test_library_respects_the_switch(monkeypatch):
    monkeypatch.setenv("NGRAMSPEC_OWN_HEAD", "0")
    assert own_head.KERNEL.state() == (None, "turned off (NGRAMSPEC_OWN_HEAD=0)")


SHAPES = [
    [(0, 1, True), (1, 1, True), (2, 1, True), (3, 1, True)],  # 4 slots, no draft
    [(0, 3, True), (1, 2, True), (2, 2, True), (3, 2, True)],  # split into 2 ubatches
    [(0, 5, True), (2, 3, True), (3, 1, False), (5, 7, True)],  # runs of seq ids, one last-only
    [(1, 2, False), (4, 9, True)],
    [(s, 2, True) for s in range(8)],
    [(0, 16, True)],
    [(0, 6, True)],  # 4 columns and 2
    [(3, 1, True)],  # one row (llama.cpp: vec_dot, ours: the same kernel as for several)
    [(0, 2, True), (1, 6, True), (2, 2, True), (3, 2, True), (4, 2, True)],
]


@pytest.mark.parametrize("variant", ["avx512vnni", "avx2"])
def test_rows_bit_identical_to_llama_cpp(model, variant, monkeypatch):
    """Each instruction-set variant this CPU runs (kernels/build.py VARIANTS)."""
    require(own_head.KERNEL)
    if variant not in own_head.KERNEL.candidates():
        pytest.skip(f"this CPU does not run the {variant} variant")
    monkeypatch.setenv("NGRAMSPEC_KERNEL_VARIANT", variant)
    toks = list(model.tokenize(long_text(6000)))
    ours = Context(model, ContextParams(n_ctx=1024 * 8, n_seq_max=8))
    assert ours.kernels.state()["head"]["variant"] == variant
    theirs = Context(model, ContextParams(n_ctx=1024 * 8, n_seq_max=8, own_head=False))
    try:
        assert ours.head is not None and ours.head.active  # Gemma's output layer is Q8_0
        assert theirs.head is None
        for ctx in (ours, theirs):
            for s in range(8):
                ctx.run_rows([(s, toks[s * 40:s * 40 + 300], 0, False)], {})
        for shape in SHAPES:
            got, top = [], []
            for ctx, argmax_only in ((ours, True), (ours, False), (theirs, False)):
                rows = ctx.decode([(s, toks[900 + 10 * s:900 + 10 * s + n], 300, every)
                                   for s, n, every in shape], argmax_only)
                # with argmax_only, the argmaxes come first and the logits are written
                # only when read
                top.append([ctx.argmax_at(i) for r in rows for i in r])
                got.append(np.stack([ctx.logits_at(i).copy() for r in rows for i in r]))
                for s, _, _ in shape:
                    ctx.truncate(s, 300)
            for g in got[:2]:
                assert np.array_equal(g.view(np.uint32), got[2].view(np.uint32)), shape
            assert top[0] == top[1] == top[2] == np.argmax(got[2], axis=1).tolist(), shape
    finally:
        ours.close()
        theirs.close()


def _q8_rows(scales, values) -> np.ndarray:
    """Q8_0 weight rows of one 32-value block each: fp16 scale, then the 32 int8 values."""
    out = np.zeros((len(scales), 34), np.uint8)
    out[:, :2] = np.asarray(scales, np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = np.asarray(values, np.int8).view(np.uint8)
    return out


@pytest.mark.parametrize("variant", ["avx512vnni", "avx2"])
def test_the_kernels_argmax_is_numpys(variant, monkeypatch):
    """On hand-written weights: the first of equal maxima, across the threads' shares of
    the rows, and the first NaN (a NaN scale) wins, as with np.argmax of the logits."""
    import ctypes as C

    from ngramspec.llama.kernels import ggml

    require(own_head.KERNEL)
    if variant not in own_head.KERNEL.candidates():
        pytest.skip(f"this CPU does not run the {variant} variant")
    monkeypatch.setenv("NGRAMSPEC_KERNEL_VARIANT", variant)
    lib = own_head.KERNEL.library()
    n, rng = 4099, np.random.default_rng(7)
    vals = rng.integers(-40, 40, (n, 32))
    scales = np.full(n, 0.01)
    for r in (3000, 17, 2100):  # one row, three times: the first (17) is the argmax
        vals[r], scales[r] = 127, 0.05
    w = _q8_rows(scales, vals)
    h = np.ones((3, 32), np.float32)
    h[1] = -1.0  # column 1: the smallest rows win instead
    from_float = ggml.from_float(ggml.GGML_TYPE_Q8_0)

    def run(weights, k):
        out = [np.full(n, np.nan, np.float32) for _ in range(k)]
        ptrs = (C.c_void_p * k)(*[o.ctypes.data for o in out])
        best = np.full(k, -2, np.int64)
        which = (C.c_int32 * k)(*range(k))
        assert lib.ngs_q8_0_head(weights.ctypes.data, n, 32, h.ctypes.data, 32, which, k, ptrs,
                                 2, from_float, best.ctypes.data) == 0
        return out, best

    for k in (1, 2, 3):
        out, best = run(w, k)
        assert best.tolist() == [int(np.argmax(o)) for o in out]
        assert best[0] == 17
    scales[[900, 2500]] = np.nan
    out, best = run(_q8_rows(scales, vals), 3)
    assert best.tolist() == [int(np.argmax(o)) for o in out] == [900, 900, 900]


def test_another_model_decodes_with_or_without_it(smollm2):
    """SmolLM2 (another architecture): ours is on only where its weight qualified and its
    rows matched llama.cpp's; decodes work either way."""
    ctx = Context(smollm2, ContextParams(n_ctx=2048, n_seq_max=2))
    try:
        if ctx.head is not None:
            assert ctx.head.active == (ctx.head.weight is not None)
        rows = ctx.decode([(0, [100, 200, 300], 0, True), (1, [5, 6], 0, True)])
        assert all(np.isfinite(ctx.logits_at(i)).all() for r in rows for i in r)
    finally:
        ctx.close()


def test_a_kernel_that_disagrees_is_never_used(model, monkeypatch):
    """The start-up check compares rows computed into fresh buffers: a kernel that writes
    nothing (or anything else) leaves llama.cpp's output layer in charge."""
    require(own_head.KERNEL)
    monkeypatch.setattr(own_head.Hook, "_compute", lambda self, which, out, argmax=False: None)
    ctx = Context(model, ContextParams(n_ctx=1024, n_seq_max=2))
    try:
        assert ctx.head is not None and ctx.head.weight is not None and not ctx.head.active
        assert ctx.logit_quantum != 1
        rows = ctx.decode([(0, [100, 200, 300], 0, True), (1, [5, 6], 0, True)])
        assert all(np.isfinite(ctx.logits_at(i)).all() for r in rows for i in r)
    finally:
        ctx.close()


def test_each_row_is_checked_by_its_position(model, monkeypatch):
    """The callback records each result_norm row's position (inp_pos at out_ids): a
    decode whose rows llama.cpp ordered otherwise than `output_order` says raises
    before any logit is written, and the start-up check then keeps llama.cpp's layer."""
    require(own_head.KERNEL)
    ctx = Context(model, ContextParams(n_ctx=2048, n_seq_max=2))
    try:
        assert ctx.head.active
        ctx.decode([(1, list(range(20, 30)), 0, False)])  # sequence 1 holds positions 0..9
        batch = [(0, [100, 200, 300, 400], 0, True), (1, [5, 6, 7], 10, True)]
        rows = ctx.decode(batch)
        # split_equal: 3 tokens of each sequence, then sequence 0's fourth (output_order)
        assert ctx.head.pos[0, :7].tolist() == [0, 1, 2, 10, 11, 12, 3]
        good = [ctx.logits_at(i).copy() for r in rows for i in r]
        ctx.truncate(0, 0)
        ctx.truncate(1, 10)
        real = own_head.output_order
        # two rows swapped: the same count, other positions
        monkeypatch.setattr(own_head, "output_order",
                            lambda *a: (lambda o: [o[1], o[0], *o[2:]])(real(*a)))
        with pytest.raises(RuntimeError, match="position"):
            ctx.decode(batch)
        monkeypatch.setattr(own_head, "output_order", real)
        ctx.truncate(0, 0)
        ctx.truncate(1, 10)
        rows = ctx.decode(batch)
        again = [ctx.logits_at(i) for r in rows for i in r]
        assert all(np.array_equal(a, b) for a, b in zip(good, again))
    finally:
        ctx.close()


def test_one_row_decodes_take_the_faster_layer_with_the_same_values(model):
    """`Hook.choose_one_row`: at start-up one-row decodes are timed with ours and with
    llama.cpp's output layer (its vec_dot); llama.cpp's is taken only where it was faster
    and its row bit-identical to ours. Either way a one-row decode gives the same logits
    and argmax, and a decode of several rows is always ours."""
    require(own_head.KERNEL)
    ctx = Context(model, ContextParams(n_ctx=1024, n_seq_max=1))
    try:
        h = ctx.head
        assert h.active and h.one_row_ms is not None
        ours_ms, theirs_ms = h.one_row_ms
        assert h.one_row == (ours_ms <= theirs_ms)  # the rows were identical on this CPU
        assert ctx.kernels.state()["head"]["scope"] == "own"  # the cost key: either way
        assert h.wants(2) and h.wants(1) == h.one_row
        got = {}
        for mine in (True, False):
            h.one_row = mine
            row = ctx.decode([(0, [4321], 0, True)])[0][0]
            got[mine] = (ctx.logits_at(row).copy(), ctx.argmax_at(row))
            ctx.truncate(0, 0)
        assert np.array_equal(got[True][0].view(np.uint32), got[False][0].view(np.uint32))
        assert got[True][1] == got[False][1] == int(np.argmax(got[True][0]))
    finally:
        ctx.close()
