"""Our Q5_0 / Q4_K / Q6_K matmul (kernels/matmul.py, kernels/native/matmul.c): bit-identical
to llama.cpp's vec_dot on pseudo-random blocks (the start-up check) and on a node that ggml
builds from hand-written arrays, within float32 rounding of float64; on the real model
it takes every Q5_0 matmul of 2+ columns and the logits equal llama.cpp's bit for bit
(16 rows, 100 rows, a lone row left to llama.cpp); a node without scratch memory fails
its decode."""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

from ngramspec.llama.kernels import HookArgs
from ngramspec.llama.kernels import ggml as native_lib
from ngramspec.llama.kernels import matmul as own_matmul
from kernel_toggle import filled_context, logits, require


def _need_kernel():
    import llama_cpp

    llama_cpp.llama_backend_init()  # ggml's fp16 table, which its vec_dot reads
    return require(own_matmul.KERNEL)


@pytest.mark.parametrize("variant", ["avx512vnni", "avx2"])
def test_every_variant_equals_llama_cpps_vec_dot(variant):
    """Each instruction-set variant this CPU runs: its library says it is that variant and
    its self-test finds every value equal to the loaded llama.cpp's vec_dot."""
    from ngramspec.llama.kernels import build, kernel

    _need_kernel()
    if variant not in own_matmul.KERNEL.candidates():
        pytest.skip(f"this CPU does not run the {variant} variant")
    lib = build.library("matmul", variant).lib
    assert lib is not None and kernel.variant_of(lib) == variant
    assert kernel._checked(own_matmul.KERNEL, lib, variant) is None
    assert own_matmul.selftest(lib) is None


def _q5_0_blocks(rng, n_blocks):
    """Hand-made Q5_0 blocks (fp16 scale, 4 bytes of fifth bits, 16 bytes of nibbles) and
    their integer values -16..15 as ggml's dequantization reads them."""
    raw = np.zeros((n_blocks, 22), np.uint8)
    raw[:, 0:2] = rng.uniform(0.01, 0.1, n_blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
    raw[:, 2:] = rng.integers(0, 256, (n_blocks, 20))
    qh = raw[:, 2:6].copy().view("<u4")[:, 0].astype(np.int64)
    qs = raw[:, 6:].astype(np.int64)
    j = np.arange(16)
    lo = (qs & 15) | (((qh[:, None] >> j) & 1) << 4)
    hi = (qs >> 4) | (((qh[:, None] >> (j + 16)) & 1) << 4)
    return raw, np.concatenate([lo, hi], axis=1) - 16, raw[:, 0:2].copy().view(np.float16)[:, 0]


def test_a_node_matches_float64_on_hand_written_arrays():
    """A MUL_MAT node made by ggml (Q5_0 weight 48 x 96, 7 F32 columns) taken by the
    callback and computed by the kernel: within float32 rounding of the float64 product
    of the dequantized weights and the Q8_0-quantized columns; a column computed alone
    equals itself among 7."""
    _need_kernel()
    hook = own_matmul.Hook.create(own_matmul.KERNEL.library(), HookArgs(0, 0, 1), min_cols=1)
    libs, off = native_lib.ggml(), native_lib.tensor_offsets()
    assert hook is not None
    lib, base = hook.lib, libs[0]
    lib.ngs_mm_cb.argtypes = [C.c_void_p, C.c_bool, C.c_void_p]
    lib.ngs_mm_cb.restype = C.c_bool
    lib.ngs_mm_node.argtypes = [C.c_void_p, C.c_int, C.c_int, C.c_void_p]

    Init = native_lib._Init  # the argtypes ggml.py declared: one struct class per process
    base.ggml_free.argtypes = [C.c_void_p]
    base.ggml_new_tensor_2d.restype = C.c_void_p
    base.ggml_new_tensor_2d.argtypes = [C.c_void_p, C.c_int, C.c_int64, C.c_int64]
    base.ggml_mul_mat.restype = C.c_void_p
    base.ggml_mul_mat.argtypes = [C.c_void_p] * 3
    rng = np.random.default_rng(11)
    K, N = 96, 48
    raw, ints, scales = _q5_0_blocks(rng, N * K // 32)
    weights = (ints * scales.astype(np.float64)[:, None]).reshape(N, K)
    x = (rng.standard_normal((7, K)) * 3).astype(np.float32)

    def run(cols):
        ctx = base.ggml_init(Init(1 << 20, None, False))
        try:
            w = base.ggml_new_tensor_2d(ctx, own_matmul.GGML_TYPE_Q5_0, K, N)
            xt = base.ggml_new_tensor_2d(ctx, native_lib.GGML_TYPE_F32, K, len(cols))
            for t, a in ((w, raw), (xt, np.ascontiguousarray(cols))):
                C.memmove(C.c_void_p.from_address(t + off["data"]).value, a.ctypes.data, a.nbytes)
            node = base.ggml_mul_mat(ctx, w, xt)
            assert lib.ngs_mm_cb(node, True, C.byref(hook.hook)) is False  # taken, not wanted
            assert C.c_int.from_address(node + off["op"]).value == native_lib.op_code("CUSTOM")
            lib.ngs_mm_node(node, 0, 1, C.byref(hook.hook))
            data = C.c_void_p.from_address(node + off["data"]).value
            return np.ctypeslib.as_array((C.c_float * (N * len(cols))).from_address(data)
                                         ).reshape(len(cols), N).copy()
        finally:
            base.ggml_free(ctx)
    try:
        out = run(x)
        for c in range(7):  # the column as ggml quantizes it: blocks of 32, in float32
            blocks = x[c].reshape(-1, 32)
            d32 = np.abs(blocks).max(axis=1) / np.float32(127)
            q = np.round(blocks * (np.float32(1) / d32)[:, None]).astype(np.float64)
            want = weights @ (q * d32.astype(np.float16).astype(np.float64)[:, None]).reshape(-1)
            assert np.abs(out[c] - want).max() <= 1e-5 * (1 + np.abs(want).max())
        assert (run(x[4:5])[0] == out[4]).all()
    finally:
        hook.close()



@pytest.fixture(scope="module")
def ctx(model, threads):
    _need_kernel()
    c, toks = filled_context(model, threads, 2, 300, 7)
    assert c.kernels.get("matmul") is not None and len(toks) > 500
    yield c, toks
    c.close()


def _logits(ctx, entries, ours=True):
    return logits(ctx, ctx.kernels.get("matmul"), entries, ours)


@pytest.mark.model
def test_every_q5_0_matmul_of_two_or_more_columns_is_ours_and_equals_llama_cpps(ctx):
    c, toks = ctx
    h = c.kernels.get("matmul")
    for entries in ([(0, toks[300:316], 300, True)],
                    [(0, toks[300:350], 300, True), (1, toks[400:450], 300, True)]):
        done, declined = h.n_done, h.n_declined
        ours = _logits(c, entries)
        taken = h.n_done - done
        assert taken >= 4 * 18 and h.n_declined == declined  # Gemma 3 270M: 18 layers
        theirs = _logits(c, entries, ours=False)
        assert h.n_declined - declined == taken and h.n_done - done == taken
        assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32))
                   for a, b in zip(ours, theirs))


@pytest.mark.model
def test_q4_k_and_q6_k_matmuls_are_ours_and_equal_llama_cpps(ctx):
    """attn_output (Q4_K) and ffn_down (Q4_K / Q6_K) of every layer are taken too; left to
    llama.cpp (the K-quant switch, read live by the C hook) the logits are the same bits."""
    c, toks = ctx
    h = c.kernels.get("matmul")
    entries = [(0, toks[300:316], 300, True), (1, toks[400:405], 300, True)]
    done = h.n_done
    ours = _logits(c, entries)
    taken = h.n_done - done
    h.hook.type_q4_k = h.hook.type_q6_k = -1
    try:
        done = h.n_done
        theirs = _logits(c, entries)
        kq = taken - (h.n_done - done)  # attn_output + ffn_down of 18 layers, per graph
        assert kq > 0 and kq % (2 * 18) == 0
    finally:
        h.hook.type_q4_k, h.hook.type_q6_k = own_matmul.GGML_TYPE_Q4_K, own_matmul.GGML_TYPE_Q6_K
    assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(ours, theirs))


@pytest.mark.model
def test_a_lone_column_stays_llama_cpps(ctx):
    c, toks = ctx
    done, declined = c.kernels.get("matmul").n_done, c.kernels.get("matmul").n_declined
    _logits(c, [(0, toks[300:301], 300, True)])
    assert c.kernels.get("matmul").n_done == done and c.kernels.get("matmul").n_declined - declined >= 4 * 18


@pytest.mark.model
def test_a_node_without_scratch_memory_fails_the_decode(ctx):
    c, toks = ctx
    c.kernels.get("matmul").hook.oom = 1  # as when reserving the scratch failed
    with pytest.raises(MemoryError):
        _logits(c, [(0, toks[300:304], 300, True)])
    assert c.kernels.get("matmul").hook.oom == 0
    assert len(_logits(c, [(0, toks[300:304], 300, True)])) == 4  # the next decode is fine


def test_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv("NGRAMSPEC_OWN_MATMUL", "0")
    assert own_matmul.KERNEL.state() == (None, "turned off (NGRAMSPEC_OWN_MATMUL=0)")


def test_op_codes_are_found_and_an_unknown_name_is_none():
    _need_kernel()
    assert native_lib.op_code("MUL_MAT") is not None
    assert native_lib.op_code("CUSTOM") > native_lib.op_code("MUL_MAT")
    assert native_lib.op_code("NO_SUCH_OP") is None  # only the verified table is asked
