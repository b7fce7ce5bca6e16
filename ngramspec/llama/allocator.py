"""The C allocator's threshold for serving a request with its own memory mapping.

glibc's malloc serves requests of at least M_MMAP_THRESHOLD bytes with a mapping of
their own, returned to the system when freed; smaller ones come from heaps that
give memory back only from their top. The threshold starts at 128 KiB and, by
default, rises to the size of any mapped block that is freed (up to 32 MiB). An
engine frees such blocks as a matter of course (a prefill twin's KV cache when it
grows, a slot's saved prompt state, ~10 MiB each), so after the first of them every
later block of a few MiB (states, llama.cpp's output and compute buffers) lands in
a heap, and the heap's resident size stays at its high-water mark: measured, 55 MiB
more resident memory after three documents at one slot (568 against 513 MiB).

`fix_mmap_threshold` sets the threshold once (mallopt), which also turns the
rising off. Process-wide and harmless elsewhere: it changes where blocks live, never
their contents. A no-op where the C library has no mallopt (musl, macOS, Windows).
"""
from __future__ import annotations

import ctypes
import sys

#: mallopt(3) parameter number of M_MMAP_THRESHOLD (glibc malloc.h)
_M_MMAP_THRESHOLD = -3
#: blocks of 1 MiB and more get a mapping of their own
MMAP_THRESHOLD = 1 << 20


def fix_mmap_threshold(size: int = MMAP_THRESHOLD) -> bool:
    """Pin glibc's M_MMAP_THRESHOLD at `size` bytes; True if the C library took it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, size) == 1
