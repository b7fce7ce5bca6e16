"""llama.cpp's shared library, mapped before numpy or any other extension module.

A llama.cpp build with CUDA crashes while loading a model's vocabulary (std::regex in
libllama, `codecvt<char16_t>` resolved in libggml-cuda.so) when numpy's libraries were
mapped into the process first; with libllama mapped first it loads (measured on an
H100, ../shared/REFERENCE.md "GPU"). So `ngramspec/__init__.py` calls `load_first()`
before it imports anything else, and every entry point (the `ngramspec` command,
`python -m ngramspec`, the server, batch's threads and Ray actors) and the Python API
import ngramspec before numpy.

The library is mapped with ctypes exactly as llama_cpp maps it (same file, same mode),
so llama_cpp's own load later returns the same handle: nothing is loaded twice, and
nothing is evaluated here (ggml reads GGML_CPU_TILED_MM only at its first matmul).

Invariants: stdlib only (os, sys, ctypes, importlib.util: their extension modules are
the interpreter's own); never imports llama_cpp or numpy; a missing llama_cpp is not
an error here (the first real use reports it).
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
import warnings
from pathlib import Path

#: the library llama_cpp loads (llama_cpp/llama_cpp.py: lib<name>.so in its lib/ folder)
LIB_NAME = {"darwin": "libllama.dylib", "win32": "llama.dll"}.get(sys.platform, "libllama.so")
#: file-name stems of ggml's device backends that are not the CPU's
GPU_BACKENDS = ("ggml-cuda", "ggml-hip", "ggml-vulkan", "ggml-metal", "ggml-sycl",
                "ggml-opencl", "ggml-musa", "ggml-cann")

_handle: ctypes.CDLL | None = None


def library_dir() -> Path | None:
    """The folder llama_cpp loads its libraries from: $LLAMA_CPP_LIB_PATH, as llama_cpp
    honours it, else the installed package's lib/; None without llama_cpp."""
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    if override:
        return Path(override)
    try:
        spec = importlib.util.find_spec("llama_cpp")  # locates, does not execute
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def library_path() -> Path | None:
    """llama.cpp's main library file, if it exists."""
    d = library_dir()
    p = d / LIB_NAME if d is not None else None
    return p if p is not None and p.exists() else None


def gpu_backends(folder: Path | None = None) -> list[str]:
    """The device backends (other than the CPU) whose libraries sit in `folder`
    (default: llama.cpp's library folder), by file-name stem."""
    folder = library_dir() if folder is None else folder
    if folder is None or not folder.is_dir():
        return []
    names = {p.name for p in folder.iterdir()}
    return [b for b in GPU_BACKENDS if any(n.startswith(("lib" + b, b)) for n in names)]


def load_first() -> bool:
    """Map llama.cpp's library now, once; True if it is mapped. Warns (once) when numpy
    was imported before, in a build with a device backend: the crash above is then
    likely, and the remedy is to import ngramspec (or llama_cpp) first."""
    global _handle
    if _handle is not None:
        return True
    if "numpy" in sys.modules and gpu_backends():
        warnings.warn("numpy was imported before ngramspec, and this llama.cpp build has a "
                      f"device backend ({', '.join(gpu_backends())}): loading a model may "
                      "crash. Import ngramspec (or llama_cpp) before numpy "
                      "(docs/exactness.md, 'Import order').", RuntimeWarning, stacklevel=3)
    path = library_path()
    if path is None:
        return False
    try:
        _handle = ctypes.CDLL(str(path))  # llama_cpp's own mode (ctypes' default)
    except OSError:
        return False  # llama_cpp's own load reports it, with its message
    return True


def preload_env() -> dict[str, str]:
    """Environment variables that map llama.cpp's library first in a process whose own
    start-up imports numpy or C++ extensions before our code runs (a Ray worker maps
    Ray's and numpy's): LD_PRELOAD with the library ahead of any already set. Empty
    where there is no library or no LD_PRELOAD (not Linux). The path is this process's:
    a cluster's nodes share the install, as they share the model path."""
    lib = library_path()
    if lib is None or not sys.platform.startswith("linux"):
        return {}
    return {"LD_PRELOAD": " ".join(p for p in (str(lib), os.environ.get("LD_PRELOAD", "")) if p)}


def is_loaded() -> bool:
    """Whether `load_first` mapped the library in this process."""
    return _handle is not None
