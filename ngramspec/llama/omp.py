"""OpenMP thread pools: llama.cpp's CPU backend runs each decode on libgomp threads.

libgomp keeps one pool of worker threads per thread that ever ran a decode, for as
long as that thread lives. Two such threads alive (say the one that loaded and
calibrated the model, and the scheduler thread that decodes afterwards) make
libgomp count more threads than cores; it then shortens its spin-waits, and the
barriers between a decode's graph nodes sleep and wake instead of spinning. On
2 cores that made 4-sequence generation decodes ~14% slower (gemma-3-270m, 2
threads: ~105 ms with the loading thread alive, ~91 ms with it ended), and `batch`
slower than `serve` (whose model loads on a thread that ends).

`on_passing_thread` runs a function on a thread of its own that has ended when
the call returns, so whatever it decoded leaves no pool behind.
"""
from __future__ import annotations

import functools
import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def on_passing_thread(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn`, run on a fresh thread that ends before the call returns: same arguments,
    same result, the same exception raised in the caller. The thread is a daemon, so
    an interrupted caller (Ctrl-C while it waits) does not wait for it at exit."""
    @functools.wraps(fn)
    def call(*args, **kw) -> T:
        box: dict = {}

        def target() -> None:
            try:
                box["value"] = fn(*args, **kw)
            except BaseException as e:  # re-raised in the caller
                box["error"] = e

        t = threading.Thread(target=target, name=f"ngramspec-{fn.__name__}", daemon=True)
        t.start()
        t.join()
        if "error" in box:
            raise box["error"]
        return box["value"]
    return call
