"""What ngramspec's graph-node kernels share (attention.py, matmul.py).

Each kernel has an eval callback in C (llama.cpp's public `cb_eval`) that ggml's scheduler
asks about every node of a graph before computing it; a node the kernel supports becomes
a GGML_OP_CUSTOM node of the kernel in place (`native/node.h`), which ggml then runs on
its own threads in the graph's order. A context installs its callbacks one after the
other, each chaining the one installed before it, so every node is offered to each.

Invariants: a hook's C struct begins with struct ggml_tensor's field offsets
(`OFFSET_FIELDS`, node.h's node_offsets_t) and holds `next`, `next_user`, `oom`,
`n_done` and `n_declined`; a node whose scratch memory could not be had computes nothing
and `check` raises after that decode, so no row is ever computed by another kernel.
"""
from __future__ import annotations

import ctypes as C

#: node.h's node_offsets_t, field by field: offsets of struct ggml_tensor's fields
OFFSET_FIELDS = [(n, C.c_int64) for n in ("type_off", "ne_off", "nb_off", "op_off",
                                          "op_params_off", "src_off", "data_off")]


def offsets(off: dict[str, int]) -> dict[str, int]:
    """OFFSET_FIELDS' values from ggml.tensor_offsets()."""
    return {f"{k}_off": off[k] for k in ("type", "ne", "nb", "op", "op_params", "src", "data")}


class NodeHook:
    """A context's callback of one kernel. Subclasses set `lib`, `hook` (the C struct),
    `cb` (the C callback's address), `free_fn` (the C function freeing its scratch) and
    `what` (the kernel, for errors)."""

    lib: C.CDLL
    hook: C.Structure
    cb: int
    free_fn: str
    what: str

    def install(self, cparams) -> None:
        """Become cparams' eval callback; a callback already there is chained: it gets
        every node, after this one has seen it."""
        import llama_cpp

        if cparams.cb_eval:
            self.hook.next = C.cast(cparams.cb_eval, C.c_void_p).value
            self.hook.next_user = cparams.cb_eval_user_data
        cparams.cb_eval = C.cast(self.cb, llama_cpp.ggml_backend_sched_eval_callback)
        cparams.cb_eval_user_data = C.cast(C.pointer(self.hook), C.c_void_p)

    @property
    def n_done(self) -> int:
        """Nodes taken so far (one per layer and ubatch for each node kind it takes)."""
        return self.hook.n_done

    @property
    def n_declined(self) -> int:
        """Nodes of the kind it takes left to llama.cpp so far."""
        return self.hook.n_declined

    def check(self) -> None:
        """After a decode: raise if a node could not be computed for want of memory (the
        decode's rows are not to be used)."""
        if self.hook.oom:
            self.hook.oom = 0
            raise MemoryError(f"{self.what} could not allocate its scratch memory")

    def close(self) -> None:
        getattr(self.lib, self.free_fn)(C.byref(self.hook))
