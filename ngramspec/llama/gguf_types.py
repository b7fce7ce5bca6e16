"""The weight types of a GGUF file's matrices, read from its header (no llama.cpp).

GGUF (v2/v3): magic, version u32, tensor count u64, metadata count u64, the metadata
(key string, value type u32, value), then per tensor: name string, n_dims u32, n_dims
u64 extents, ggml type u32, offset u64. Strings are a u64 length and bytes; an array
is an element type u32, a count u64 and the elements.

Invariant: `matrix_types` returns the type names of every tensor with two or more
extents over 1 (the weights a matmul reads), or None when the header cannot be read
as GGUF: a caller treats None as "unknown" and assumes nothing of the types. A file
version (path, size, mtime) is read once per process (a model and its prefill twin
share the read; Gemma's header holds a 262k-token vocabulary, ~80 ms to skip).
"""
from __future__ import annotations

import mmap
import os
import struct
from functools import cache
from pathlib import Path

#: ggml type ids of the float types (ggml.h); others are named "type<id>"
_FLOAT_IDS = {0: "f32", 1: "f16", 30: "bf16"}
#: byte size of GGUF's scalar value types (8 string and 9 array are read apart)
_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


class _Reader:
    def __init__(self, buf) -> None:
        self.buf, self.pos = buf, 0

    def u32(self) -> int:
        (v,) = struct.unpack_from("<I", self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self) -> int:
        (v,) = struct.unpack_from("<Q", self.buf, self.pos)
        self.pos += 8
        return v

    def text(self) -> str:
        """A string: its u64 length, then that many bytes (UTF-8)."""
        n = self.u64()
        self.pos += n
        return bytes(self.buf[self.pos - n:self.pos]).decode("utf-8", "replace")

    def skip_bytes(self) -> None:
        """A string: its u64 length, then that many bytes."""
        n = self.u64()
        self.pos += n

    def skip_value(self, vtype: int) -> None:
        if vtype in _SCALAR:
            self.pos += _SCALAR[vtype]
        elif vtype == 8:
            self.skip_bytes()
        elif vtype == 9:
            etype, count = self.u32(), self.u64()
            if etype in _SCALAR:
                self.pos += _SCALAR[etype] * count
            else:
                for _ in range(count):
                    self.skip_value(etype)
        else:
            raise ValueError(f"unknown GGUF value type {vtype}")


def _header(buf) -> tuple[_Reader, int, int]:
    """A reader at the first metadata key, the tensor count and the metadata count."""
    r = _Reader(buf)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError("not a GGUF file")
    r.pos = 4
    if r.u32() < 2:
        raise ValueError("GGUF v1 is not read")
    n_tensors, n_kv = r.u64(), r.u64()
    return r, n_tensors, n_kv


def _read_types(buf) -> frozenset[str]:
    r, n_tensors, n_kv = _header(buf)
    for _ in range(n_kv):
        r.skip_bytes()  # key
        r.skip_value(r.u32())
    types = set()
    for _ in range(n_tensors):
        r.skip_bytes()  # name
        dims = [r.u64() for _ in range(r.u32())]
        t = r.u32()
        r.pos += 8  # offset
        if sum(d > 1 for d in dims) >= 2:
            types.add(_FLOAT_IDS.get(t, f"type{t}"))
    return frozenset(types)


def _read_vocab(buf) -> tuple[str, int] | None:
    """(general.architecture, the number of tokenizer.ggml.tokens), reading the
    metadata only until both are found; None if either is missing."""
    r, _, n_kv = _header(buf)
    arch = count = None
    for _ in range(n_kv):
        key, vtype = r.text(), r.u32()
        if key == "general.architecture" and vtype == 8:
            arch = r.text()
        elif key == "tokenizer.ggml.tokens" and vtype == 9:
            r.u32()
            count = r.u64()
        else:
            r.skip_value(vtype)
        if arch is not None and count is not None:
            return arch, count
    return None


def vocab_size(path: str | Path) -> tuple[str, int] | None:
    """(architecture, token count) from the GGUF file's header, or None if its header
    cannot be read or lacks either (a model with no token list)."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return _read_vocab(m)
    except (OSError, ValueError, OverflowError, struct.error, IndexError):
        return None


def matrix_types(path: str | Path) -> frozenset[str] | None:
    """The ggml types of the GGUF file's matrices ("f32", "f16", "bf16", or "type<id>"
    for the others), or None if its header cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _file_types(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


@cache
def _file_types(path: str, size: int, mtime_ns: int) -> frozenset[str] | None:
    """`matrix_types` of one file version (size and mtime key the cache)."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return _read_types(m)
    except (OSError, ValueError, OverflowError, struct.error, IndexError):
        return None
