"""llama.cpp's shared library in this process: loaded once, its logs, its backend.

Invariants: `_llama()` is the one way in (importing llama_cpp loads the library, after
ngramspec/__init__.py set GGML_CPU_TILED_MM=0); the backend is initialised once, before
any model loads, with the C allocator's threshold fixed first (allocator.py); nothing
is freed one by one once the interpreter exits (`FreedOnCollect`).
"""
from __future__ import annotations

import atexit
import ctypes
import threading
from functools import cache

from . import allocator
from ..settings.llama_values import kv_type_name

_BACKEND_READY = False
_BACKEND_LOCK = threading.Lock()
_EXITING = False  # set when the interpreter exits (`_at_exit`)


@atexit.register
def _at_exit() -> None:
    """Models and contexts still alive when the process ends are not freed one by one
    (`__del__` returns): the OS takes their memory back at once, where llama.cpp's frees
    take ~0.2 s for a model, its twin and their contexts. `close()` still frees."""
    global _EXITING
    _EXITING = True


class FreedOnCollect:
    """A llama.cpp object that `close()` frees: the garbage collector calls it too,
    except while the interpreter exits (`_at_exit`; the OS takes the memory then)."""

    def close(self) -> None:
        raise NotImplementedError

    def __del__(self):  # pragma: no cover
        if _EXITING:
            return
        try:
            self.close()
        except Exception:
            pass


_LLAMA = None  # the llama_cpp module, once imported (`_llama`)


def _llama():
    global _LLAMA
    if _LLAMA is None:  # an import statement costs microseconds a step even when done
        # ngramspec/__init__.py has set GGML_CPU_TILED_MM=0 (read once by ggml)
        import llama_cpp  # deferred: importing loads the shared library

        _LLAMA = llama_cpp
    return _LLAMA


def _quiet_logs(verbose: bool) -> None:
    """Silence llama.cpp's stderr logging unless verbose (one process-wide callback).
    Thread-safe: models may load on several threads at once (runtime.load_engine)."""
    global _BACKEND_READY
    with _BACKEND_LOCK:
        if not _BACKEND_READY:
            _init_backend(verbose)
            _BACKEND_READY = True


def _init_backend(verbose: bool) -> None:
    lc = _llama()
    allocator.fix_mmap_threshold()  # before llama.cpp allocates anything (allocator.py)
    if not verbose:  # before the backends register: a GPU backend logs its devices then
        @lc.llama_log_callback
        def _sink(level, text, user_data):  # pragma: no cover - called from C
            return None

        _quiet_logs.sink = _sink  # keep the callback alive
        lc.llama_log_set(_sink, ctypes.c_void_p(0))
    lc.llama_backend_init()


@cache
def logit_quantum() -> int:
    """Logit columns llamafile's sgemm takes per pass over the output layer: 4 in a
    build with 32 vector registers (AVX-512, NEON), else 2 (`ubatch.ragged`)."""
    info = _llama().llama_print_system_info().decode(errors="replace")
    return 4 if "AVX512 = 1" in info or "NEON = 1" in info else 2


def kv_type(name: str) -> int:
    """The ggml type id of a KV cache type name (KV_TYPES)."""
    return getattr(_llama(), f"GGML_TYPE_{kv_type_name(name).upper()}")
