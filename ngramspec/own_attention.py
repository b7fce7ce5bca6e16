"""Flash attention computed by ngramspec: each query row's values independent of its batch.

llama.cpp's CPU flash attention sums a row's cells in an order that depends on the
batch: one row of one stream over 512+ F16 cells takes a split-KV path, 64+ rows of a
stream take a tiled path, everything else a one-row path. ngramspec kept exactness
around that (the reference-path switch for generation, rule T's 64-row prompt chunks),
and paid for it: the one-row path is ~19% of a 16-row verify decode and the tiled path
~35% of a prompt (docs/benchmarks.md). `native/attention.c` computes every
FLASH_ATTN_EXT node of a graph itself, a row's arithmetic fixed whatever its batch
(the file's header says how), with rows, heads and cells grouped so that K and V are
converted once per tile for all the heads and rows that read them.

How a context uses it: `Hook.install` puts the C eval callback into
llama_context_params (chaining the output layer's, own_head.py, when there is one).
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
import os
from functools import cache

from . import native_lib


class _AttnHook(C.Structure):
    """native/attention.c's attn_hook_t, field by field."""
    _fields_ = [(n, C.c_int64) for n in ("type_off", "ne_off", "nb_off", "op_off",
                                         "op_params_off", "src_off", "data_off")] + \
               [(n, C.c_int32) for n in ("op_fa", "op_custom", "type_f32", "type_f16", "nth",
                                         "enabled", "oom")] + \
               [("n_done", C.c_int64), ("n_declined", C.c_int64), ("next", C.c_void_p),
                ("next_user", C.c_void_p), ("work", C.c_void_p), ("work_floats", C.c_int64)]


def wanted() -> bool:
    """Whether this machine runs the kernel (native_lib.cpu_ok) and it is not turned off
    (NGRAMSPEC_OWN_ATTENTION=0)."""
    return os.environ.get("NGRAMSPEC_OWN_ATTENTION", "1") != "0" and native_lib.cpu_ok()


@cache
def library() -> C.CDLL | None:
    """The compiled kernel, or None where it cannot be had or is turned off."""
    lib = native_lib.library("attention") if wanted() else None
    if lib is None:
        return None
    lib.ngs_attn_free.restype, lib.ngs_attn_free.argtypes = None, [C.c_void_p]
    return lib


class Hook:
    """A context's attention callback (and the callback it chains, if any)."""

    @classmethod
    def create(cls, n_threads: int) -> "Hook | None":
        lib = library()
        off = native_lib.tensor_offsets()
        op_fa, op_custom = native_lib.op_code("FLASH_ATTN_EXT"), native_lib.op_code("CUSTOM")
        if lib is None or off is None or op_fa is None or op_custom is None:
            return None
        return cls(lib, off, op_fa, op_custom, n_threads)

    def __init__(self, lib: C.CDLL, off: dict[str, int], op_fa: int, op_custom: int,
                 n_threads: int):
        self.lib = lib
        self.hook = _AttnHook(type_off=off["type"], ne_off=off["ne"], nb_off=off["nb"],
                              op_off=off["op"], op_params_off=off["op_params"],
                              src_off=off["src"], data_off=off["data"], op_fa=op_fa,
                              op_custom=op_custom, type_f32=native_lib.GGML_TYPE_F32,
                              type_f16=native_lib.GGML_TYPE_F16, nth=max(1, n_threads),
                              enabled=1)
        self.cb = C.cast(lib.ngs_attn_cb, C.c_void_p).value

    def install(self, cparams) -> None:
        """Become cparams' eval callback; a callback already there (own_head's) is chained:
        it gets every node this one does not take."""
        import llama_cpp

        if cparams.cb_eval:
            self.hook.next = C.cast(cparams.cb_eval, C.c_void_p).value
            self.hook.next_user = cparams.cb_eval_user_data
        cparams.cb_eval = C.cast(self.cb, llama_cpp.ggml_backend_sched_eval_callback)
        cparams.cb_eval_user_data = C.cast(C.pointer(self.hook), C.c_void_p)

    @property
    def n_done(self) -> int:
        """FLASH_ATTN_EXT nodes taken so far (one per layer and ubatch)."""
        return self.hook.n_done

    @property
    def n_declined(self) -> int:
        """FLASH_ATTN_EXT nodes left to llama.cpp so far."""
        return self.hook.n_declined

    def check(self) -> None:
        """After a decode: raise if a node could not be computed for want of memory (the
        decode's rows are not to be used)."""
        if self.hook.oom:
            self.hook.oom = 0
            raise MemoryError("attention could not allocate its scratch memory")

    def close(self) -> None:
        self.lib.ngs_attn_free(C.byref(self.hook))
