"""One descriptor per kernel: what it is called, where its C source is, how it is
switched off, what its library must show before it is used, and how a context hooks it.

Adding a kernel is one module in this package with one `Kernel` (its `KERNEL`), and one
entry in `KERNELS` (__init__.py).

`Kernel.state()` says, for this process, whether the kernel may run and if not why, in
this order: its switch (`env`=0), the process guard (guard.py: CPU, build, devices,
layouts), then for each instruction-set variant of `variants` (best first: build.VARIANTS)
that the CPU has the flags for (only the one `NGRAMSPEC_KERNEL_VARIANT` names, where set
and the kernel has it): its
compilation (build.py), the variant its library says it is, the sizes its C side exports
against the ctypes mirrors, and its self-test against the loaded llama.cpp where it has
one. The first variant that passes runs; a variant that fails a check leaves the next. A context
then asks `hook(...)` for its eval callback (None where the state is not active) and may
still decline it for reasons of its own (`Context.kernels`, kernels/hooks.py).

Invariant: a library is handed to a hook only after every check above passed; the
checks of a library run once per process.
"""
from __future__ import annotations

import ctypes as C
import os
from dataclasses import dataclass
from typing import Any, Callable

from . import build, guard


@dataclass(frozen=True)
class HookArgs:
    """What a context tells a kernel's hook: its embedding width, most rows of a decode,
    and the most threads a decode of it runs on."""

    n_embd: int
    n_batch: int
    n_threads: int


@dataclass(frozen=True)
class Kernel:
    """One kernel, described once. Invariant: `state()` hands out a library only after
    every check passed for it; `hook` gives no hook wherever `state()` gives no library."""

    name: str  # as in `ngramspec doctor` and ContextParams.own_<name> (where there is one)
    source: str  # native/<source>.c
    env: str  # <env>=0 turns it off
    hook_struct: type  # the ctypes mirror of the C struct its callback gets
    functions: dict[str, tuple[Any, list]]  # C functions: name -> (restype, argtypes)
    create: Callable[[C.CDLL, HookArgs], Any]  # the context's hook object on that library
    node_kernel: bool = True  # rewrites graph nodes as CUSTOM nodes (native/node.h)
    variants: tuple[str, ...] = ("avx2",)  # instruction sets its source has code for
    same_values: bool = True  # its values are llama.cpp's bit for bit
    selftest: Callable[[C.CDLL], str | None] | None = None  # why its values differ, or None

    def switched_off(self) -> bool:
        return os.environ.get(self.env, "1") == "0"

    def state(self) -> tuple[C.CDLL | None, str]:
        """(library, "") where the kernel may run in this process, else (None, why)."""
        if self.switched_off():
            return None, f"turned off ({self.env}=0)"
        reason = guard.blocker()
        if reason:
            return None, reason
        reasons, variants = [], self.candidates()
        for variant in variants:
            built = build.library(self.source, variant)
            reason = built.reason if built.lib is None else _checked(self, built.lib, variant)
            if not reason:
                return built.lib, ""
            reasons.append(f"{variant}: {reason}" if len(variants) > 1 else reason)
        return None, "; ".join(reasons) or (
            f"this CPU runs none of its variants ({', '.join(self.variants)})")

    def candidates(self) -> list[str]:
        """Its variants this CPU can run, best first; only the one NGRAMSPEC_KERNEL_VARIANT
        names where it has that one (a kernel without it keeps its own)."""
        want = os.environ.get("NGRAMSPEC_KERNEL_VARIANT")
        mine = [want] if want in self.variants else list(self.variants)
        have = guard.cpu_flags()
        return [v for v in build.VARIANTS if v in mine and set(build.VARIANTS[v][1]) <= have]

    def library(self) -> C.CDLL | None:
        return self.state()[0]

    def hook(self, args: HookArgs) -> tuple[Any, str]:
        """(a context's hook of this kernel, not yet installed, "") or (None, why it may
        not run)."""
        lib, reason = self.state()
        return (None, reason) if lib is None else (self.create(lib, args), "")


_CHECKED: dict[tuple[str, int], str | None] = {}


def variant_of(lib: C.CDLL) -> str:
    """The instruction-set variant a kernel library was compiled as."""
    if not hasattr(lib, "ngs_variant"):
        return "avx2"
    lib.ngs_variant.restype = C.c_char_p
    return lib.ngs_variant().decode()


def _checked(kernel: Kernel, lib: C.CDLL, variant: str = "avx2") -> str | None:
    """`_check`, once per kernel and library; also that the library is `variant`."""
    key = (kernel.name, lib._handle)
    if key not in _CHECKED:
        got = variant_of(lib)
        _CHECKED[key] = (f"its library is the {got} variant, not {variant}" if got != variant
                         else _check(kernel, lib))
    return _CHECKED[key]


def _check(kernel: Kernel, lib: C.CDLL) -> str | None:
    """Declares the library's functions; why its C side does not match what Python and
    ggml assume (struct sizes, a CUSTOM node's parameters) or its self-test fails, or None."""
    for fn, (restype, argtypes) in {**kernel.functions, "ngs_hook_size": (C.c_int64, []),
                                    "ngs_custom_offsets": (None, [C.c_void_p])}.items():
        if not hasattr(lib, fn):
            if fn == "ngs_custom_offsets" and not kernel.node_kernel:
                continue
            return f"its library lacks {fn}"
        getattr(lib, fn).restype, getattr(lib, fn).argtypes = restype, argtypes
    size, mirror = lib.ngs_hook_size(), C.sizeof(kernel.hook_struct)
    if size != mirror:
        return f"its C hook struct is {size} bytes, the ctypes mirror {mirror}"
    if kernel.node_kernel:
        out = (C.c_int64 * 3)()
        lib.ngs_custom_offsets(out)
        if tuple(out) != guard.CUSTOM_PARAMS:
            return f"its CUSTOM node parameters are at {tuple(out)}, ggml's at {guard.CUSTOM_PARAMS}"
    return kernel.selftest(lib) if kernel.selftest else None
