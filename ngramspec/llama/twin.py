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
- The twin context has the main context's parameters but one KV stream of at most
  one slot's size (plus GEMM_ROWS cells for padding), grown as prompts need; it holds
  one slot's prompt cells at a time, from cell 0, and keeps the others' as state
  bytes of every cell (ALL_CELLS); `kv_state.restream` lays a sequence's state out
  for the main context's streams, the cells' bytes unchanged.
- The twin model has no vocabulary (`no_vocab`) and, after each chunk, none of the
  model file's pages mapped (`file_pages.drop` on its own mapping): resident memory
  counts a page once per mapping, and the main model maps the whole file anyway.
- The twin holds exactly the cells [0, held[seq]) of each slot, computed by twin
  chunks (or, after a slot restore, copied from the main context). The main
  context's truncations, clears and context shifts reach the twin (`truncate`), so
  those cells are always the prompt cells the main context holds too.
- llama.cpp exports a sequence's cells inside the sliding window of an SWA cache only,
  so after a prompt moves in, the main context holds its SWA layers' last window.
  Generation needs no more (positions only grow past the prompt), and a later prompt
  that reuses a prefix continues from the twin's complete cells, not the main's.
- Every row of every twin decode goes through the same kernels, whatever the
  chunking, the cache hit or the other slots: a prompt's cells are a function of
  the prompt alone (tests/test_twin.py, tests/test_prefill_cache.py).
"""
from __future__ import annotations

import ctypes
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from . import file_pages, gguf_types, kv_state, seq_cells
from .backend import _llama
from .context import TILED_PREFILL_MIN, Context, ContextParams, check_chunk
from .host import cpu_flags
from .model import Model
from ..settings.llama_values import MLOCK_MODES

#: repacked gemm kernels take the rows of a decode 4 at a time (ggml-cpu/repack.cpp)
GEMM_ROWS = 4

#: the sequence id that makes llama_state_seq_get_data write every cell of the context:
#: with a sequence's id, a sliding-window cache writes only the cells inside the window
#: of the sequence's last position, and a later prompt that reuses a shorter prefix
#: needs the others. The twin holds one sequence (0), so the bytes are those of its
#: cells, in the per-sequence format, and load back with seq_cells.write(ctx, 0, ...): that
#: path places them from cell 0 and leaves llama.cpp's search head after them, as the
#: chunks that made them did (a whole-context load, sequence -1, leaves the head at 0,
#: and the next chunk would then overwrite the sliding-window cache's oldest cells
#: instead of appending: another cell layout, other values)
ALL_CELLS = -1

#: cells a prefill twin's KV stream starts with (it grows to a slot's size when a prompt
#: needs more: PrefillTwin._room)
TWIN_START_CELLS = 1024
#: the main context's ubatch size where a twin evaluates its prompts (`generation_params`):
#: 4 sequences of a whole invariant draft (64 tokens each) in one ubatch
GENERATION_UBATCH = 256


def repack_is_safe(cpuinfo: str | None = None) -> bool:
    """Whether this CPU can run llama.cpp's repacked kernels without risk: x86-64 Linux
    that does not advertise AMX (VMs that advertise AMX but trap it die with SIGILL in
    the AMX buffer type, which repacking turns on)."""
    flags = cpu_flags(cpuinfo)
    return "avx2" in flags and not any(f.startswith("amx") for f in flags)


def load_twin(path: str | Path, **load) -> Model | None:
    """The prefill twin of the model at `path`: the same GGUF loaded with repacked
    weights (`use_extra_bufts`) and no vocabulary (`no_vocab`), or None where this
    CPU cannot run them safely (`repack_is_safe`). `load`: Model's other loading
    options (verbose, n_gpu_layers, load_mode).

    Unless the load locks the file (mlock), the twin's mapping of the file is found
    (the one that appeared before llama.cpp's first progress call: `file_span`) and
    its pages are dropped there (file_pages.py): llama.cpp maps the whole file
    populated, the main model's load maps it again, and resident memory would peak
    at two copies. Where the mapping cannot be told apart (two appeared), every
    mapping of the file is dropped every 1/16 of the load instead, and `file_span`
    stays None."""
    if not repack_is_safe():
        return None
    overrides = no_vocab(path)
    if load.get("load_mode", -1) in MLOCK_MODES:
        return Model(path, use_extra_bufts=True, overrides=overrides, **load)
    before, state = file_pages.spans(path), {"first": True, "own": None, "done": 0.0}

    def dropping(fraction: float) -> None:
        if state["first"]:  # the twin's mapping is in place, populated
            state["first"] = False
            new = file_pages.spans(path) - before
            if len(new) == 1:
                state["own"] = new.pop()
                file_pages.drop(path, state["own"])
                return
        if state["own"] is None and fraction >= state["done"] + 1 / 16:
            state["done"] = fraction
            file_pages.drop(path)

    twin = Model(path, use_extra_bufts=True, on_progress=dropping, overrides=overrides, **load)
    twin.file_span = state["own"]
    return twin


def no_vocab(path: str | Path) -> dict[str, int | str] | None:
    """GGUF metadata overrides that load the model without its vocabulary: tokenizer
    model "none" with `<arch>.vocab_size` dummy tokens, so the embedding and output
    matrices keep their shape. The twin only evaluates token ids the main model
    tokenized; it never tokenizes, detokenizes or samples, and llama.cpp's graph does
    not read the vocabulary, so no value changes. A 262k-token vocabulary is ~45 MiB
    of strings and maps per loaded model (and most of a load's time). None (load as
    is) if the header does not give the architecture and token count."""
    found = gguf_types.vocab_size(path)
    if found is None:
        return None
    arch, n_tokens = found
    return {"tokenizer.ggml.model": "none", f"{arch}.vocab_size": n_tokens}


def open_context(model: Model, params: ContextParams, prefill_model: Model | None = None) -> Context:
    """A context of `model`, with a prefill twin on `prefill_model` (the same GGUF,
    repacked) where the parameters allow one (`PrefillTwin.usable`): a `TwinnedContext`.
    The twin keeps params' ubatch size (its prompt chunks); the main context, which then
    decodes generation batches only, is reserved for GENERATION_UBATCH
    (`generation_params`). Where that context cannot take tiled prompt chunks after all
    (llama.cpp clamped its batch below TILED_PREFILL_MIN), it is a plain one with the
    SWA cache a twin's main context has."""
    if prefill_model is None or not PrefillTwin.usable(params):
        return Context(model, params)
    twin = PrefillTwin(prefill_model, params)
    gen = generation_params(params)
    try:
        return TwinnedContext(model, gen, twin)
    except TwinUnused:
        return Context(model, replace(gen, swa_full=bool(gen.swa_full)))
    except BaseException:
        twin.close()
        raise


def generation_params(params: ContextParams) -> ContextParams:
    """The main context's parameters beside a twin: ubatches of at most
    GENERATION_UBATCH tokens (never more than params give). Its decodes are generation
    steps (at most MAX_INVARIANT_BATCH tokens a sequence) and prompts under
    TILED_PREFILL_MIN tokens, so the size only decides how a decode of more tokens
    splits (`ubatch.layout` pads whatever split it makes: every split is exact, rule
    U) and what llama.cpp reserves: a window-size SWA stream holds n_swa + n_ubatch
    cells (Gemma 3: 768 instead of 1,024 a slot, -30 MiB at 8 slots), and the compute
    buffer is sized for n_ubatch rows."""
    return replace(params, n_ubatch=min(params.ubatch, GENERATION_UBATCH))


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
        """The twin's one stream can grow to GEMM_ROWS more cells than a main context's
        slot (`cap`): the engine leaves room for a chunk's padding to 64 rows before the
        slot's end (`Engine._chunk_end`), the rounding to a multiple of 4 may need 3
        more. Only padding rows use them (removed after the decode). It starts with
        room for one batch or TWIN_START_CELLS cells, whichever is more, and grows
        (`_room`) when a prompt needs more: its KV cache is most of its memory. How
        many cells a context has does not change any value: llama.cpp rounds the cache
        to a multiple of 256 cells and attends over the used cells rounded up to 256,
        whatever the cache's size (docs/exactness.md, rule R)."""
        per_slot = -(-params.n_ctx // params.n_seq_max)
        self.cap = per_slot + GEMM_ROWS
        self._params = replace(params, n_seq_max=1,
                               reference_attention=False,  # prompts: the tiled path
                               own_head=False,  # no logits here, no output layer read
                               swa_full=True)  # every prompt cell, for prefix hits
        start = max(TWIN_START_CELLS, params.n_batch + GEMM_ROWS)
        self.ctx = Context(model, replace(self._params, n_ctx=min(self.cap, start)))
        self.held: dict[int, int] = {}  # slot -> the twin's cells [0, held) of it
        self._loaded: int | None = None  # the slot whose cells are in the twin's sequence 0
        # slot -> its cells as an ALL_CELLS state, and how many cells that holds
        self._saved: dict[int, tuple[ctypes.Array, int]] = {}
        self._valid: dict[int, int] = {}  # slot -> _saved's cells [0, valid) are still its

    @staticmethod
    def usable(params: ContextParams) -> bool:
        """A twin needs chunks that never split (n_ubatch a multiple of GEMM_ROWS, at
        least 64 rows, no more than n_batch)."""
        n_ubatch = params.ubatch
        return params.batch_invariant and n_ubatch >= TILED_PREFILL_MIN and n_ubatch % GEMM_ROWS == 0

    def _room(self, n: int) -> None:
        """Make the twin's stream hold at least n cells (at most `cap`): a context twice
        the size (or n, or `cap`) replaces it, with the loaded slot's cells."""
        if n <= self.ctx.n_ctx or self.ctx.n_ctx >= self.cap:
            return
        sizes = [self.ctx.n_ctx, min(self.cap, max(n, 2 * self.ctx.n_ctx))]
        cells = seq_cells.read(self.ctx, ALL_CELLS) if self.ctx.positions(0)[1] >= 0 else None
        model = self.ctx.model
        self.ctx.close()  # first: the two caches are never resident at once
        try:
            self.ctx = Context(model, replace(self._params, n_ctx=sizes[1]))
        except BaseException:  # out of memory: the old size again, then raise
            self.ctx = Context(model, replace(self._params, n_ctx=sizes[0]))
            raise
        finally:
            if cells is not None:
                seq_cells.write(self.ctx, 0, cells)

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
            self._room(main.positions(seq_id)[1] + 1 + GEMM_ROWS)  # main's cells, all
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
        self._room(pos0 + len(tokens) + twin_pads(len(tokens)))
        self.ctx.run_rows([(0, tokens, pos0, None)], {0: twin_pads(len(tokens))})
        if self.ctx.model.file_span is not None:  # its pages of the file: the next chunk's
            file_pages.drop(self.ctx.model.path, self.ctx.model.file_span)
        self.held[seq_id] = pos0 + len(tokens)
        if last:  # main first: its copy is freed before the saved one is made
            kv_state.put(main, seq_id, *kv_state.get(self.ctx, 0))  # the window will do
            self._save(seq_id)

    def _save(self, seq_id: int) -> None:
        """Keep the loaded slot's cells as state bytes (valid for all of them): every
        cell, with the sliding-window layers' cells out of the window too (a later
        prompt of the slot may reuse any prefix of this one)."""
        cells = self.held.get(seq_id, 0)
        self._saved[seq_id] = seq_cells.read(self.ctx, ALL_CELLS), cells
        self._valid[seq_id] = cells

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
            state, cells = self._saved[seq_id]
            self._room(cells + GEMM_ROWS)
            seq_cells.write(self.ctx, 0, state)
            self.ctx.truncate(0, need)

    def close(self) -> None:
        self.ctx.close()


class TwinUnused(Exception):
    """A TwinnedContext whose batch cannot hold a tiled prompt chunk (closed, twin too)."""


class TwinnedContext(Context):
    """A context whose prompts a `PrefillTwin` evaluates: the twin wraps what touches
    prompt cells (`prefill`, `begin_prompt`, `truncate`, `shift`, `clear`, `close`);
    every other decode is the plain context's.

    Invariant: every truncation, context shift and clear of this context reaches the
    twin, so the twin's cells of a slot are always prompt cells this context holds."""

    prompts_in_twin = True

    def __init__(self, model: Model, params: ContextParams, twin: PrefillTwin):
        self.twin = twin  # first: the output layer's start-up check truncates
        super().__init__(model, params)
        if not self.tiled_prefill:
            self.close()
            raise TwinUnused

    @property
    def prefill_chunk(self) -> int:
        """The twin's ubatch: its own, larger than this context's (`generation_params`)."""
        return min(self.twin.ctx.n_ubatch, self.twin.ctx.n_batch)

    def prefill(self, seq_id: int, tokens: Sequence[int], pos0: int,
                last: bool = True) -> tuple[Context, list[int]]:
        """Evaluate a prompt chunk in the twin (padded to TILED_PREFILL_MIN rows and to
        a multiple of GEMM_ROWS, rules T and R); the sequence's cells move here after
        the `last` chunk. Returns this context and the last token's logit row (none
        after a chunk that is not the last).

        The twin computes no logits, so it never reads the output layer (its pages of
        the model file stay out of memory, `file_pages.py`): after the last chunk, this
        context evaluates the prompt's last token again, alone, in place of the twin's
        cell (a generation decode, invariant like every other; docs/exactness.md, "The
        twin computes no logits"). The twin keeps its own cell of that token, so a later
        prompt that extends this one continues from twin cells only."""
        n = check_chunk(tokens, self.prefill_chunk)
        self.twin.chunk(self, seq_id, tokens, pos0, last)
        if not last:
            return self, []
        end = pos0 + n - 1
        _llama().llama_memory_seq_rm(self.memory, seq_id, end, -1)  # not the twin's
        return self, self.decode([(seq_id, [tokens[-1]], end, False)])[0]

    def begin_prompt(self, seq_id: int, n_cached: int) -> None:
        self.twin.begin(self, seq_id, n_cached)

    def truncate(self, seq_id: int, n: int) -> None:
        super().truncate(seq_id, n)
        self.twin.truncate(seq_id, n)

    def shift(self, seq_id: int, n_keep: int, n_discard: int, n_past: int) -> None:
        self.twin.truncate(seq_id, n_keep)
        super().shift(seq_id, n_keep, n_discard, n_past)

    def clear(self, seq_id: int | None = None) -> None:
        super().clear(seq_id)
        if seq_id is None:
            self.twin.truncate(None, 0)

    def close(self) -> None:
        if self.twin is not None:
            self.twin.close()
            self.twin = None
        super().close()
