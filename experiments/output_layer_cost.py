"""What the output layer costs in a decode, and what computing it ourselves would save.

Gemma 3's output layer (262,144 x 640, Q8_0) is evaluated by llama.cpp on every logit
row: one row through `vec_dot`, several through llamafile's tinyBLAS. This script
measures, on the embedded model (docs/benchmarks-history.md, "Where the time goes"):

1. a one-token decode with and without the output layer: the context's eval callback
   (llama.cpp's public `cb_eval`) stops the graph after `result_norm`, the last node
   before the output matmul (every KV write comes earlier in the graph);
2. the output layer computed outside llama.cpp with ggml's own `vec_dot` per column
   (a ggml graph over the GGUF's weight bytes, the columns in the batch dimension so
   tinyBLAS never takes them), for 1..16 rows, and whether its rows are bit-identical
   to llama.cpp's;
3. decodes of several streams x tokens, every row with logits: llama.cpp's output layer
   against "stop at result_norm + our own".

Diagnostic: ggml's own kernels run outside llama.cpp's graph. ngramspec's output layer is
its own kernel (ngramspec/llama/kernels/head.py, measured by scripts/own_head_cost.py); the
contexts here do not use it. Run alone on a quiet machine:
    .venv/bin/python experiments/output_layer_cost.py
"""
from __future__ import annotations

import ctypes as C
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from ngramspec.llama.host import loaded
from ngramspec.llama.context import Context, ContextParams
from ngramspec.llama.model import Model
from ngramspec.llama.backend import _llama
from ngramspec.bench.prompt_checks import long_text

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from own_kernel_cost import make_context, median_ms  # noqa: E402  (the tool's)

GGML_TYPE_F32 = 0
# struct ggml_tensor (ggml.h): ne at 16, data at 248, name at 256 on 64-bit builds; checked below
NE_OFF, DATA_OFF = 16, 248


class _Init(C.Structure):
    _fields_ = [("mem_size", C.c_size_t), ("mem_buffer", C.c_void_p), ("no_alloc", C.c_bool)]


class _GgufInit(C.Structure):
    _fields_ = [("no_alloc", C.c_bool), ("ctx", C.c_void_p)]


def _ggml():
    """ctypes handles on the libggml-base and libggml-cpu llama.cpp loaded (the same
    copies; ngramspec/llama/host.py)."""
    base, cpu = loaded("ggml-base"), loaded("ggml-cpu")
    p, i64, sz = C.c_void_p, C.c_int64, C.c_size_t
    for name, res, args in [
            ("ggml_init", p, [_Init]), ("ggml_free", None, [p]),
            ("ggml_new_tensor_2d", p, [p, C.c_int, i64, i64]),
            ("ggml_new_tensor_3d", p, [p, C.c_int, i64, i64, i64]),
            ("ggml_mul_mat", p, [p, p, p]), ("ggml_new_graph", p, [p]),
            ("ggml_build_forward_expand", None, [p, p]), ("ggml_get_name", p, [p]),
            ("ggml_get_data", p, [p]), ("gguf_init_from_file", p, [C.c_char_p, _GgufInit]),
            ("gguf_find_tensor", i64, [p, C.c_char_p]), ("gguf_get_tensor_offset", sz, [p, i64]),
            ("gguf_get_data_offset", sz, [p]), ("gguf_get_tensor_type", C.c_int, [p, i64]),
            ("gguf_get_tensor_ne", C.POINTER(i64), [p, i64])]:
        f = getattr(base, name)
        f.restype, f.argtypes = res, args
    cpu.ggml_graph_compute_with_ctx.restype = C.c_int
    cpu.ggml_graph_compute_with_ctx.argtypes = [p, p, C.c_int]
    return base, cpu


class OutputLayer:
    """The model's output weights (output.weight, else the tied token_embd.weight) as a
    ggml tensor over the GGUF file's bytes; `__call__(h)` gives h's logits: one vec_dot
    column per row of h (`per_column`), else one matmul of all rows, which takes
    llama.cpp's own kernel for their count (tinyBLAS for 2+)."""

    def __init__(self, model: Model, threads: int = 2, max_rows: int = 64,
                 per_column: bool = True):
        self.base, self.cpu = base, cpu = _ggml()
        g = base.gguf_init_from_file(str(model.path).encode(), _GgufInit(True, None))
        tid = base.gguf_find_tensor(g, b"output.weight")
        if tid < 0:
            tid = base.gguf_find_tensor(g, b"token_embd.weight")
        off = base.gguf_get_data_offset(g) + base.gguf_get_tensor_offset(g, tid)
        ne = base.gguf_get_tensor_ne(g, tid)
        self.n_embd, self.n_vocab, wtype = ne[0], ne[1], base.gguf_get_tensor_type(g, tid)
        self.file = np.memmap(model.path, dtype=np.uint8, mode="r")
        self.wctx = base.ggml_init(_Init(1 << 16, None, True))
        self.w = base.ggml_new_tensor_2d(self.wctx, wtype, self.n_embd, self.n_vocab)
        assert C.c_void_p.from_address(self.w + DATA_OFF).value is None, "ggml_tensor layout"
        C.c_void_p.from_address(self.w + DATA_OFF).value = self.file.ctypes.data + off
        self.name_off = base.ggml_get_name(self.w) - self.w
        self.buf = np.zeros(max_rows * (self.n_vocab + 2 * self.n_embd) * 4 + (8 << 20), np.uint8)
        self.threads, self.per_column = threads, per_column

    def __call__(self, h: np.ndarray) -> np.ndarray:
        base, k = self.base, h.shape[0]
        ctx = base.ggml_init(_Init(self.buf.nbytes, self.buf.ctypes.data, False))
        try:
            x = (base.ggml_new_tensor_3d(ctx, GGML_TYPE_F32, self.n_embd, 1, k) if self.per_column
                 else base.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, self.n_embd, k))
            C.memmove(base.ggml_get_data(x), np.ascontiguousarray(h, np.float32).ctypes.data, h.size * 4)
            y = base.ggml_mul_mat(ctx, self.w, x)
            gf = base.ggml_new_graph(ctx)
            base.ggml_build_forward_expand(gf, y)
            self.cpu.ggml_graph_compute_with_ctx(ctx, gf, self.threads)
            out = C.cast(base.ggml_get_data(y), C.POINTER(C.c_float))
            return np.ctypeslib.as_array(out, shape=(k, self.n_vocab)).copy()
        finally:
            base.ggml_free(ctx)


class StopAtNorm:
    """An eval callback that keeps `result_norm`'s rows and, while `stop`, ends the graph
    there (ggml's scheduler skips the rest of the split when the callback returns false)."""

    def __init__(self, name_off: int):
        self.rows: list[np.ndarray] = []
        self.stop = True
        lc = _llama()

        @lc.ggml_backend_sched_eval_callback
        def cb(t, ask, _user):
            if ask:
                return C.string_at(t + name_off, 12) == b"result_norm\0"
            ne0, ne1 = (C.c_int64.from_address(t + NE_OFF + 8 * i).value for i in (0, 1))
            data = C.cast(C.c_void_p.from_address(t + DATA_OFF).value, C.POINTER(C.c_float))
            self.rows.append(np.ctypeslib.as_array(data, shape=(ne1, ne0)).copy())
            return not self.stop
        self.cb = cb


def check_identity(ctx: Context, head: OutputLayer, stop: StopAtNorm, toks: list[int]) -> None:
    """Print whether 8 rows of our output layer equal llama.cpp's bit for bit, and the
    one-token decode's time without the output layer. Leaves stream 0 at 900 cells."""
    stop.stop, stop.rows = False, []
    rows = ctx.run_rows([(0, toks[900:908], 900, True)], {}, {})[0]
    theirs = np.stack([ctx.logits_at(i) for i in rows])
    same = np.array_equal(head(np.concatenate(stop.rows)), theirs)
    print(f"own output layer rows bit-identical to llama.cpp's (8 rows): {same}")
    ctx.truncate(0, 900)
    stop.stop = True

    def one():
        ctx.run_rows([(0, toks[900:901], 900, True)], {}, {})
        ctx.truncate(0, 900)
    print(f"1-token decode stopped at result_norm: {median_ms(one):.1f} ms")


def main() -> None:
    model = Model(use_extra_bufts=False)
    head = OutputLayer(model)
    toks = list(model.tokenize(long_text(20000)))
    stop = StopAtNorm(head.name_off)
    shapes = [(1, 1), (1, 2), (2, 1), (4, 1), (4, 2), (8, 1), (1, 16)]
    times: dict[tuple, dict[str, float]] = {s: {} for s in shapes}
    for label, cb in (("llama.cpp", None), ("own", stop.cb)):
        ctx = make_context(model, 8, cb)
        stop.stop = False
        for s in range(8):  # 900 cells per stream
            for a, b in ((0, 512), (512, 900)):
                ctx.run_rows([(s, toks[s * 100 + a:s * 100 + b], a, False)], {}, {})
        stop.stop = True
        for n_seq, per in shapes:
            def step():
                stop.rows.clear()
                ctx.run_rows([(s, toks[s * 100 + 900:s * 100 + 900 + per], 900, True)
                          for s in range(n_seq)], {}, {})
                if cb is not None:
                    head(np.concatenate(stop.rows))
                for s in range(n_seq):
                    ctx.truncate(s, 900)
            times[(n_seq, per)][label] = median_ms(step)
        if cb is not None:
            check_identity(ctx, head, stop, toks)
        ctx.close()
    h = np.random.default_rng(0).standard_normal((16, head.n_embd)).astype(np.float32)
    for k in (1, 2, 4, 8, 16):
        print(f"own output layer, {k:2d} rows: {median_ms(lambda: head(h[:k])):.1f} ms")
    for (n_seq, per), t in times.items():
        print(f"{n_seq} streams x {per:2d} tokens, all logits: llama.cpp {t['llama.cpp']:.1f} ms, "
              f"stopped + own {t['own']:.1f} ms")


if __name__ == "__main__":
    main()
