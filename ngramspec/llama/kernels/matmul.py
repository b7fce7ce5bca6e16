"""Matrix products with Q5_0, Q4_K and Q6_K weights computed by ngramspec, bit-identical
to llama.cpp's.

Gemma 3's Q4_K_M file keeps attn_q/k/v, ffn_gate and ffn_up in Q5_0: about half of a
prompt's time and a quarter of a verify decode's. llama.cpp multiplies them with
llamafile's tinyBLAS (2+ columns) or `vec_dot_q5_0_q8_0` (one), which unpack each 5-bit
weight block again for every few columns. `native/matmul.c` unpacks a tile of weight rows
once into Q8_0 blocks (a Q5_0 block holds integers -16..15 and one scale, so that is
exact) and runs it against every column with the Q8_0 kernel of the output layer, in
ggml's own arithmetic order for each (row, column): every value equals llama.cpp's bit
for bit, and depends on nothing else in the batch. Q4_K and Q6_K (attn_output and
ffn_down here; most weights of most GGUF files) run llama.cpp's one-column vec_dot per
column in exact mode; `native/kquant.h` unpacks each 256-value super-block once for up
to 8 columns, each column then taking ggml's own operations (NGRAMSPEC_OWN_KQUANT=0
leaves the K-quants to llama.cpp).

How a context uses it: `Hook.install` chains its C eval callback in front of the ones
installed before it (node_hook.py). Each MUL_MAT node with a plain (not repacked)
contiguous Q5_0, Q4_K or Q6_K weight, F32 columns and at least `min_cols` columns becomes a
GGML_OP_CUSTOM node of the kernel. `kernel's self-test (`selftest`, run once by kernel.py) first compares it with the
`vec_dot` of the llama.cpp library loaded (`ngs_mm_selftest`, 1,200 values): a build whose
arithmetic differs (another CPU path) gets no hook, so a column's values never depend on
which of the two computed it.

Invariants: only batch-invariant contexts use it (ContextParams.own_matmul); used only
where the start-up comparison found every value identical; scratch memory failure ->
MemoryError after the decode (node_hook.py). Set NGRAMSPEC_OWN_MATMUL=0 to turn it off.
"""
from __future__ import annotations

import ctypes as C
import os

from . import ggml
from .kernel import HookArgs, Kernel
from .node_hook import OFFSET_FIELDS, NodeHook, offsets

GGML_TYPE_Q5_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_K = 6, 12, 14, 15
#: the K-quants this kernel computes (their switch: NGRAMSPEC_OWN_KQUANT=0 leaves them to
#: llama.cpp while Q5_0 stays ours)
KQUANTS = {"Q4_K": GGML_TYPE_Q4_K, "Q6_K": GGML_TYPE_Q6_K}


def kquants_on() -> bool:
    """Whether hooks take the Q4_K / Q6_K nodes (NGRAMSPEC_OWN_KQUANT, read once a hook)."""
    return os.environ.get("NGRAMSPEC_OWN_KQUANT", "1") != "0"


class _MatmulHook(C.Structure):
    """native/matmul.c's mm_hook_t, field by field."""
    _fields_ = OFFSET_FIELDS + [("extra_off", C.c_int64)] + \
               [(n, C.c_int32) for n in ("op_mul_mat", "op_custom", "type_f32", "type_q5_0",
                                         "type_q4_k", "type_q6_k", "nth", "enabled", "oom",
                                         "min_cols")] + \
               [("n_done", C.c_int64), ("n_declined", C.c_int64), ("next", C.c_void_p),
                ("next_user", C.c_void_p), ("quantize", C.c_void_p), ("quantize_k", C.c_void_p),
                ("work", C.c_void_p),
                ("work_bytes", C.c_int64)]


def selftest(lib: C.CDLL) -> str | None:
    """Why the kernel does not compute what the loaded llama.cpp computes, bit for bit
    (against the CPU backend's vec_dot: 1,200 Q5_0 values, 744 of Q4_K and of Q6_K), or
    None."""
    traits = ggml.traits(GGML_TYPE_Q5_0)
    if traits.vec_dot_type != ggml.GGML_TYPE_Q8_0 or not traits.vec_dot:
        return "llama.cpp's Q5_0 dot product is not the one verified"
    if lib.ngs_mm_selftest(ggml.from_float(ggml.GGML_TYPE_Q8_0), traits.vec_dot) != 0:
        return "its values differ from llama.cpp's vec_dot_q5_0_q8_0 on this CPU (self-test)"
    quantize_k = ggml.from_float(GGML_TYPE_Q8_K)
    for name, type_ in KQUANTS.items():
        t = ggml.traits(type_)
        if t.vec_dot_type != GGML_TYPE_Q8_K or t.nrows != 1 or not t.vec_dot or not quantize_k:
            return f"llama.cpp's {name} dot product is not the one verified"
        if lib.ngs_mm_selftest_k(int(type_ == GGML_TYPE_Q6_K), quantize_k, t.vec_dot) != 0:
            return (f"its values differ from llama.cpp's vec_dot_{name.lower()}_q8_k on this CPU "
                    "(self-test)")
    return None


class Hook(NodeHook):
    """A context's Q5_0 matmul callback (node_hook.NodeHook)."""

    free_fn, what = "ngs_mm_free", "the Q5_0 matmul"

    @classmethod
    def create(cls, lib: C.CDLL, args: HookArgs, min_cols: int = 2) -> "Hook":
        """A hook taking nodes of min_cols or more columns (one column: llama.cpp's
        vec_dot, the same values)."""
        return cls(lib, args.n_threads, min_cols)

    def __init__(self, lib: C.CDLL, n_threads: int, min_cols: int):
        off = ggml.tensor_offsets()
        kq = kquants_on()
        self.lib = lib
        self.scope = "own" if kq else "q5_0"  # the cost key's name for what it takes
        self.hook = _MatmulHook(**offsets(off), extra_off=off["extra"],
                                op_mul_mat=ggml.op_code("MUL_MAT"), op_custom=ggml.op_code("CUSTOM"),
                                type_f32=ggml.GGML_TYPE_F32, type_q5_0=GGML_TYPE_Q5_0,
                                type_q4_k=GGML_TYPE_Q4_K if kq else -1,
                                type_q6_k=GGML_TYPE_Q6_K if kq else -1,
                                nth=max(1, n_threads), enabled=1, min_cols=max(1, min_cols),
                                quantize=ggml.from_float(ggml.GGML_TYPE_Q8_0),
                                quantize_k=ggml.from_float(GGML_TYPE_Q8_K))
        self.cb = C.cast(lib.ngs_mm_cb, C.c_void_p).value


KERNEL = Kernel(name="matmul", source="matmul", env="NGRAMSPEC_OWN_MATMUL", hook_struct=_MatmulHook,
                functions={"ngs_mm_free": (None, [C.c_void_p]),
                           "ngs_mm_selftest": (C.c_int, [C.c_void_p, C.c_void_p]),
                           "ngs_mm_selftest_k": (C.c_int, [C.c_int, C.c_void_p, C.c_void_p])},
                create=Hook.create, selftest=selftest, variants=("avx512vnni", "avx2"))
