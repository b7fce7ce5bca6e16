"""Exact decoding on a GPU or other device backend: every decode of one fixed shape.

A device's kernels pick their tiling, reduction splits and thread counts from a
tensor's shape, so a row's logits depend on how many rows its decode holds (llama.cpp's
CUDA mmvq/mmq groups: upstream #27407). They do not depend on the *contents* of the
other rows. So if every decode has the same shape, a token's logits are the same
whether it is decoded alone (spec-off) or as row k of a verify (docs/exactness.md,
"Exact decoding on a device"). The shape here:

- **One llama.cpp context per slot**, unified KV, three sequences: 0 the slot's tokens,
  1 padding rows, 2 a sentinel. No other slot's cells ever sit between a slot's cells
  (on a device the attention sums are tiled over the cells, so where a cell sits
  changes the rounding, not only which cells are summed).
- **Every decode has exactly `rows` rows, each with logits** (the output layer's
  column count is part of the shape): the slot's tokens at their positions, then
  padding rows of sequence 1 at positions 0.. (removed right after; they see only
  each other). llama.cpp then lays the slot's cells out at cells = positions: a
  removal sets its search head to the first freed cell.
- **The KV view.** llama.cpp sizes the attention's KV view by the highest used cell,
  padded to 256 (`get_n_kv`), and that size picks e.g. the softmax's block size. With
  cells = positions and padding rows after the real ones, a decode whose first row sits
  at position p has the view `view(p)` = pad256(p + rows): a row decoded alone at q sees
  view(q). So a decode never holds rows whose own view differs from its first row's
  (`_SlotContext.take`: an entry is split where the view grows; a verify across such a
  point costs two decodes, once every 256 positions). After a context shift cells are
  no longer positions: then **the sentinel**, one cell of sequence 2 in the cache's last
  cell, makes the view the whole cache for every decode of that slot, until the slot is
  cut back to its unshifted cells.
- A prompt is evaluated in `rows`-row decodes too, so every cell is computed as a
  generation step computes it, whatever the chunking or the prompt cache.

`self_check` decodes a short window one row a step and again as one verify (and as
two), and requires bit-identical logits on every row, as the CPU kernels' self-tests
do; `runtime` turns this mode on only if it passes.

Invariants: a slot's cells hold positions 0..n-1 in cells 0..n-1 until a shift (then the
sentinel holds the last cell); `decode` returns global row indices valid until the next
decode (`logits_at`, `argmax_at`, `logits_source`); at most `n_ctx_seq` positions a slot
(its cache less the padding rows).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from .backend import FreedOnCollect, _llama, kv_type
from .batch_views import BatchViews
from .kernels import line
from .kernels.hooks import KernelHooks
from .logit_rows import LogitRows
from .model import Model, ModelError

#: rows of every decode on a device (verifies of up to ROWS - 1 drafted tokens). On an
#: H200 (CUDA, 4-block SmolLM2, natural views) a decode of 4 rows 0.36 ms, 8 rows 0.42 ms,
#: 16 rows 0.63 ms, llama.cpp's unpadded one-row decode 0.26 ms; 8 rows gave auto the
#: most on 2 of 4 fixtures and the 12-document pipeline, 4 rows a 1.2x faster spec-off
#: (docs/benchmarks.md). A fixed width, not a timed choice: the width is part of every
#: row's values, so two runs must not choose differently. NGRAMSPEC_FIXED_ROWS sets
#: another (at least 3: llama.cpp reserves one output per sequence); the start-up check
#: decides whether it is exact.
ROWS = max(3, int(os.environ.get("NGRAMSPEC_FIXED_ROWS", "8") or 8))
PAD_SEQ, SENTINEL_SEQ = 1, 2
#: llama.cpp pads the attention's KV view to a multiple of this (llama_kv_cache::get_n_kv)
VIEW_QUANTUM = 256
#: rows an entry is given per global index (`_index`): more than any entry holds
_STRIDE = 1 << 20


@dataclass(frozen=True)
class CheckResult:
    """The start-up check: whether one-row and `rows`-row decodes agree bit for bit."""

    passed: bool
    rows: int
    rows_differing: int
    max_diff: float
    seconds: float

    @property
    def reason(self) -> str:
        if self.passed:
            return f"one-row and {self.rows}-row decodes agree bit for bit"
        return (f"{self.rows_differing} logit rows differ between one-row and {self.rows}-row "
                f"decodes (max |diff| {self.max_diff:.3g})")


class _SlotContext:
    """One slot's llama.cpp context: `rows`-row decodes, padding rows, the sentinel."""

    def __init__(self, lc, model: Model, n_ctx: int, rows: int, params):
        cp = lc.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, rows, rows, 3
        cp.n_threads = params.n_threads
        cp.n_threads_batch = params.n_threads_batch or params.n_threads
        cp.flash_attn_type = -1 if params.flash_attn is None else int(params.flash_attn)
        cp.kv_unified, cp.swa_full, cp.no_perf = True, True, True
        cp.type_k, cp.type_v = kv_type(params.type_k), kv_type(params.type_v)
        self.lc, self.rows, self.n_vocab = lc, rows, model.n_vocab
        self.logit_rows = LogitRows(model.n_vocab)
        self.ptr = lc.llama_init_from_model(model.ptr, cp)
        if not self.ptr:
            raise ModelError(f"llama.cpp could not create a context of {n_ctx} tokens for "
                             f"{model.path}; try a smaller -c/--ctx-size")
        self.views = v = BatchViews(lc, rows, 3)
        v.logits[:] = 1  # every row has logits, except during `_run`
        self._tok, self._pos, self._seq, self._logits, self._ramp = (
            v.token, v.pos, v.seq, v.logits, v.ramp)
        self.memory = lc.llama_get_memory(self.ptr)
        self.n_ctx = lc.llama_n_ctx(self.ptr)
        self.kept = -1  # after a shift: the leading cells still at their positions (else -1)

    def view(self, pos: int) -> int:
        """The KV view llama.cpp gives a decode whose first row is at `pos`: the highest
        used cell + 1 (the decode's last padding row's) padded to 256, at most the
        cache; the whole cache once the sentinel holds its last cell."""
        if self.kept >= 0:
            return self.n_ctx
        top = -(-(pos + self.rows) // VIEW_QUANTUM) * VIEW_QUANTUM
        return min(self.n_ctx, max(VIEW_QUANTUM, top))

    def take(self, pos: int, n: int) -> int:
        """How many of n tokens at pos.. one decode holds: at most `rows`, and none
        whose own decode alone would see a larger view than the first's."""
        if self.kept >= 0:
            return min(n, self.rows)
        return max(1, min(n, self.rows, self.view(pos) - self.rows - pos + 1))

    def place_sentinel(self, kept: int) -> None:
        """After a shift: fill the free cells with sequence 2 and keep the last one
        (the cache's last: free cells are taken in index order from the first freed,
        llama_kv_cache::find_slot). `kept`: the cells still at their positions."""
        if self.kept >= 0:
            self.kept = min(self.kept, kept)
            return
        lo, hi = self.lc.llama_memory_seq_pos_min(self.memory, 0), \
            self.lc.llama_memory_seq_pos_max(self.memory, 0)
        free = self.n_ctx - (hi - lo + 1 if hi >= 0 else 0)
        for p0 in range(0, free, self.rows):
            n = min(self.rows, free - p0)
            self._run([(1, p0 + i, SENTINEL_SEQ, False) for i in range(n)])
        self.lc.llama_memory_seq_rm(self.memory, SENTINEL_SEQ, 0, free - 1)
        if self.lc.llama_memory_seq_pos_max(self.memory, SENTINEL_SEQ) != free - 1:
            raise ModelError("llama.cpp did not keep the sentinel cell of a fixed-shape context")
        self.kept = kept

    def cut(self, n: int) -> None:
        """Keep the slot's first n positions; the sentinel goes once they are all
        unshifted (cells = positions again)."""
        self.lc.llama_memory_seq_rm(self.memory, 0, n, -1)
        if 0 <= self.kept and n <= self.kept:
            self.lc.llama_memory_seq_rm(self.memory, SENTINEL_SEQ, -1, -1)
            self.kept = -1

    def _run(self, rows) -> None:
        """Decode `rows` [(token, pos, seq, logits)] as they are (the sentinel's fill)."""
        for i, (tok, pos, seq, logits) in enumerate(rows):
            self._tok[i], self._pos[i], self._seq[i], self._logits[i] = tok, pos, seq, logits
        self._decode(len(rows))
        self._logits[:] = 1  # `step`'s rows all have logits

    def _decode(self, n: int) -> None:
        self.views.batch.n_tokens = n
        rc = self.lc.llama_decode(self.ptr, self.views.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc} (batch of {n} tokens)")
        self.lc.llama_synchronize(self.ptr)  # a device returns before it has finished

    def step(self, tokens: Sequence[int], pos0: int) -> None:
        """Decode 1..rows tokens of the slot at pos0.., padded to `rows` rows of sequence
        1 at positions 0.. (their token: the last real one; a row's values do not depend
        on the others'), every row with logits; the padding rows' cells removed after."""
        n, rows = len(tokens), self.rows
        self._tok[:n] = tokens
        self._tok[n:] = self._tok[n - 1]
        self._pos[:n] = self._ramp[:n]
        self._pos[:n] += pos0
        self._pos[n:] = self._ramp[:rows - n]
        self._seq[:n] = 0
        self._seq[n:] = PAD_SEQ
        self._decode(rows)
        if n < rows:
            self.lc.llama_memory_seq_rm(self.memory, PAD_SEQ, -1, -1)

    def row(self, i: int) -> np.ndarray:
        """Logits of row i of the last step (a view into llama.cpp's buffer)."""
        return self.logit_rows.row(self.ptr, i)

    def close(self) -> None:
        self.views.free()  # once: it frees nothing a second time
        if self.ptr:
            self.lc.llama_free(self.ptr)
            self.ptr = None


class _DeviceKernels:
    """ngramspec's CPU kernels in this mode (all off) and the cells' mode: a device's
    values differ from the CPU's, so slot files name the shape (slot_state's digest)."""

    def __init__(self, hooks: KernelHooks, rows: int):
        self.hooks, self.cell_mode = hooks, f"device-{rows}-rows"

    def state(self) -> dict:
        return self.hooks.state()

    def line(self) -> str:
        return line(self.state(), self.cell_mode)

    def check(self) -> None:
        pass

    def close(self) -> None:
        self.hooks.close()


class FixedShapeContext(FreedOnCollect):
    """The `llama.context.Context` interface over one fixed-shape context per slot."""

    twin = None
    prompts_in_twin = False
    head = None
    swa_span = None
    tiled_prefill = False
    invariant = True
    per_seq_streams = True
    logit_quantum = 1
    lone_ok = True
    ptr = None  # no one context: `logits_source`, `seq_handle`
    compute_s = 0.0

    def __init__(self, model: Model, params, rows: int = ROWS):
        lc = _llama()
        self.model, self.fixed_rows = model, rows
        self.params = replace(params, own_head=False, own_attention=False, own_matmul=False,
                              reference_attention=False)
        n_seq = params.n_seq_max
        per_slot = max(params.n_ctx // n_seq, 2 * rows)
        self.kernels = _DeviceKernels(KernelHooks(lc, model.ptr, self.params,
                                                  lc.llama_context_default_params()), rows)
        self.slots: list[_SlotContext] = []
        try:
            for _ in range(n_seq):
                self.slots.append(_SlotContext(lc, model, per_slot, rows, self.params))
        except BaseException:
            self.close()
            raise
        self.n_ctx_seq = self.slots[0].n_ctx - rows  # room for the padding rows
        self.n_ctx = self.n_ctx_seq * n_seq
        self.n_batch = rows * n_seq
        self.n_ubatch = rows
        self.n_vocab = model.n_vocab
        self._where: dict[int, tuple[int, int]] = {}
        self._saved: dict[int, np.ndarray] = {}

    @property
    def rows(self) -> int:
        """Rows of every decode (`fixed_rows`)."""
        return self.fixed_rows

    @property
    def prefill_chunk(self) -> int:
        return 4 * self.rows

    @property
    def cost_layout(self) -> dict:
        return {"per_seq_streams": True, "n_ubatch": self.rows, "pad": True,
                "logit_quantum": 1, "lone_ok": True, "fixed_rows": self.rows}

    def close(self) -> None:
        for s in getattr(self, "slots", []):
            s.close()
        self.slots = []
        if hasattr(self, "kernels"):
            self.kernels.close()

    def decode(self, entries, argmax_only: bool = False) -> list[list[int]]:
        """Each entry (seq_id, tokens, first position, all_logits) in decodes of
        `rows` rows of its slot's context, in order. Returns per entry the global
        indices of its logit rows (every token's with all_logits, else the last's); a
        row of an entry's earlier decode is copied out before the next overwrites it."""
        t0 = time.perf_counter()
        self._where.clear()
        self._saved.clear()
        out = []
        for seq_id, tokens, pos0, all_logits in entries:
            slot, n = self.slots[seq_id], len(tokens)
            mine, c0 = [], 0
            while c0 < n:
                k = slot.take(pos0 + c0, n - c0)
                slot.step(tokens[c0:c0 + k], pos0 + c0)
                last = c0 + k >= n
                for j in range(k):
                    i = c0 + j
                    if not (all_logits or (all_logits is not None and i == n - 1)):
                        continue
                    index = seq_id * _STRIDE + i
                    if last:
                        self._where[index] = (seq_id, j)
                    else:
                        self._saved[index] = slot.row(j).copy()
                    mine.append(index)
                c0 += k
            out.append(mine)
        self.compute_s = time.perf_counter() - t0
        return out

    def run_rows(self, entries, pads: dict[int, int] | None = None,
                 pad_logits: dict[int, int] | None = None,
                 argmax_only: bool = False) -> list[list[int]]:
        """`decode` (the padding is this context's own: `pads` are not needed)."""
        return self.decode(entries, argmax_only)

    def prefill(self, seq_id: int, tokens: Sequence[int], pos0: int,
                last: bool = True) -> tuple["FixedShapeContext", list[int]]:
        return self, self.decode([(seq_id, tokens, pos0, False)])[0]

    def begin_prompt(self, seq_id: int, n_cached: int) -> None:
        """Nothing: every cell is computed alike, whatever the prompt cache."""

    def logits_at(self, index: int) -> np.ndarray:
        saved = self._saved.get(index)
        if saved is not None:
            return saved
        seq_id, row = self._where[index]
        return self.slots[seq_id].row(row)

    def argmax_at(self, index: int) -> int:
        return int(np.argmax(self.logits_at(index)))

    def logits_source(self, index: int) -> tuple:
        """(llama_context pointer, row) that holds logit row `index` (llama.cpp's samplers)."""
        seq_id, row = self._where[index]
        return self.slots[seq_id].ptr, row

    def seq_handle(self, seq_id: int) -> tuple:
        """(llama_context pointer, llama.cpp sequence id) of `seq_id`'s cells (slot files)."""
        return self.slots[seq_id].ptr, 0

    def truncate(self, seq_id: int, n: int) -> None:
        self.slots[seq_id].cut(n)

    def shift(self, seq_id: int, n_keep: int, n_discard: int, n_past: int) -> None:
        """Context shift, as `Context.shift`. The freed cells are taken again in index
        order by the rows of the next decodes, real rows first, with speculation on
        and off alike (the shift happens at the same token: engine.py); from here the
        slot's decodes see the whole cache (`_SlotContext.place_sentinel`)."""
        s = self.slots[seq_id]
        s.lc.llama_memory_seq_rm(s.memory, 0, n_keep, n_keep + n_discard)
        s.lc.llama_memory_seq_add(s.memory, 0, n_keep + n_discard, n_past, -n_discard)
        s.place_sentinel(n_keep)  # cells are no longer positions: the whole cache's view

    def positions(self, seq_id: int) -> tuple[int, int]:
        s = self.slots[seq_id]
        return (int(s.lc.llama_memory_seq_pos_min(s.memory, 0)),
                int(s.lc.llama_memory_seq_pos_max(s.memory, 0)))

    def clear(self, seq_id: int | None = None) -> None:
        for i in (range(len(self.slots)) if seq_id is None else [seq_id]):
            self.truncate(i, 0)

    def self_check(self, window: int = 8) -> CheckResult:
        """Decode `window` prompt tokens, then `rows` tokens one a step, then the same
        tokens as one verify and as two: every row's logits must be bit-identical. Then
        the same one verify where the KV view grows inside it (`_SlotContext.take`),
        where the slot is larger than one view. Runs on slot 0, which it leaves empty."""
        t0 = time.perf_counter()
        three = min(3, self.rows - 1)
        diffs = self._differences(window, ((self.rows,), (three, self.rows - three)))
        edge = VIEW_QUANTUM - self.rows - 2
        if self.slots[0].n_ctx > VIEW_QUANTUM and edge + self.rows <= self.n_ctx_seq:
            diffs += self._differences(edge, ((self.rows,),))
        self.clear(0)
        bad = [d for d in diffs if d.any() or np.isnan(d).any()]
        worst = max((float(np.nanmax(d)) for d in bad), default=0.0)
        return CheckResult(not bad, self.rows, len(bad), worst, time.perf_counter() - t0)

    def _differences(self, window: int, splits) -> list[np.ndarray]:
        """|logits| differences between `rows` tokens decoded one a step after `window`
        prompt tokens and the same tokens decoded in each split's decodes, on slot 0."""
        slot = self.slots[0]
        toks = [(1000 + 37 * i) % self.n_vocab for i in range(window + self.rows)]
        self.clear(0)
        self.decode([(0, toks[:window], 0, False)])
        ref = []
        for i in range(self.rows):
            slot.step([toks[window + i]], window + i)
            ref.append(slot.row(0).copy())
        diffs = []
        for split in splits:
            self.truncate(0, window)
            p = 0
            for n in split:
                rows = self.decode([(0, toks[window + p:window + p + n], window + p, True)])[0]
                diffs += [np.abs(self.logits_at(r) - ref[p + j]) for j, r in enumerate(rows)]
                p += n
        return diffs
