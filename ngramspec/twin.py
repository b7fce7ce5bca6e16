"""Prompt prefill on a twin context of the repacked model (rule T+R, docs/exactness.md).

Weight repacking (llama.cpp's extra buffer types, on by default in llama-server)
makes prompt processing ~13% faster on x86, but it makes a token's values depend on
its place in the batch: in a decode of n rows the first n - n % 4 columns go through
a gemm kernel, the rest through gemv, and the two round differently. Generation
decodes (a few rows each) therefore stay on the plain model. Prompts of 64+ tokens
are only ever evaluated by prefill chunks, so their values just have to be computed
the same way every time: `PrefillTwin` evaluates each chunk in a context of the
repacked model, padded to at least 64 rows (flash attention's tiled path, rule T)
and to a multiple of 4 rows (every column through gemm, rule R), and then moves the
sequence's KV cells into the main context (llama_state_seq_get/set_data).

Invariants:
- The twin context has the main context's parameters (the same KV streams), with
  GEMM_ROWS more cells per sequence for padding, so a sequence's state moves between
  them unchanged.
- The twin holds exactly the cells [0, held[seq]) of each sequence, computed by
  twin chunks (or, after a slot restore, copied from the main context). The main
  context's truncations, clears and context shifts reach the twin (`truncate`), so
  those cells are always the prompt cells the main context holds too.
- llama.cpp exports only the cells inside the sliding window of an SWA cache, so
  after a prompt moves in, the main context holds its SWA layers' last window only.
  Generation needs no more (positions only grow past the prompt), and a later prompt
  that reuses a prefix continues from the twin's complete cells, not the main's.
- Every row of every twin decode goes through the same kernels, whatever the
  chunking, the cache hit or the other slots: a prompt's cells are a function of
  the prompt alone (tests/test_twin.py, tests/test_prefill_cache.py).
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from .model import TILED_PREFILL_MIN, Context, ContextParams, Model

#: repacked gemm kernels take the rows of a decode 4 at a time (ggml-cpu/repack.cpp)
GEMM_ROWS = 4


def repack_is_safe(cpuinfo: str | None = None) -> bool:
    """Whether this CPU can run llama.cpp's repacked kernels without risk: x86-64 Linux
    that does not advertise AMX (VMs that advertise AMX but trap it die with SIGILL in
    the AMX buffer type, which repacking turns on)."""
    if cpuinfo is None:
        if not sys.platform.startswith("linux"):
            return False
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return False
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                  if line.startswith("flags")), [])
    return "avx2" in flags and not any(f.startswith("amx") for f in flags)


def load_twin(path: str | Path, **load) -> Model | None:
    """The prefill twin of the model at `path`: the same GGUF loaded with repacked
    weights (`use_extra_bufts`), or None where this CPU cannot run them safely
    (`repack_is_safe`). `load`: Model's other loading options (verbose, n_gpu_layers,
    load_mode)."""
    if not repack_is_safe():
        return None
    return Model(path, use_extra_bufts=True, **load)


def open_context(model: Model, params: ContextParams, prefill_model: Model | None = None) -> Context:
    """A context of `model`, with a prefill twin on `prefill_model` (the same GGUF,
    repacked) where the parameters allow one (`PrefillTwin.usable`)."""
    twin = None
    if prefill_model is not None and PrefillTwin.usable(params):
        twin = PrefillTwin(prefill_model, params)
    try:
        return Context(model, params, twin=twin)
    except BaseException:
        if twin is not None:
            twin.close()
        raise


def twin_pads(n: int) -> int:
    """Padding rows after an n-token chunk: at least TILED_PREFILL_MIN rows, a multiple
    of GEMM_ROWS."""
    rows = max(n, TILED_PREFILL_MIN)
    return rows + (-rows) % GEMM_ROWS - n


class PrefillTwin:
    """The repacked model's context that evaluates prompt chunks for a main context."""

    def __init__(self, model: Model, params: ContextParams):
        """The twin gets GEMM_ROWS more cells per sequence than the main context: the
        engine leaves room for a chunk's padding to 64 rows before the slot's end
        (`Engine._chunk_end`), the rounding to a multiple of 4 may need 3 more. Only
        padding rows use them (removed after the decode); how many cells a context
        has does not change any value (docs/exactness.md)."""
        self.ctx = Context(model, replace(params, n_ctx=params.n_ctx + GEMM_ROWS * params.n_seq_max,
                                          reference_attention=False))  # prompts: the tiled path
        self.held: dict[int, int] = {}  # seq -> the twin holds its cells [0, held)

    @staticmethod
    def usable(params: ContextParams) -> bool:
        """A twin needs chunks that never split (n_ubatch a multiple of GEMM_ROWS, at
        least 64 rows, no more than n_batch)."""
        n_ubatch = min(params.n_ubatch or params.n_batch, params.n_batch)
        return params.batch_invariant and n_ubatch >= TILED_PREFILL_MIN and n_ubatch % GEMM_ROWS == 0

    def truncate(self, seq_id: int | None, n: int) -> None:
        """The main context dropped positions >= n of `seq_id` (None: of every sequence)."""
        for s in list(self.held) if seq_id is None else [seq_id]:
            if self.held.get(s, 0) > n:
                self.ctx.truncate(s, n)
                self.held[s] = n

    def begin(self, main: Context, seq_id: int, n_cached: int) -> None:
        """A new prompt for `seq_id` whose first n_cached tokens `main` holds. If the
        twin does not hold them (a restored slot), they are copied from `main`."""
        if self.held.get(seq_id, 0) < n_cached:
            move_seq(main, self.ctx, seq_id)
        self.held[seq_id] = n_cached

    def chunk(self, main: Context, seq_id: int, tokens: Sequence[int], pos0: int,
              last: bool) -> list[int]:
        """Evaluate prompt tokens [pos0, pos0 + len) of `seq_id` (the twin holds
        [0, pos0)). Returns the twin's row of the last token; with `last`, the prompt's
        cells then move into `main` (replacing what it held of the sequence)."""
        if self.held.get(seq_id, 0) != pos0:
            raise RuntimeError(f"the prefill twin holds {self.held.get(seq_id, 0)} cells of "
                               f"sequence {seq_id}, the next chunk starts at {pos0}")
        rows = self.ctx.run_rows([(seq_id, tokens, pos0, False)], {seq_id: twin_pads(len(tokens))})[0]
        self.held[seq_id] = pos0 + len(tokens)
        if last:
            move_seq(self.ctx, main, seq_id)
        return rows

    def close(self) -> None:
        self.ctx.close()


def move_seq(src: Context, dst: Context, seq_id: int) -> None:
    """Copy `seq_id`'s KV cells from src into dst, replacing what dst held of it. Both
    contexts belong to models of one GGUF and have as many KV streams."""
    dst.set_seq_state(seq_id, src.seq_state(seq_id))
