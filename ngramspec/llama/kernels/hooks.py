"""The kernel hooks of one llama.cpp context: which of `KERNELS` it runs, and why not.

Invariants: hooks are installed into the context's llama_context_params before the
context exists, each chaining the ones before it, and only in a batch-invariant
context; a kernel without a hook has its reason; the node hooks (attention, matmul)
are freed after the context, whose graphs call into them until then.
"""
from __future__ import annotations

from . import KERNELS, HookArgs, cell_mode, line, variant_of

#: what a head hook whose start-up check failed on this context says
HEAD_UNCHECKED = ("its start-up check did not find llama.cpp's rows (no plain Q8_0 "
                  "output weight, or other values)")


class KernelHooks:
    """The hooks a context runs, by kernel name, and each missing one's reason."""

    def __init__(self, lc, model_ptr, params, cp):
        """Install into llama_context_params `cp` the hooks `params` (a ContextParams)
        allows. The scratch is sized for the most threads a decode of the context runs
        on (a node run on more threads leaves the rest idle: native/node.h)."""
        self.hooks: dict = {}
        self.reasons: dict[str, str] = {}
        args = HookArgs(lc.llama_model_n_embd(model_ptr), params.n_batch,
                        max(params.n_threads, params.n_threads_batch or 0))
        for k in KERNELS:
            if not params.batch_invariant or not getattr(params, f"own_{k.name}", True):
                self.reasons[k.name] = ("the context is not batch-invariant"
                                        if not params.batch_invariant else
                                        "not used by this context")
                continue
            hook, reason = k.hook(args)
            if hook is None:
                self.reasons[k.name] = reason
                continue
            hook.install(cp)
            self.hooks[k.name] = hook
        self._nodes = [self.hooks[n] for n in ("attention", "matmul") if n in self.hooks]

    def get(self, name: str):
        """The hook of kernel `name`, or None."""
        return self.hooks.get(name)

    def check(self) -> None:
        """After a decode: raise what a node hook met (attention, matmul)."""
        for hook in self._nodes:
            hook.check()

    def state(self) -> dict[str, dict]:
        """Each kernel: {"active": bool, "reason": str, "variant": str}, and "scope" when
        active ("own", or the matmul's "q5_0" with NGRAMSPEC_OWN_KQUANT=0; the output
        layer is active once its start-up check passed)."""
        out = {}
        for k in KERNELS:
            hook = self.hooks.get(k.name)
            if hook is None:
                out[k.name] = {"active": False, "reason": self.reasons.get(k.name, ""),
                               "variant": ""}
            elif not getattr(hook, "active", True):  # a hook checked on the context (head)
                out[k.name] = {"active": False, "reason": HEAD_UNCHECKED, "variant": ""}
            else:
                out[k.name] = {"active": True, "reason": "passes every check",
                               "variant": variant_of(hook.lib),
                               "scope": getattr(hook, "scope", "own")}
                if getattr(hook, "one_row_ms", None):
                    ours, theirs = hook.one_row_ms
                    which = "ours" if hook.one_row else "llama.cpp's"
                    out[k.name]["one_row"] = (f"{which} (ours {ours:.2f} ms, llama.cpp's "
                                              f"{theirs:.2f} ms)")
        return out

    @property
    def cell_mode(self) -> str:
        """What computes the context's KV cells (kernels.cell_mode)."""
        return cell_mode({n: h is not None for n, h in self.hooks.items()})

    def line(self) -> str:
        """The kernel states and cell mode in one line (kernels.line)."""
        return line(self.state(), self.cell_mode)

    def close(self) -> None:
        """Free the node hooks (after the context is freed)."""
        for name in ("attention", "matmul"):
            hook = self.hooks.pop(name, None)
            if hook is not None:
                hook.close()
