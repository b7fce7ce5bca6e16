"""This process's page-table entries for a file's read-only mappings (Linux).

llama.cpp maps a GGUF whole with MAP_POPULATE, and a model and its prefill twin
(twin.py) each map it: resident memory counts every page once per mapping that has
it. The pages are the page cache's, shared by the mappings, so dropping a mapping's
entries (madvise MADV_DONTNEED) frees nothing a model needs: it faults back in what
it reads next, the same bytes (the file's). Invariant: only read-only file mappings
are advised, never a byte of anonymous memory, so no value can change; a locked
(mlock) mapping refuses the advice and stays as it is.
"""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

#: madvise(2) advice: drop the range's page-table entries (a shared file mapping's
#: pages stay in the page cache and fault back in on the next read)
_MADV_DONTNEED = 4

Span = tuple[int, int]  # [start, end) address of one mapping


def spans(path: str | Path) -> set[Span]:
    """The address ranges of this process's mappings of the file at `path` (empty
    where /proc/self/maps cannot be read, or off Linux)."""
    if not sys.platform.startswith("linux"):
        return set()
    target = " " + str(Path(path).resolve())
    try:
        with open("/proc/self/maps") as f:
            found = [line.split()[0] for line in f if line.rstrip("\n").endswith(target)]
    except OSError:
        return set()
    return {tuple(int(x, 16) for x in s.split("-")) for s in found}


def drop(path: str | Path, within: Span | None = None) -> int:
    """Drop the resident pages of this process's mappings of the file at `path` (only
    those inside `within`, if given); the bytes advised. The mappings are read anew
    on every call: llama.cpp unmaps parts of a model's mapping after loading, and the
    addresses may since hold other memory, which must never be advised."""
    ranges = [(lo, hi) for lo, hi in spans(path)
              if within is None or (within[0] <= lo and hi <= within[1])]
    if not ranges:
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return 0
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return sum(hi - lo for lo, hi in ranges if libc.madvise(lo, hi - lo, _MADV_DONTNEED) == 0)
