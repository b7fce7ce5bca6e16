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
- The twin context has the main context's parameters but one KV stream of one slot's
  size (plus GEMM_ROWS cells for padding); it holds one slot's prompt cells at a time,
  from cell 0, and keeps the others' as state bytes (`kv_state.restream` lays a
  sequence's state out for the other context's streams, the cells' bytes unchanged).
- The twin holds exactly the cells [0, held[seq]) of each slot, computed by twin
  chunks (or, after a slot restore, copied from the main context). The main
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

import ctypes
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from . import kv_state
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


#: madvise(2) advice: drop the range's page-table entries (a shared file mapping's
#: pages stay in the page cache and fault back in on the next read)
_MADV_DONTNEED = 4


def drop_file_pages(path: str | Path) -> int:
    """Unmap the resident pages of every read-only mapping of the file at `path` from
    this process (madvise MADV_DONTNEED; Linux only); returns the bytes advised.

    llama.cpp maps a GGUF with MAP_POPULATE, so a model and its twin each map every
    page of the file, and resident memory counts the file twice. The pages are the
    page cache's, shared by both mappings: dropping the entries frees nothing the
    models need, and each then faults back in what it reads (the main model all of
    it, the twin its layers without the output layer and the embedding rows of the
    prompts' tokens, since it computes no logits). Values are unaffected: the bytes
    are the file's either way. No-op for a locked (mlock) or unreadable mapping."""
    if not sys.platform.startswith("linux"):
        return 0
    target = str(Path(path).resolve())
    try:
        with open("/proc/self/maps") as f:
            spans = [line.split()[0] for line in f if line.rstrip("\n").endswith(" " + target)]
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return 0
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    done = 0
    for span in spans:
        lo, hi = (int(x, 16) for x in span.split("-"))
        if libc.madvise(lo, hi - lo, _MADV_DONTNEED) == 0:
            done += hi - lo
    return done


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
    """The repacked model's context that evaluates prompt chunks for a main context.

    It has one KV stream and holds one sequence's prompt cells at a time (in its
    sequence 0, from cell 0, as a context of its own would); the other slots' prompt
    cells wait as state bytes (`_saved`, the size of the prompt, not of the slot) and
    are loaded back when their slot's next prompt or chunk comes. Per slot:
    held[seq] prompt cells [0, held) are the twin's (loaded, or saved and still
    valid: `_valid` >= held for every slot but the loaded one)."""

    def __init__(self, model: Model, params: ContextParams):
        """The twin's one stream gets GEMM_ROWS more cells than a main context's slot:
        the engine leaves room for a chunk's padding to 64 rows before the slot's end
        (`Engine._chunk_end`), the rounding to a multiple of 4 may need 3 more. Only
        padding rows use them (removed after the decode); how many cells a context
        has does not change any value (docs/exactness.md)."""
        per_slot = -(-params.n_ctx // params.n_seq_max)
        self.ctx = Context(model, replace(params, n_ctx=per_slot + GEMM_ROWS, n_seq_max=1,
                                          reference_attention=False,  # prompts: the tiled path
                                          swa_full=True))  # every prompt cell, for prefix hits
        self.held: dict[int, int] = {}  # slot -> the twin's cells [0, held) of it
        self._loaded: int | None = None  # the slot whose cells are in the twin's sequence 0
        self._saved: dict[int, tuple[ctypes.Array, list[int]]] = {}  # slot -> (state, sizes)
        self._valid: dict[int, int] = {}  # slot -> _saved's cells [0, valid) are still its

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
                self.held[s] = n
                if s == self._loaded:
                    self.ctx.truncate(0, n)
            if s in self._valid:
                self._valid[s] = min(self._valid[s], n)
            if n == 0:
                self._saved.pop(s, None)

    def begin(self, main: Context, seq_id: int, n_cached: int) -> None:
        """A new prompt for `seq_id` whose first n_cached tokens `main` holds. If the
        twin does not hold them (a restored slot), they are copied from `main`."""
        if self.held.get(seq_id, 0) < n_cached:
            self._load(seq_id, 0)
            kv_state.put(self.ctx, 0, *kv_state.get(main, seq_id))
        else:
            self._load(seq_id, n_cached)
        self.held[seq_id] = n_cached
        self.ctx.truncate(0, n_cached)

    def chunk(self, main: Context, seq_id: int, tokens: Sequence[int], pos0: int,
              last: bool) -> None:
        """Evaluate prompt tokens [pos0, pos0 + len) of `seq_id` (the twin holds
        [0, pos0)), without logits: the twin never reads the output layer. With
        `last`, the prompt's cells then move into `main` (replacing what it held of
        the sequence)."""
        if self.held.get(seq_id, 0) != pos0:
            raise RuntimeError(f"the prefill twin holds {self.held.get(seq_id, 0)} cells of "
                               f"sequence {seq_id}, the next chunk starts at {pos0}")
        self._load(seq_id, pos0)
        self.ctx.run_rows([(0, tokens, pos0, None)], {0: twin_pads(len(tokens))})
        self.held[seq_id] = pos0 + len(tokens)
        if last:
            kv_state.put(main, seq_id, *self._save(seq_id))

    def _save(self, seq_id: int) -> tuple[ctypes.Array, list[int]]:
        """Keep the loaded slot's cells as state bytes (valid for all of them)."""
        self._saved[seq_id] = kv_state.get(self.ctx, 0)
        self._valid[seq_id] = self.held.get(seq_id, 0)
        return self._saved[seq_id]

    def _load(self, seq_id: int, need: int) -> None:
        """Make `seq_id`'s cells [0, need) the twin's sequence 0 (saving the slot
        loaded before, if its cells are not all saved yet)."""
        if self._loaded == seq_id:
            return
        last = self._loaded
        if last is not None and self.held.get(last, 0) > self._valid.get(last, 0):
            self._save(last)
        self.ctx.truncate(0, 0)
        self._loaded = seq_id
        if need > 0:
            if self._valid.get(seq_id, 0) < need:
                raise RuntimeError(f"the prefill twin lost the cells of sequence {seq_id}")
            self.ctx.set_seq_state(0, self._saved[seq_id][0])
            self.ctx.truncate(0, need)

    def close(self) -> None:
        self.ctx.close()
