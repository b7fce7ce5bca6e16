"""The drafters' hot loops in C (llama/kernels/native/drafting.c), or None where there is none.

`kernel()` is the loaded library with its argument types, compiled once per source
version into the cache folder (scripts/setup.sh compiles it ahead), or None: no C
compiler, a failed build (said once), or NGRAMSPEC_NATIVE_DRAFTING=0. HashPool
(pool.py) then runs its Python reference, which computes the same values; the C code
only makes a step cost microseconds instead of tens of them (a draft of 64 chained
lookups: ~1 us instead of ~90 us on a cold cache after a decode).
"""
from __future__ import annotations

import ctypes as C
import functools
import os

from ..llama.kernels import build

ENV = "NGRAMSPEC_NATIVE_DRAFTING"
MAX_ENTRIES = 64  # entries of one decode drafting.c lays out and plans (NGS_MAX_ENTRIES)

_U64, _P, _I64, _I32 = C.c_uint64, C.c_void_p, C.c_int64, C.c_int32
_SIGNATURES = {  # name -> (restype, argtypes): drafting.c's functions
    "ngs_put_ngrams": (_I64, (_P, C.c_int, _U64, _P, _I64, C.c_int, _P, _I64, C.c_int)),
    "ngs_follow": (C.c_int, (_P, C.c_int, _U64, _P, _I64, _I32, C.c_int, C.c_int, _P)),
    "ngs_find": (_I64, (_P, C.c_int, _U64, _P, _I64, _I32, C.c_int, _P)),
    "ngs_index_find": (_I64, (_P, C.c_int, _U64, _P, _I64, _I32, C.c_int, C.c_int, C.c_int, _P,
                              _P)),
    "ngs_propose": (C.c_int, (_P, C.c_int, _I64, _P, _I64, _I32, C.c_int, C.c_int, C.c_int,
                              C.c_int, C.c_int, _P, _P, _P, C.c_int, _P, _P, _P)),
    "ngs_layout_features": (C.c_int, (_P, C.c_int, C.c_int, C.c_int, C.c_int, C.c_int, _P, _P)),
    "ngs_expected": (None, (_P, _P, C.c_int, C.c_double, C.c_double, _P, C.c_int)),
    "ngs_best_expected": (C.c_int, (_P, _P, _P, _P, _P, _P, C.c_int, _P, _P, C.c_double)),
    "ngs_alone": (C.c_int, (_P, C.c_int, _P, _P, C.c_double, C.c_double, _I64, C.c_double)),
    "ngs_ascend": (C.c_int, (_P, _P, _P, _P, C.c_int, _P, _P, _P, C.c_int, _P, C.c_double,
                             C.c_int, C.c_int, C.c_int, C.c_int, _P, _P, C.c_double,
                             C.c_double, C.c_int, _P)),
}


def enabled() -> bool:
    """Whether the C drafting loops may be used (NGRAMSPEC_NATIVE_DRAFTING is not 0)."""
    return os.environ.get(ENV, "1") != "0"


def kernel() -> C.CDLL | None:
    """The C library when `enabled()` and it builds, else None."""
    return _load() if enabled() else None


@functools.cache
def _load() -> C.CDLL | None:
    lib = build.library(build.DRAFTING, build.GENERIC).lib
    if lib is None:
        return None
    for name, (res, args) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


def reason() -> str:
    """Why there is no C drafting (tests/test_native_drafting.py's skip), or "" when it runs."""
    if not enabled():
        return f"{ENV}=0"
    return build.library(build.DRAFTING, build.GENERIC).reason
