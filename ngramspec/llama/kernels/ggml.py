"""What ngramspec's kernels read of ggml, in the copies of its libraries llama.cpp loaded.

The kernels read llama.cpp's graph nodes in place, so they depend on struct ggml_tensor's
field offsets, ggml's op codes, the CPU backend's type traits and the parameter layouts of
the ops they take. This module reads them; `guard.py` decides whether they are the ones
the kernels were verified against (and none of them is used before it has).

Invariants: `op_code` only ever asks ggml for the codes of `OP_CODES` (ggml exports no op
count, so scanning would read past its table); `tensor_offsets` is None unless the build
lays out struct ggml_tensor as ggml.h of llama-cpp-python 0.3.36 does.
"""
from __future__ import annotations

import ctypes as C
from functools import cache

from ..host import loaded

GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0 = 0, 1, 8
#: ggml's op codes (enum ggml_op) in the verified build; `op_code` checks each by name
OP_CODES = {"MUL_MAT": 29, "SCALE": 32, "FLASH_ATTN_EXT": 74, "CUSTOM": 95}
#: struct ggml_tensor's field offsets in the verified build (ggml.h)
TENSOR_OFFSETS = {"type": 0, "ne": 16, "nb": 48, "op": 80, "op_params": 84, "src": 152,
                  "data": 248, "name": 256, "extra": 320}


class TypeTraitsCpu(C.Structure):
    """ggml-cpu.h's struct ggml_type_traits_cpu."""
    _fields_ = [("from_float", C.c_void_p), ("vec_dot", C.c_void_p),
                ("vec_dot_type", C.c_int), ("nrows", C.c_int64)]


class _Init(C.Structure):
    _fields_ = [("mem_size", C.c_size_t), ("mem_buffer", C.c_void_p), ("no_alloc", C.c_bool)]


@cache
def ggml() -> tuple[C.CDLL, C.CDLL] | None:
    """(libggml-base, libggml-cpu): the copies llama.cpp loaded, or None."""
    base, cpu = loaded("ggml-base"), loaded("ggml-cpu")
    if base is None or cpu is None:
        return None
    base.ggml_op_name.restype, base.ggml_op_name.argtypes = C.c_char_p, [C.c_int]
    base.ggml_get_name.restype, base.ggml_get_name.argtypes = C.c_void_p, [C.c_void_p]
    base.ggml_init.restype, base.ggml_init.argtypes = C.c_void_p, [_Init]
    base.ggml_free.argtypes = [C.c_void_p]
    base.ggml_new_tensor_2d.restype = C.c_void_p
    base.ggml_new_tensor_2d.argtypes = [C.c_void_p, C.c_int, C.c_int64, C.c_int64]
    base.ggml_new_tensor_4d.restype = C.c_void_p
    base.ggml_new_tensor_4d.argtypes = [C.c_void_p, C.c_int] + [C.c_int64] * 4
    cpu.ggml_get_type_traits_cpu.restype = C.POINTER(TypeTraitsCpu)
    cpu.ggml_get_type_traits_cpu.argtypes = [C.c_int]
    return base, cpu


def version() -> str:
    """ggml_version() of the loaded build ('?' where the libraries are not found)."""
    libs = ggml()
    if libs is None:
        return "?"
    libs[0].ggml_version.restype = libs[0].ggml_commit.restype = C.c_char_p
    return f"{libs[0].ggml_version().decode()} ({libs[0].ggml_commit().decode()})"


@cache
def op_code(name: str) -> int | None:
    """ggml's enum value of the op `name` (a key of OP_CODES), or None where the loaded
    build names that code otherwise."""
    libs, code = ggml(), OP_CODES.get(name)
    if libs is None or code is None:
        return None
    return code if libs[0].ggml_op_name(code) == name.encode() else None


def traits(type_: int) -> TypeTraitsCpu:
    """The CPU backend's type traits of ggml type `type_`."""
    return ggml()[1].ggml_get_type_traits_cpu(type_).contents


def from_float(type_: int) -> int:
    """The CPU backend's quantizer (`from_float`) into ggml type `type_`."""
    return traits(type_).from_float


class Scratch:
    """A ggml context for making tensors to read back (`with Scratch() as ctx`); with
    `alloc`, tensors get data of their own (64 KiB in all)."""

    def __init__(self, alloc: bool = False):
        self.alloc = alloc

    def __enter__(self) -> int:
        self.base = ggml()[0]
        self.ctx = self.base.ggml_init(_Init(1 << 16, None, not self.alloc))
        return self.ctx

    def __exit__(self, *exc) -> None:
        self.base.ggml_free(self.ctx)


@cache
def tensor_offsets() -> dict[str, int] | None:
    """Field offsets of struct ggml_tensor (TENSOR_OFFSETS) where this build has them,
    checked on tensors made here (name through ggml_get_name, the rest by reading back
    what ggml wrote), else None."""
    libs = ggml()
    if libs is None:
        return None
    base, off = libs[0], TENSOR_OFFSETS
    base.ggml_get_data.restype, base.ggml_get_data.argtypes = C.c_void_p, [C.c_void_p]
    with Scratch(alloc=True) as ctx:
        d = base.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4, 4)
        data_ok = base.ggml_get_data(d) not in (None, 0) and \
            base.ggml_get_data(d) == C.c_void_p.from_address(d + off["data"]).value
    with Scratch() as ctx:
        t = base.ggml_new_tensor_2d(ctx, GGML_TYPE_Q8_0, 64, 3)
        ne = [C.c_int64.from_address(t + off["ne"] + 8 * i).value for i in range(2)]
        nb1 = C.c_size_t.from_address(t + off["nb"] + 8).value
        f = base.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 8, 2)
        base.ggml_scale.restype = C.c_void_p
        base.ggml_scale.argtypes = [C.c_void_p, C.c_void_p, C.c_float]
        scaled = base.ggml_scale(ctx, f, 2.5)  # op_params[0] = 2.5, src[0] = f
        same = (data_ok and base.ggml_get_name(t) - t == off["name"] and ne == [64, 3] and nb1 == 68
                and C.c_int.from_address(t + off["type"]).value == GGML_TYPE_Q8_0
                and C.c_void_p.from_address(t + off["extra"]).value is None
                and C.c_float.from_address(scaled + off["op_params"]).value == 2.5
                and C.c_void_p.from_address(scaled + off["src"]).value == f
                and C.c_int.from_address(scaled + off["op"]).value == op_code("SCALE"))
    return dict(off) if same else None
