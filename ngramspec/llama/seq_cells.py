"""A sequence's KV cells in a context: read and written as llama.cpp's state bytes, saved
to and loaded from a slot file, and kept in position order in a sliding-window cache.

Invariants:
- `read` / `write` move a sequence's cells as `llama_state_seq_get_data` writes them,
  between contexts of the same GGUF with as many KV streams (kv_state.py rewrites
  them for another stream layout); a refused write raises, never half-loads.
- Window-size SWA cache (`swa_span` not None): a sequence's SWA cells sit in its
  stream in ascending position order from cell 0 and never wrap around the ring,
  whatever rollbacks and draft lengths came before (`keep_window_ordered`, rule W,
  docs/exactness.md).
"""
from __future__ import annotations

import ctypes
import os
from typing import Sequence

import numpy as np

from .backend import _llama


def swa_span(lc, model_ptr, n_ctx_seq: int, n_ubatch: int, swa_full: bool) -> int | None:
    """Positions one sequence's window-size SWA stream holds (llama.cpp sizes it n_swa +
    n_ubatch, padded up, at most the sequence's cells); None where there is no such
    cache (full-size cache, no sliding window, or recurrent/hybrid memory)."""
    n_swa = lc.llama_model_n_swa(model_ptr)
    if swa_full or n_swa <= 0 or lc.llama_model_is_recurrent(model_ptr) \
            or lc.llama_model_is_hybrid(model_ptr):
        return None
    span = min(n_ctx_seq, n_swa + n_ubatch)
    return span if span < n_ctx_seq else None


def read(ctx, seq_id: int, partial: bool = False) -> ctypes.Array:
    """`seq_id`'s KV cells in context `ctx` as llama_state_seq_get_data writes them
    (`partial`: the sliding-window cache's alone, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)."""
    lc = _llama()
    flags = lc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
    buf = (ctypes.c_uint8 * max(1, lc.llama_state_seq_get_size_ext(ctx.ptr, seq_id, flags)))()
    n = lc.llama_state_seq_get_data_ext(ctx.ptr, buf, len(buf), seq_id, flags)
    return (ctypes.c_uint8 * n).from_buffer(buf)


def write(ctx, seq_id: int, data: ctypes.Array, partial: bool = False) -> None:
    """Load cells `read` returned (of a context of the same GGUF with as many KV
    streams, the same `partial`) into `seq_id`, replacing what it held. Raises
    RuntimeError if llama.cpp refuses (n_stream mismatch, too few cells)."""
    lc = _llama()
    flags = lc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
    if len(data) and lc.llama_state_seq_set_data_ext(ctx.ptr, data, len(data), seq_id,
                                                     flags) == 0:
        raise RuntimeError(f"llama.cpp could not load {len(data)} bytes of KV state "
                           f"into sequence {seq_id}")


def save_file(ctx, seq_id: int, path: str | os.PathLike, payload: Sequence[int]) -> int:
    """llama_state_seq_save_file: `payload` (int32 words) then `seq_id`'s KV state.
    Returns the bytes written (0: failed)."""
    lc = _llama()
    words = np.ascontiguousarray(payload, dtype=np.int32)
    ptr = words.ctypes.data_as(ctypes.POINTER(lc.llama_token))
    handle, seq = ctx.seq_handle(seq_id)
    return int(lc.llama_state_seq_save_file(handle, os.fsencode(path), seq, ptr, len(words)))


def load_file(ctx, seq_id: int, path: str | os.PathLike) -> tuple[np.ndarray, int]:
    """llama_state_seq_load_file into `seq_id` (its KV is replaced): (payload words,
    bytes read). Raises ValueError if llama.cpp cannot read the file or the KV has no
    room; the sequence is then empty."""
    lc = _llama()
    n = ctypes.c_size_t(0)
    raw = os.fsencode(path)
    handle, seq = ctx.seq_handle(seq_id)
    if lc.llama_state_seq_load_file(handle, raw, seq, None, 0, ctypes.byref(n)) == 0:
        raise ValueError("not a sequence state file")
    buf = (lc.llama_token * max(1, n.value))()
    ctx.clear(seq_id)
    nread = lc.llama_state_seq_load_file(handle, raw, seq, buf, len(buf), ctypes.byref(n))
    if nread == 0:
        ctx.clear(seq_id)
        raise ValueError("No available space in KV cache or invalid slot save file")
    return np.frombuffer(buf, dtype=np.int32, count=n.value).copy(), int(nread)


def keep_window_ordered(ctx, seq_id: int, end: int) -> None:
    """Before a decode that writes positions up to end - 1 of `seq_id`: if its
    window-size SWA stream could not hold them after its lowest cell, re-import the
    sequence's window cells (PARTIAL_ONLY state: the SWA cache alone), which
    llama.cpp writes from the stream's first cell in position order. A row's
    attention, which sums the unmasked cells in cell order (the one-row kernel),
    therefore sees them in position order, as with a full-size cache."""
    lo = ctx.positions(seq_id)[0]
    if lo < 0 or end - lo <= ctx.swa_span:
        return
    window = read(ctx, seq_id, partial=True)
    if not len(window):
        raise RuntimeError(f"llama.cpp could not export the window of sequence {seq_id}")
    write(ctx, seq_id, window, partial=True)
    lo = ctx.positions(seq_id)[0]
    if end - lo > ctx.swa_span:
        raise RuntimeError(f"positions {lo}..{end - 1} of sequence {seq_id} do not fit "
                           f"its {ctx.swa_span}-cell sliding-window cache")
