"""One sequence's KV state moved between contexts with different KV stream counts.

`llama_state_seq_get_data` writes a header (a u32 magic and the source sequence id,
which a host read checks and ignores: kept as is), then per cache section (an SWA
model has two: the full attention layers, then the sliding-window ones; others one),
the section's stream count, then for every stream a u32 cell count followed by that
stream's cells when the count is not zero. A sequence lives in one stream, so a
section is

    n_stream, 0 x s, cell_count, cells..., 0 x (n_stream - 1 - s)

and only the zeros around the cells depend on the stream layout. `restream` rewrites
them, so the cells of a one-stream context (the prefill twin, which holds one prompt
at a time) load into stream s of a context with one stream per slot, and back.
The cells' bytes are not touched.

Invariants: a section's length is known from llama.cpp itself (`section_sizes`: the
whole state's size minus the size of its sliding-window part), never parsed from
the cells; a malformed or unexpected layout raises ValueError (nothing is loaded).
"""
from __future__ import annotations

import ctypes
import struct

from . import seq_cells

_U32 = struct.Struct("<I")


#: bytes before the first section: the state's magic and sequence id
HEADER = 8


def section_sizes(lc, ctx_ptr, seq_id: int, total: int) -> list[int]:
    """Byte lengths of the sections of `seq_id`'s state (`total` bytes, header
    excluded): the sliding-window cache alone (with the header) is what llama.cpp
    writes with PARTIAL_ONLY; a model without one writes the same bytes either way
    (one section)."""
    flags = lc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
    part = int(lc.llama_state_seq_get_size_ext(ctx_ptr, seq_id, flags))
    if part >= total:
        return [total - HEADER]
    return [total - part, part - HEADER]


def _body(section: memoryview) -> memoryview | None:
    """A section's cell_count and cells (None: no stream holds cells)."""
    if len(section) < 4:
        raise ValueError("a KV state section shorter than its header")
    n_from = _U32.unpack_from(section, 0)[0]
    words = len(section) // 4
    s_from = next((i for i in range(min(n_from, words - 1))
                   if _U32.unpack_from(section, 4 + 4 * i)[0]), None)
    if s_from is None:
        if len(section) != 4 + 4 * n_from:
            raise ValueError("an empty KV state section of the wrong length")
        return None
    head, tail = 4 + 4 * s_from, 4 * (n_from - 1 - s_from)
    if tail and any(section[len(section) - tail:]):
        raise ValueError("a KV state section with cells in two streams")
    return section[head:len(section) - tail]


def restream(data, sizes: list[int], n_to: int, s_to: int) -> bytearray:
    """The state `data` (sections of `sizes` bytes, any stream layout, one sequence)
    laid out for stream s_to of a context with n_to streams: one new buffer, the
    cells copied once (a state is the size of its prompt: ~10 MiB for 700 tokens)."""
    view = memoryview(data).cast("B")
    if HEADER + sum(sizes) != len(view):
        raise ValueError(f"KV state of {len(view)} bytes, sections of {sum(sizes)}")
    bodies, at = [], HEADER
    for n in sizes:
        bodies.append(_body(view[at:at + n]))
        at += n
    out = bytearray(HEADER + sum(4 + 4 * n_to + (0 if b is None else len(b) - 4) for b in bodies))
    out[:HEADER] = view[:HEADER]
    at = HEADER
    for body in bodies:  # n_to, 0 x s_to, cell_count, cells, 0 x (n_to - 1 - s_to)
        _U32.pack_into(out, at, n_to)
        if body is None:
            at += 4 + 4 * n_to
            continue
        at += 4 + 4 * s_to
        out[at:at + len(body)] = body
        at += len(body) + 4 * (n_to - 1 - s_to)
    return out


def get(ctx, seq_id: int) -> tuple[ctypes.Array, list[int]]:
    """`seq_id`'s state in context.Context `ctx` and its sections' sizes."""
    from .backend import _llama

    data = seq_cells.read(ctx, seq_id)
    return data, section_sizes(_llama(), ctx.ptr, seq_id, len(data))


def _laid_out(data, sizes: list[int], n_to: int) -> bool:
    """Whether `data` already has the layout of a context with n_to streams: only
    known without rewriting for one stream (then the layout is the same whatever the
    sequence), when every section has one."""
    if n_to != 1:
        return False
    view, at = memoryview(data).cast("B"), HEADER
    for n in sizes:
        if n < 4 or _U32.unpack_from(view, at)[0] != 1:
            return False
        at += n
    return True


def put(ctx, seq_id: int, data, sizes: list[int]) -> None:
    """Load a state `get` returned (from a context of the same GGUF, any stream layout)
    into `seq_id` of context.Context `ctx`, laid out for ctx's streams (copied only if
    the layouts differ)."""
    streams, stream = (ctx.params.n_seq_max, seq_id) if ctx.per_seq_streams else (1, 0)
    if _laid_out(data, sizes, streams) and HEADER + sum(sizes) == len(data):
        seq_cells.write(ctx, seq_id, data)
        return
    out = restream(data, sizes, streams, stream)
    seq_cells.write(ctx, seq_id, (ctypes.c_uint8 * len(out)).from_buffer(out))
