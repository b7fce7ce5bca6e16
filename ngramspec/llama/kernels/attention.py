"""Flash attention computed by ngramspec: each query row's values independent of its batch.

llama.cpp's CPU flash attention sums a row's cells in an order that depends on the
batch: one row of one stream over 512+ F16 cells takes a split-KV path, 64+ rows of a
stream take a tiled path, everything else a one-row path. ngramspec kept exactness
around that (the reference-path switch for generation, rule T's 64-row prompt chunks),
and paid for it: the one-row path is ~19% of a 16-row verify decode and the tiled path
~35% of a prompt (docs/benchmarks-history.md). `native/attention.c` computes every
FLASH_ATTN_EXT node of a graph itself, a row's arithmetic fixed whatever its batch
(the file's header says how), with rows, heads and cells grouped so that K and V are
converted once per tile for all the heads and rows that read them.

How a context uses it: `Hook.install` puts the C eval callback into
llama_context_params (chaining the output layer's, head.py, when there is one).
ggml's scheduler asks the callback about every node before computing it; each
FLASH_ATTN_EXT node it supports (F32 queries, F16 K and V, no ALiBi, no soft-capping,
no sinks, head sizes multiples of 32 up to 512) becomes a GGML_OP_CUSTOM node of the
kernel, which ggml runs on its own threads in the graph's order (no split of the graph).
Any other attention node is left to llama.cpp, which computes it as before.

Invariants:
- whether a node is taken depends only on the graph's types and head sizes, never on
  the batch: every decode of a context computes attention the same way;
- the scratch memory is reserved before a node is taken; when it cannot be had the
  node is taken anyway and computes nothing (`oom`), and `check` raises MemoryError
  after that decode: never a row computed by another kernel;
- only batch-invariant contexts use it (ContextParams.own_attention).
Set NGRAMSPEC_OWN_ATTENTION=0 to turn it off.
"""
from __future__ import annotations

import ctypes as C

from . import ggml
from .kernel import HookArgs, Kernel
from .node_hook import OFFSET_FIELDS, NodeHook, offsets


class _AttnHook(C.Structure):
    """native/attention.c's attn_hook_t, field by field."""
    _fields_ = OFFSET_FIELDS + \
               [(n, C.c_int32) for n in ("op_fa", "op_custom", "type_f32", "type_f16", "nth",
                                         "enabled", "oom")] + \
               [("n_done", C.c_int64), ("n_declined", C.c_int64), ("next", C.c_void_p),
                ("next_user", C.c_void_p), ("work", C.c_void_p), ("work_floats", C.c_int64)]


SELFTEST_FAILURES = {1: "a row's values change with the rows and heads computed beside it",
                     2: "its values are not softmax attention's (a double-precision reference)",
                     -1: "no memory for its self-test"}


def selftest(lib: C.CDLL) -> str | None:
    """Why the kernel's own arithmetic does not hold on this CPU and build (its values are
    by design not llama.cpp's: a row's are the same whatever its batch), or None."""
    code = lib.ngs_attn_selftest()
    return None if code == 0 else f"self-test: {SELFTEST_FAILURES.get(code, code)}"


class Hook(NodeHook):
    """A context's attention callback (node_hook.NodeHook)."""

    free_fn, what = "ngs_attn_free", "attention"

    @classmethod
    def create(cls, lib: C.CDLL, args: HookArgs) -> "Hook":
        return cls(lib, args.n_threads)

    def __init__(self, lib: C.CDLL, n_threads: int):
        self.lib = lib
        self.hook = _AttnHook(**offsets(ggml.tensor_offsets()), op_fa=ggml.op_code("FLASH_ATTN_EXT"),
                              op_custom=ggml.op_code("CUSTOM"), type_f32=ggml.GGML_TYPE_F32,
                              type_f16=ggml.GGML_TYPE_F16, nth=max(1, n_threads), enabled=1)
        self.cb = C.cast(lib.ngs_attn_cb, C.c_void_p).value


#: its values differ from llama.cpp's (a row's whatever its batch): part of the cell mode
KERNEL = Kernel(name="attention", source="attention", env="NGRAMSPEC_OWN_ATTENTION",
                hook_struct=_AttnHook, functions={"ngs_attn_free": (None, [C.c_void_p]),
                                                  "ngs_attn_selftest": (C.c_int, [])},
                create=Hook.create, same_values=False, selftest=selftest)
