"""ngramspec's C kernels (`ngramspec/native/*.c`) and what they read of ggml.

A kernel is compiled once per source version, flags and machine into the cache folder
with the system's C compiler and loaded from there; where that cannot be done (no
compiler, another CPU, a read-only cache) `library` gives None and the caller keeps
llama.cpp's own computation. The kernels read llama.cpp's graph nodes in place, so this
module also finds struct ggml_tensor's field offsets and ggml's op codes in the copies
of the libraries llama.cpp loaded, checked on a tensor made here.

Invariants: a library is only loaded if it was built completely (written to a
temporary file, then renamed); `tensor_offsets` is None unless the build lays out
struct ggml_tensor as ggml.h of llama.cpp 0.3.36 does.
"""
from __future__ import annotations

import ctypes as C
import hashlib
import os
import platform
import re
import subprocess
import tempfile
import threading
from functools import cache
from pathlib import Path

from .host import cpu_flags, loaded
from .paths import cache_dir

SOURCES = Path(__file__).with_name("native")
#: the instruction sets the intrinsics name and no others (not -march=native: a VM may
#: advertise extensions it traps), and no contraction of products the source keeps apart
CFLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")
GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0 = 0, 1, 8
_BUILD_LOCK = threading.Lock()


def cpu_ok() -> bool:
    """Whether this machine runs the kernels at all: x86-64 with AVX2, FMA and F16C."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    return {"avx2", "fma", "f16c"} <= cpu_flags()


@cache
def library(name: str) -> C.CDLL | None:
    """native/<name>.c compiled (once per version of it and of the headers beside it, and
    per flags) and loaded, or None where it cannot be built or loaded."""
    if not cpu_ok():
        return None
    source = SOURCES / f"{name}.c"
    src = source.read_bytes() + b"".join(h.read_bytes() for h in sorted(SOURCES.glob("*.h")))
    cc = os.environ.get("CC", "cc")
    build = " ".join((cc, *CFLAGS, platform.machine())).encode()
    tag = hashlib.sha256(src + build).hexdigest()[:16]
    out = cache_dir() / "native" / f"{name}-{tag}.so"
    with _BUILD_LOCK:
        if not out.exists() and not _build(cc, source, out):
            return None
    try:
        return C.CDLL(str(out))
    except OSError:
        return None


def _build(cc: str, source: Path, out: Path) -> bool:
    """Compile `source` into `out` (atomically: a temporary file renamed). False where the
    folder cannot be written or the compiler is missing or fails."""
    tmp = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        subprocess.run([cc, *CFLAGS, "-o", tmp, str(source)], check=True, capture_output=True,
                       timeout=120)
        os.replace(tmp, out)
        return True
    except (OSError, subprocess.SubprocessError):
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        return False


class _TypeTraitsCpu(C.Structure):
    _fields_ = [("from_float", C.c_void_p), ("vec_dot", C.c_void_p),
                ("vec_dot_type", C.c_int), ("nrows", C.c_int64)]


@cache
def ggml() -> tuple[C.CDLL, C.CDLL] | None:
    """(libggml-base, libggml-cpu): the copies llama.cpp loaded, or None."""
    base, cpu = loaded("ggml-base"), loaded("ggml-cpu")
    if base is None or cpu is None:
        return None
    base.ggml_op_name.restype, base.ggml_op_name.argtypes = C.c_char_p, [C.c_int]
    base.ggml_get_name.restype, base.ggml_get_name.argtypes = C.c_void_p, [C.c_void_p]
    cpu.ggml_get_type_traits_cpu.restype = C.POINTER(_TypeTraitsCpu)
    cpu.ggml_get_type_traits_cpu.argtypes = [C.c_int]
    return base, cpu


@cache
def op_code(name: str) -> int | None:
    """ggml's enum value of the op `name` ("MUL_MAT", "FLASH_ATTN_EXT", ...), or None.
    ggml exports no op count, so the scan stops at the first entry that is not an op
    name (upper case, digits, underscores): past its table ggml_op_name reads whatever
    follows (the op symbols, "x+y" and such), never a name."""
    libs = ggml()
    if libs is None:
        return None
    for i in range(256):
        found = libs[0].ggml_op_name(i)
        if not found or not re.fullmatch(rb"[A-Z][A-Z0-9_]*", found):
            return None
        if found == name.encode():
            return i
    return None


def from_float(type_: int) -> int:
    """The CPU backend's quantizer (`from_float`) into ggml type `type_`."""
    return ggml()[1].ggml_get_type_traits_cpu(type_).contents.from_float


@cache
def tensor_offsets() -> dict[str, int] | None:
    """Field offsets of struct ggml_tensor (ggml.h) on this build, checked on a tensor
    made here (name through ggml_get_name, the rest from the header's layout); None if
    the build lays it out otherwise or the libraries are not found."""
    libs = ggml()
    if libs is None:
        return None
    base = libs[0]

    class Init(C.Structure):
        _fields_ = [("mem_size", C.c_size_t), ("mem_buffer", C.c_void_p), ("no_alloc", C.c_bool)]
    base.ggml_init.restype, base.ggml_init.argtypes = C.c_void_p, [Init]
    base.ggml_new_tensor_2d.restype = C.c_void_p
    base.ggml_new_tensor_2d.argtypes = [C.c_void_p, C.c_int, C.c_int64, C.c_int64]
    base.ggml_free.argtypes = [C.c_void_p]
    ctx = base.ggml_init(Init(1 << 16, None, True))
    try:
        t = base.ggml_new_tensor_2d(ctx, GGML_TYPE_Q8_0, 64, 3)
        off = {"type": 0, "ne": 16, "nb": 48, "op": 80, "op_params": 84, "src": 152,
               "data": 248, "name": base.ggml_get_name(t) - t, "extra": 320}
        ne = [C.c_int64.from_address(t + off["ne"] + 8 * i).value for i in range(2)]
        nb1 = C.c_size_t.from_address(t + off["nb"] + 8).value
        f = base.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 8, 2)
        base.ggml_scale.restype = C.c_void_p
        base.ggml_scale.argtypes = [C.c_void_p, C.c_void_p, C.c_float]
        scaled = base.ggml_scale(ctx, f, 2.5)  # op_params[0] = 2.5, src[0] = f
        same = (off["name"] == 256 and ne == [64, 3] and nb1 == 68
                and C.c_int.from_address(t + off["type"]).value == GGML_TYPE_Q8_0
                and C.c_void_p.from_address(t + off["extra"]).value is None
                and C.c_float.from_address(scaled + off["op_params"]).value == 2.5
                and C.c_void_p.from_address(scaled + off["src"]).value == f
                and C.c_int.from_address(scaled + off["op"]).value == op_code("SCALE"))
        return off if same else None
    finally:
        base.ggml_free(ctx)
