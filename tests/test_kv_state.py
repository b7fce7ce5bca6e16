"""kv_state.restream on hand-written states: only the stream words around a sequence's
cells change; the cells' bytes and the header stay as they are."""
from __future__ import annotations

import struct

import pytest

from ngramspec.llama import kv_state


def words(*ws: int) -> bytes:
    return struct.pack(f"<{len(ws)}I", *ws)


HEADER = words(0xAF143CD8, 5)
CELLS = bytes(range(1, 23))  # cell_count's cells and their K/V rows: opaque here


def test_one_stream_to_stream_two_of_four_and_back():
    one = HEADER + words(1, 3) + CELLS
    four = kv_state.restream(one, [len(one) - 8], 4, 2)
    assert four == HEADER + words(4, 0, 0, 3) + CELLS + words(0)
    assert kv_state.restream(four, [len(four) - 8], 1, 0) == one


def test_two_sections_and_an_empty_one():
    base = words(2, 0, 3) + CELLS
    swa = words(2, 0, 0)  # no cells of this sequence in the SWA cache
    state = HEADER + base + swa
    out = kv_state.restream(state, [len(base), len(swa)], 1, 0)
    assert out == HEADER + words(1, 3) + CELLS + words(1, 0)


def test_bad_layouts_raise():
    two_streams = HEADER + words(2, 3) + CELLS + words(4)
    with pytest.raises(ValueError, match="two streams"):
        kv_state.restream(two_streams, [len(two_streams) - 8], 1, 0)
    with pytest.raises(ValueError, match="bytes"):
        kv_state.restream(HEADER + words(1, 0), [12], 1, 0)
    with pytest.raises(ValueError, match="wrong length"):
        kv_state.restream(HEADER + words(3, 0), [8], 1, 0)


def test_a_one_stream_state_loads_as_is_and_others_are_relaid():
    """put's shortcut: a state whose sections all have one stream needs no copy for a
    one-stream context; any other stream count does."""
    one = HEADER + words(1, 3) + b"cells..." + words(1, 0)
    four = kv_state.restream(one, [16, 8], 4, 1)
    assert kv_state._laid_out(one, [16, 8], 1)
    assert not kv_state._laid_out(one, [16, 8], 4)
    assert not kv_state._laid_out(four, [28, 20], 1) and kv_state._laid_out(four, [28, 20], 4) is False
    assert kv_state.restream(four, [28, 20], 1, 0) == one


def test_the_allocator_threshold_is_pinned_on_glibc():
    import platform
    import sys

    from ngramspec.llama import allocator

    took = allocator.fix_mmap_threshold()  # the value every model load sets
    if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        assert took
