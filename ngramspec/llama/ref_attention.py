"""Flash attention's reference path for a llama.cpp context: a lone token needs no
padding row (rule U1, docs/exactness.md).

ggml's CPU flash attention takes a *split-KV* path for a single query row of a single
stream over an F16 K/V cache of 512+ cells: the threads each sum a part of the KV
range and the partial softmaxes are merged, another summation order than the one
the same row gets among other rows. So with llama.cpp's default F16 cache a token
alone in a ubatch gets other logits than in a batch, and ngramspec pads such a token
with a dummy row, ~22% of a one-token step on a 2-core CPU.

The CPU backend has a switch for that: `ggml_backend_cpu_set_use_ref(backend, true)`
makes flash attention compute every query row with its one-row kernel over the whole
KV range (no split-KV path, no tiled path for 64+ rows); it also turns off op fusion
(which changes no value here, measured). The weight matmuls are untouched. A row then
gets the same values whatever else its ubatch holds, alone included. llama.cpp does
not hand out a context's CPU backend, so `enable` finds it: `llama_set_abort_callback`
writes a marker into the context object's `abort_callback_data` field, which follows
its `backend_cpu` field; the words before the marker are searched for a pointer to a
backend whose guid is the CPU backend's (read from a backend this module creates),
every address checked against the process's readable mappings before it is read. If
anything is not as expected (another OS, another layout, a missing symbol) nothing is
changed and the context keeps rule U1's padding row.

The switch has one other effect that matters: a matmul marked as a Hadamard rotation
(llama.cpp rotates K and V before a *quantized* cache, and always for a few
architectures' indexers) is then computed as an ordinary float matmul, whose values
depend on how many columns it has (sgemm's tiles). So it is set only where the K/V
cache is F16/F16 (F32 is cast to F16) and the architecture does not rotate anyway
(`wanted`); a quantized cache needs no switch, its flash attention never splits.

Invariant: `enable` returns a backend only after it has set the flag on the backend of
*that* context; the flag stays until the context is freed, except inside `suspended`
(a prefill chunk of rule T, which needs the tiled path).
"""
from __future__ import annotations

import ctypes
from contextlib import contextmanager
from functools import cache

from .host import loaded
from .ubatch import f16_attention

#: how far before `abort_callback_data` the search looks for `backend_cpu` (bytes)
_SEARCH_BACK = 256
_PTR = ctypes.sizeof(ctypes.c_void_p)


#: architectures whose K/V get a Hadamard rotation whatever the cache type (llama-kv-cache.cpp)
ROTATING_ARCHS = frozenset({"deepseek32", "deepseek4", "glm-dsa", "dots3note"})


def wanted(type_k: str, type_v: str, arch: str) -> bool:
    """Whether a context with this K/V pair and architecture needs the reference path (an
    F16/F16 cache: flash attention's split-KV path) and keeps its values exact with it
    (no Hadamard rotation, which the switch would move to a column-count-dependent matmul)."""
    return f16_attention(type_k, type_v) and bool(arch) and arch not in ROTATING_ARCHS


@cache
def _libggml_cpu() -> ctypes.CDLL | None:
    """The libggml-cpu that llama.cpp loaded (the same copy: its mapped path), or None."""
    lib = loaded("ggml-cpu")
    if lib is None:
        return None
    try:
        lib.ggml_backend_cpu_init.restype = ctypes.c_void_p
        lib.ggml_backend_cpu_init.argtypes = []
        lib.ggml_backend_cpu_set_use_ref.restype = None
        lib.ggml_backend_cpu_set_use_ref.argtypes = [ctypes.c_void_p, ctypes.c_bool]
        lib.ggml_backend_is_cpu.restype = ctypes.c_bool
        lib.ggml_backend_is_cpu.argtypes = [ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    return lib


@cache
def _cpu_guid() -> bytes | None:
    """The 16 bytes of the CPU backend's guid (the first field of a ggml_backend points
    to them), read from a backend created and left for the process (a few bytes)."""
    lib = _libggml_cpu()
    b = lib.ggml_backend_cpu_init() if lib else None
    if not b:
        return None
    return ctypes.string_at(ctypes.c_void_p.from_address(b).value, 16)


def _readable() -> list[tuple[int, int]]:
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            span, perms = line.split()[:2]
            if perms.startswith("r"):
                lo, hi = span.split("-")
                out.append((int(lo, 16), int(hi, 16)))
    return out


def _find_backend(ctx_ptr: int, marker: int) -> int | None:
    """The context's CPU backend: the first word before `marker` (the context's
    abort_callback_data) that points to a backend with the CPU guid."""
    guid, spans = _cpu_guid(), _readable()

    def word(addr: int) -> int | None:
        if not any(lo <= addr and addr + _PTR <= hi for lo, hi in spans):
            return None
        return ctypes.c_void_p.from_address(addr).value or 0

    for off in range(0, 16384, _PTR):  # the llama_context object is ~1 KB
        w = word(ctx_ptr + off)
        if w is None:
            return None
        if w != marker:
            continue
        for back in range(_PTR, min(off, _SEARCH_BACK) + 1, _PTR):
            cand = word(ctx_ptr + off - back)
            g = word(cand) if cand else None
            if g and word(g) is not None and word(g + _PTR) is not None \
                    and ctypes.string_at(g, 16) == guid:
                return cand
        return None
    return None


def enable(lc, ctx_ptr) -> int | None:
    """Set the reference path on the CPU backend of llama context `ctx_ptr` (`lc`: the
    llama_cpp module); returns the backend (for `suspended`), or None if it was not found
    (the context is unchanged)."""
    lib = _libggml_cpu()
    if lib is None or _cpu_guid() is None:
        return None
    marker = ctypes.create_string_buffer(16)
    no_callback = ctypes.cast(None, lc.ggml_abort_callback)
    addr = ctypes.cast(ctx_ptr, ctypes.c_void_p).value
    lc.llama_set_abort_callback(ctx_ptr, no_callback, ctypes.addressof(marker))
    try:
        backend = _find_backend(addr, ctypes.addressof(marker))
    finally:
        lc.llama_set_abort_callback(ctx_ptr, no_callback, None)
    if backend is None or not lib.ggml_backend_is_cpu(backend):
        return None
    lib.ggml_backend_cpu_set_use_ref(backend, True)
    return backend


@contextmanager
def suspended(backend: int | None):
    """The reference path of a backend found by `enable` off for the block, then on
    again; nothing for None (a context without it)."""
    if backend is None:
        yield
        return
    lib = _libggml_cpu()
    lib.ggml_backend_cpu_set_use_ref(backend, False)
    try:
        yield
    finally:
        lib.ggml_backend_cpu_set_use_ref(backend, True)
