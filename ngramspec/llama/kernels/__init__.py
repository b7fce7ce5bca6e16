"""ngramspec's own kernels for parts of llama.cpp's graph: the output layer (head.py),
flash attention (attention.py) and the Q5_0, Q4_K and Q6_K matmuls (matmul.py), C code
in native/ (beside drafting.c, the drafters' hot loops: speculative/native.py).

Each is described once (`kernel.Kernel`, one per module, listed in `KERNELS`); whether
it may run in this process is decided by `Kernel.state()` (switch, process guard,
compilation, struct sizes, self-test: kernel.py) and, in a context, by the context
(`Context.kernels`, kernels/hooks.py). `python -m ngramspec.llama.kernels build` compiles them all.

The *cell mode* (`cell_mode`) names what of them changes KV cell values: attention's
do differ from llama.cpp's, the others' are llama.cpp's bit for bit. State that outlives
a process (slot files, a Ray job's workers) carries it, since cells computed in one mode
are not what the other mode computes (docs/exactness.md, "Kernel modes").
"""
from __future__ import annotations

from . import attention, head, matmul
from .kernel import HookArgs, Kernel, variant_of

#: every kernel, in the order a context chains their callbacks (the first is called last)
KERNELS: tuple[Kernel, ...] = (head.KERNEL, attention.KERNEL, matmul.KERNEL)
BY_NAME = {k.name: k for k in KERNELS}


def cell_mode(active: dict[str, bool]) -> str:
    """The cell mode of a context whose kernels are `active` (name -> on): the kernels
    on whose values differ from llama.cpp's, joined, or "llama.cpp"."""
    own = [k.name for k in KERNELS if not k.same_values and active.get(k.name)]
    return "+".join(f"own-{n}" for n in own) or "llama.cpp"


def states() -> dict[str, dict]:
    """Each kernel's state in this process: {"active": bool, "reason": str, "variant":
    the instruction-set variant that runs, or ""}."""
    out = {}
    for k in KERNELS:
        lib, reason = k.state()
        out[k.name] = {"active": lib is not None, "reason": reason or "passes every check",
                       "variant": variant_of(lib) if lib is not None else ""}
    return out


def line(states_: dict[str, dict], mode: str) -> str:
    """One line of a context's kernel states (`KernelHooks.state`, kernels/hooks.py) and
    cell mode, as serve, batch and generate --verbose print it at start."""
    parts = [f"{n} on ({st.get('variant') or '?'})" if st["active"] else f"{n} off ({st['reason']})"
             for n, st in states_.items()]
    return f"kernels: {', '.join(parts)}; KV cells: {mode}"


__all__ = ["KERNELS", "BY_NAME", "HookArgs", "Kernel", "cell_mode", "line", "states", "variant_of"]
