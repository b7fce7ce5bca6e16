"""What this process runs on: the CPU's feature flags, and the ggml libraries llama.cpp
has loaded, as ctypes handles on the same copies.

llama-cpp-python's lib folder holds each library under two names (`libggml-cpu.so`
and `libggml-cpu.so.0`, separate files); llama.cpp loads one of them, and opening the
other would map a second copy with its own global state (a CPU backend of the second
copy carries another guid, and its tables are its own). So a library is opened by the
path the process has already mapped.
"""
from __future__ import annotations

import ctypes
import sys
from functools import cache
from pathlib import Path


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The feature flags of /proc/cpuinfo's first "flags" line (of `cpuinfo`, its text,
    if given); empty where there is none or it cannot be read (not Linux)."""
    if cpuinfo is None:
        if not sys.platform.startswith("linux"):
            return set()
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return set()
    return next((set(line.split(":", 1)[1].split()) for line in cpuinfo.splitlines()
                 if line.startswith("flags")), set())


@cache
def loaded(name: str) -> ctypes.CDLL | None:
    """The already-mapped `lib<name>.so*` (e.g. "ggml-cpu"), or None where it is not
    mapped exactly once or the platform has no /proc/self/maps."""
    if not sys.platform.startswith("linux"):
        return None
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f
                 if line.split()[-1].rsplit("/", 1)[-1].startswith(f"lib{name}.so")}
    if len(paths) != 1:
        return None
    try:
        return ctypes.CDLL(paths.pop())
    except OSError:
        return None
