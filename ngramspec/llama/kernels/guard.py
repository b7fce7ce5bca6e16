"""Whether ngramspec's kernels may run in this process at all, and if not, why.

The kernels take nodes of llama.cpp's graph and compute them on the CPU, reading ggml's
structs in place; they were verified against one build of llama.cpp. So they run only
where every one of these holds (`blocker()` names the first that does not):

1. the CPU: x86-64 with AVX2, FMA and F16C (the instruction sets they are compiled for);
2. ggml's libraries are the ones llama.cpp loaded, found in this process;
3. the build: llama-cpp-python `VERIFIED_LLAMA_CPP` with ggml `VERIFIED_GGML` (another
   version may move any field, op code or parameter they read);
4. the devices: the CPU is llama.cpp's only device. With a GPU or other accelerator
   backend (CUDA, Vulkan, Metal, BLAS, ...) a node may be scheduled on it, or offloaded
   there even with -ngl 0, and a CUSTOM node or a pointer into device memory would abort
   the process;
5. the layouts, read back from objects ggml makes here: struct ggml_tensor's offsets
   (ggml.py), the op codes by name, a CUSTOM node's parameters (function, task count,
   user data: node.h's custom_params_t), flash attention's (scale, max_bias, softcap;
   mask and sinks as sources 3 and 4), and the CPU type traits (struct sizes by their
   contents, function pointers inside libggml-cpu).

Invariant: checks 5 call into ggml only after 1-4 passed, so no object of an unverified
build is ever made or read; anything not verified leaves every node to llama.cpp.
"""
from __future__ import annotations

import ctypes as C
import os
import platform
from functools import cache

from ..host import cpu_flags, loaded
from . import ggml

VERIFIED_LLAMA_CPP = "0.3.36"
VERIFIED_GGML = "0.25.3"
REQUIRED_FLAGS = ("avx2", "fma", "f16c")
#: byte offsets of fun, n_tasks and userdata in ggml's struct ggml_custom_op_params
CUSTOM_PARAMS = (0, 8, 16)
GGML_TYPE_Q5_0 = 6
DEVICE_TYPES = {0: "CPU", 1: "GPU", 2: "integrated GPU", 3: "accelerator"}


def cpu_reason() -> str | None:
    """Why this CPU cannot run the kernels, or None."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the CPU is {platform.machine()}, the kernels are x86-64 (AVX2) code"
    missing = [f for f in REQUIRED_FLAGS if f not in cpu_flags()]
    return f"the CPU lacks {', '.join(missing)}" if missing else None


def build_reason() -> str | None:
    """Why the loaded llama.cpp is not the verified build, or None."""
    import llama_cpp

    have = getattr(llama_cpp, "__version__", "?")
    if have != VERIFIED_LLAMA_CPP:
        return (f"llama-cpp-python {have} is loaded; the kernels are verified against "
                f"{VERIFIED_LLAMA_CPP} only")
    ggml_version = ggml.version().split(" ")[0]
    if ggml_version != VERIFIED_GGML:
        return f"ggml {ggml_version} is loaded; the kernels are verified against {VERIFIED_GGML} only"
    return None


def devices() -> list[tuple[str, str]]:
    """llama.cpp's backend devices as (name, type), in registry order ([] if unknown)."""
    lib = loaded("ggml")
    if lib is None:
        return []
    lib.ggml_backend_dev_count.restype = C.c_size_t
    lib.ggml_backend_dev_get.restype, lib.ggml_backend_dev_get.argtypes = C.c_void_p, [C.c_size_t]
    lib.ggml_backend_dev_name.restype, lib.ggml_backend_dev_name.argtypes = C.c_char_p, [C.c_void_p]
    lib.ggml_backend_dev_type.restype, lib.ggml_backend_dev_type.argtypes = C.c_int, [C.c_void_p]
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        out.append((lib.ggml_backend_dev_name(dev).decode(errors="replace"),
                    DEVICE_TYPES.get(lib.ggml_backend_dev_type(dev), "unknown")))
    return out


def device_reason() -> str | None:
    """Why llama.cpp's devices rule the kernels out (any device besides the CPU), or None."""
    found = devices()
    if not found:
        return "llama.cpp's device registry cannot be read"
    other = [f"{n} ({t})" for n, t in found if t != "CPU"]
    if other:
        return (f"llama.cpp has a device besides the CPU: {', '.join(other)} (graph nodes may "
                f"run there, the kernels are CPU code)")
    return None


def layout_reason() -> str | None:
    """Why what the kernels read of ggml is not laid out as verified, or None."""
    if ggml.tensor_offsets() is None:
        return "struct ggml_tensor is not laid out as verified"
    missing = [n for n in ggml.OP_CODES if ggml.op_code(n) is None]
    if missing:
        return f"ggml's op codes differ ({', '.join(missing)})"
    for check in (_custom_params, _flash_attn_params, _type_traits):
        reason = check()
        if reason:
            return reason
    return None


def _custom_params() -> str | None:
    base, off = ggml.ggml()[0], ggml.TENSOR_OFFSETS
    fn = C.CFUNCTYPE(None, C.c_void_p, C.c_int, C.c_int, C.c_void_p)(lambda *a: None)
    base.ggml_custom_4d.restype = C.c_void_p
    base.ggml_custom_4d.argtypes = [C.c_void_p, C.c_int] + [C.c_int64] * 4 + \
        [C.c_void_p, C.c_int, C.c_void_p, C.c_int, C.c_void_p]
    with ggml.Scratch() as ctx:
        src = base.ggml_new_tensor_2d(ctx, ggml.GGML_TYPE_F32, 4, 1)
        args = (C.c_void_p * 1)(src)
        node = base.ggml_custom_4d(ctx, ggml.GGML_TYPE_F32, 4, 1, 1, 1, args, 1,
                                   C.cast(fn, C.c_void_p), 3, 0x5A5A0)
        p = node + off["op_params"]
        got = (C.c_void_p.from_address(p + CUSTOM_PARAMS[0]).value,
               C.c_int.from_address(p + CUSTOM_PARAMS[1]).value,
               C.c_void_p.from_address(p + CUSTOM_PARAMS[2]).value,
               C.c_int.from_address(node + off["op"]).value,
               C.c_void_p.from_address(node + off["src"]).value)
    want = (C.cast(fn, C.c_void_p).value, 3, 0x5A5A0, ggml.op_code("CUSTOM"), src)
    return None if got == want else "a CUSTOM node's parameters are not laid out as verified"


def _flash_attn_params() -> str | None:
    base, off = ggml.ggml()[0], ggml.TENSOR_OFFSETS
    base.ggml_flash_attn_ext.restype = C.c_void_p
    base.ggml_flash_attn_ext.argtypes = [C.c_void_p] * 5 + [C.c_float] * 3
    base.ggml_flash_attn_ext_add_sinks.argtypes = [C.c_void_p, C.c_void_p]
    with ggml.Scratch() as ctx:
        q = base.ggml_new_tensor_4d(ctx, ggml.GGML_TYPE_F32, 64, 2, 4, 1)
        k, v = (base.ggml_new_tensor_4d(ctx, ggml.GGML_TYPE_F16, 64, 8, 2, 1) for _ in "kv")
        mask = base.ggml_new_tensor_4d(ctx, ggml.GGML_TYPE_F16, 8, 2, 1, 1)
        sinks = base.ggml_new_tensor_4d(ctx, ggml.GGML_TYPE_F32, 4, 1, 1, 1)
        node = base.ggml_flash_attn_ext(ctx, q, k, v, mask, 0.125, 0.5, 3.0)
        base.ggml_flash_attn_ext_add_sinks(node, sinks)
        params = [C.c_float.from_address(node + off["op_params"] + 4 * i).value for i in range(3)]
        srcs = [C.c_void_p.from_address(node + off["src"] + 8 * i).value for i in range(5)]
        op = C.c_int.from_address(node + off["op"]).value
    if params == [0.125, 0.5, 3.0] and srcs == [q, k, v, mask, sinks] and op == ggml.op_code("FLASH_ATTN_EXT"):
        return None
    return "flash attention's parameters are not laid out as verified"


def _type_traits() -> str | None:
    cpu = loaded("ggml-cpu")
    for type_ in (ggml.GGML_TYPE_Q8_0, GGML_TYPE_Q5_0):
        t = ggml.traits(type_)
        if t.vec_dot_type != ggml.GGML_TYPE_Q8_0 or t.nrows != 1:
            return "the CPU backend's type traits are not laid out as verified"
        if not (_in_library(t.from_float, cpu) and _in_library(t.vec_dot, cpu)):
            return "the CPU backend's type traits point outside libggml-cpu"
    return None


class _DlInfo(C.Structure):
    _fields_ = [("dli_fname", C.c_char_p), ("dli_fbase", C.c_void_p),
                ("dli_sname", C.c_char_p), ("dli_saddr", C.c_void_p)]


def _in_library(addr: int | None, lib: C.CDLL | None) -> bool:
    """Whether code address `addr` lies in the shared object `lib` (by dladdr)."""
    if not addr or lib is None:
        return False
    info = _DlInfo()
    libc = C.CDLL(None)
    libc.dladdr.argtypes = [C.c_void_p, C.POINTER(_DlInfo)]
    if not libc.dladdr(C.c_void_p(addr), C.byref(info)) or not info.dli_fname:
        return False
    return os.path.realpath(info.dli_fname.decode(errors="replace")) == os.path.realpath(lib._name)


@cache
def blocker() -> str | None:
    """Why no kernel may run in this process (the first check that fails), or None.
    Needs llama.cpp loaded (a model loaded or `import llama_cpp`)."""
    reason = cpu_reason()
    if reason:
        return reason
    import llama_cpp  # noqa: F401  (maps ggml's libraries)

    if ggml.ggml() is None:
        return "ggml's libraries are not found in this process"
    return build_reason() or device_reason() or layout_reason()
