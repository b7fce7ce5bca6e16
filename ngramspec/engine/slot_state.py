"""Save, restore and erase a slot's KV cache (llama-server's /slots/ID?action=...).

A slot file is what llama-server writes, so files move between the two servers:
llama.cpp's sequence state file (`llama_state_seq_save_file`: magic, version, a
word count, that many int32 words, then the sequence's KV) whose words are
llama-server's packed token list [LLAMA_TOKEN_NULL, 1, n, token_0..token_n-1, 0]
(no media chunks). A file whose words do not start with LLAMA_TOKEN_NULL holds a
plain token list (older llama-server); both are read.

ngramspec appends one trailer after the KV state (llama.cpp stops reading at the
state's end, so llama-server ignores it): `TRAILER_MAGIC`, a version (1: the
tiled prefill, 2: the small-row path), and how many leading tokens were evaluated
on that path (the slot's `reusable` count, docs/exactness.md), with a digest of the
tokens, the model and the kernel mode that computed the cells (`Context.kernels.cell_mode`:
ngramspec's own attention or llama.cpp's). A restored slot reuses that many tokens as
prompt cache, and none when the trailer is missing or does not match (a file from
llama-server, another model, edited tokens, a server whose kernels differ): cells
computed another way would not give the values a fresh prefill gives, so the prompt is
evaluated again.

Invariants: these functions run on the thread that owns the engine (the
scheduler's) and only on a slot with no running sequence; after `restore` the
sequence's KV holds exactly the restored tokens at positions 0..n-1 (checked),
or nothing (on any error).
"""
from __future__ import annotations

import hashlib
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .engine import Engine, SlotCache
from ..errors import NgramSpecError
from ..llama import seq_cells

TOKEN_NULL = -1  # LLAMA_TOKEN_NULL
PACKED_VERSION = 1  # llama-server's SERVER_TOKENS_STATE_VERSION
TRAILER_MAGIC = b"ngspslot"
_TRAILER = struct.Struct("<8sII16s")  # magic, version, reusable, digest


class SlotFileError(NgramSpecError):
    """The file cannot be restored (missing, corrupt, does not fit the slot)."""

    status = 400
    type = "invalid_request_error"


class SlotSaveError(NgramSpecError):
    """llama.cpp could not write the file."""

    status = 500
    type = "server_error"


@dataclass
class SlotIO:
    """What one save or restore did: tokens, bytes and milliseconds."""

    n_tokens: int
    n_bytes: int
    ms: float


def pack(tokens: np.ndarray) -> np.ndarray:
    """llama-server's packed token list (no media)."""
    head = [TOKEN_NULL, PACKED_VERSION, len(tokens)]
    return np.concatenate([np.asarray(head, np.int32), tokens.astype(np.int32),
                           np.zeros(1, np.int32)])


def unpack(words: np.ndarray) -> np.ndarray:
    """Tokens from a packed list, or a plain token list as older servers wrote it."""
    if len(words) == 0 or words[0] != TOKEN_NULL:
        return words.astype(np.int32)
    if len(words) < 3 or int(words[1]) != PACKED_VERSION:
        raise SlotFileError("Unsupported server tokens state version")
    n = int(words[2])
    if n < 0 or len(words) < 4 + n:
        raise SlotFileError("invalid slot save file: truncated token list")
    if int(words[3 + n]) != 0:
        raise SlotFileError("Cannot restore media tokens without an mmproj")
    if len(words) > 4 + n:
        raise SlotFileError("Trailing data in server tokens state")
    return words[3:3 + n].astype(np.int32)


def _digest(engine: Engine, tokens: np.ndarray) -> bytes:
    """Tokens + model identity + kernel mode: a trailer counts only for the same tokens,
    model and way of computing cells."""
    m = engine.model
    key = f"{m.path.name}:{m.path.stat().st_size}:{m.n_vocab}:{engine.ctx.kernels.cell_mode}".encode()
    return hashlib.blake2b(key + tokens.astype("<i4").tobytes(), digest_size=16).digest()


def _read_reusable(engine: Engine, path: Path, tokens: np.ndarray,
                   end: int) -> tuple[int, bool, int]:
    """(reusable tokens, evaluated by the tiled prefill, trailer bytes) from the trailer
    right after llama.cpp's state."""
    with path.open("rb") as f:
        f.seek(end)
        raw = f.read(_TRAILER.size + 1)
    if len(raw) != _TRAILER.size:
        return 0, True, 0
    magic, version, reusable, digest = _TRAILER.unpack(raw)
    if magic != TRAILER_MAGIC or version not in (1, 2) or digest != _digest(engine, tokens):
        return 0, True, len(raw) if magic == TRAILER_MAGIC else 0
    return min(int(reusable), len(tokens)), version == 1, len(raw)


def save(engine: Engine, seq_id: int, path: str | os.PathLike) -> SlotIO:
    """Write `seq_id`'s cached tokens and KV to `path`."""
    t0 = time.perf_counter()
    c = engine.cache.get(seq_id) or SlotCache()
    n = seq_cells.save_file(engine.ctx, seq_id, path, pack(c.tokens))
    if n == 0:
        raise SlotSaveError("Unable to save slot")
    reusable = c.reusable
    if c.tiled and reusable and engine.ctx.twin is not None:
        reusable -= 1  # the main context computed its own cell of the prompt's last token
    with open(path, "ab") as f:
        version = 1 if c.tiled else 2
        f.write(_TRAILER.pack(TRAILER_MAGIC, version, reusable, _digest(engine, c.tokens)))
    return SlotIO(len(c.tokens), n + _TRAILER.size, (time.perf_counter() - t0) * 1e3)


def restore(engine: Engine, seq_id: int, path: str | os.PathLike) -> SlotIO:
    """Replace `seq_id`'s KV and prompt cache with the file's; on error the slot is empty."""
    t0 = time.perf_counter()
    engine.forget(seq_id)
    p = Path(path)
    if not p.is_file():
        raise SlotFileError(f"Unable to restore slot: no file {p.name}")
    try:
        words, nread = seq_cells.load_file(engine.ctx, seq_id, p)
        tokens = unpack(words)
        _check(engine, seq_id, tokens)
        reusable, tiled, extra = _read_reusable(engine, p, tokens, nread)
    except (ValueError, SlotFileError) as e:
        engine.forget(seq_id)
        raise SlotFileError(f"Unable to restore slot: {e}") from None
    engine.cache[seq_id] = SlotCache(tokens, reusable, tiled)
    return SlotIO(len(tokens), nread + extra, (time.perf_counter() - t0) * 1e3)


def _check(engine: Engine, seq_id: int, tokens: np.ndarray) -> None:
    """The restored tokens fit the slot, are in the vocabulary and match the KV's positions."""
    if len(tokens) > engine.ctx.n_ctx_seq:
        raise SlotFileError("Restored prompt does not fit in the slot context")
    if len(tokens) and (tokens.min() < 0 or tokens.max() >= engine.model.n_vocab):
        raise SlotFileError("Invalid tokens in slot save file")
    lo, hi = engine.ctx.positions(seq_id)
    if (lo, hi) != ((0, len(tokens) - 1) if len(tokens) else (-1, -1)):
        raise SlotFileError(f"the KV state holds positions {lo}..{hi} for {len(tokens)} tokens")


def erase(engine: Engine, seq_id: int) -> int:
    """Drop `seq_id`'s KV and prompt cache; returns how many tokens it held."""
    c = engine.cache.get(seq_id)
    engine.forget(seq_id)
    return len(c.tokens) if c is not None else 0
