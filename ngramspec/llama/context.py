"""A llama.cpp context: the KV cache of up to n_seq_max sequences, one batched decode
at a time, in the layout batch invariance needs (docs/exactness.md).

Invariants:
- `decode` evaluates one llama_batch that may hold several sequences; it returns, per
  entry, the batch indices of the logit rows it asked for. In a batch-invariant context
  every decode keeps the invariance rules (`layout_for`: padding, ubatch split) or
  raises ValueError before anything is evaluated.
- `truncate(seq, n)` removes every KV entry of `seq` at position >= n (the rollback
  after a rejected draft); positions < n are untouched.
- Logit rows are numpy views into llama.cpp's buffer: valid until the next decode.
- Prompts of TILED_PREFILL_MIN+ tokens take flash attention's tiled path (`prefill`,
  rule T); a context whose prompts a prefill twin evaluates is a `twin.TwinnedContext`,
  and here `twin` is None.
- Our kernels are the context's `kernels` (kernels/hooks.py), installed before the
  llama.cpp context exists and freed after it.
"""
from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from . import ref_attention, seq_cells, ubatch
from .backend import FreedOnCollect, _llama, kv_type, logit_quantum
from .batch_views import BatchViews
from .kernels import head as own_head
from .kernels.hooks import KernelHooks
from .logit_rows import LogitRows
from .model import Model, ModelError

#: Most tokens of one sequence a batch-invariant generation decode holds: flash
#: attention switches to a tiled kernel at 64 query rows of a stream (docs/exactness.md).
MAX_INVARIANT_BATCH = 63
#: Prompt chunks are evaluated with at least this many rows (padded), so every prompt
#: token takes the tiled attention path whatever the chunking (docs/exactness.md).
TILED_PREFILL_MIN = 64
#: tokens of the decode that checks our output layer against llama.cpp's (kernels/head.py: Hook.verify)
HEAD_CHECK_TOKENS = 5


@dataclass(frozen=True)
class ContextParams:
    """llama.cpp context settings this project uses (see docs/exactness.md).

    batch_invariant (default): every llama_decode gives each token the same
    logits whatever else is in the batch, so verifying a draft in one batch
    reproduces one-token decoding bit for bit. It needs flash attention on, no
    sequence with a single token in a decode (a dummy token pads it), decodes
    under 64 tokens, and one KV stream per sequence (each gets n_ctx / n_seq_max).
    """

    n_ctx: int = 4096
    n_batch: int = 512
    n_seq_max: int = 1
    n_threads: int = 2
    flash_attn: bool | None = True  # None: llama.cpp decides (auto)
    # SWA cache at full size (True) or llama.cpp's window size (False); None: the window
    # where a prefill twin evaluates every long prompt, else full (docs/exactness.md,
    # "The sliding-window cache")
    swa_full: bool | None = None
    batch_invariant: bool = True
    n_ubatch: int | None = None  # None: n_batch
    n_threads_batch: int | None = None  # None: n_threads
    kv_unified: bool | None = None  # honoured only when not batch-invariant
    type_k: str = "f16"  # KV cache types (-ctk/-ctv), llama.cpp's names: KV_TYPES
    type_v: str = "f16"
    # flash attention's reference path in generation decodes (ref_attention.py), so a
    # lone token needs no padding row; batch-invariant contexts only
    reference_attention: bool = True
    # decodes with a logit row take ngramspec's output layer (kernels/head.py),
    # where it is bit-identical to llama.cpp's; batch-invariant contexts only
    own_head: bool = True
    # flash attention computed by ngramspec (kernels/attention.py): a row's values
    # whatever its batch; batch-invariant contexts only
    own_attention: bool = True
    # matmuls of Q5_0 weights computed by ngramspec (kernels/matmul.py), bit-identical to
    # llama.cpp's; batch-invariant contexts only
    own_matmul: bool = True
    # llama.cpp may offload a CPU node to a GPU device for large batches (its op_offload);
    # off where exactness needs every node on the CPU (runtime.device_policy)
    op_offload: bool = True
    # rows of every decode, a slot at a time (llama/fixed_shape.py: exact on a device); 0: none
    fixed_rows: int = 0

    @property
    def ubatch(self) -> int:
        """The ubatch size llama.cpp will use: n_ubatch (n_batch when unset), at most
        n_batch, as llama.cpp clamps it."""
        return min(self.n_ubatch or self.n_batch, self.n_batch)


def _llama_params(lc, params: ContextParams, prompts_in_twin: bool):
    """llama_context_params for `params`, and whether the SWA cache is full-size (None
    in params: the window where a prefill twin evaluates every long prompt, rule W)."""
    cp = lc.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = params.n_ctx, params.n_batch, params.ubatch
    cp.n_seq_max = params.n_seq_max
    cp.n_threads = params.n_threads
    cp.n_threads_batch = params.n_threads_batch or params.n_threads
    cp.flash_attn_type = -1 if params.flash_attn is None else int(params.flash_attn)
    swa_full = params.swa_full
    if swa_full is None:
        swa_full = not (params.batch_invariant and prompts_in_twin)
    cp.swa_full = swa_full
    cp.type_k, cp.type_v = kv_type(params.type_k), kv_type(params.type_v)
    # invariant: one KV stream per sequence, so a sequence's cells never
    # interleave with other slots' (summation order would depend on them)
    per_seq = params.batch_invariant and params.n_seq_max > 1
    free = params.kv_unified is not None and not params.batch_invariant
    cp.kv_unified = params.kv_unified if free else not per_seq
    cp.no_perf = True
    cp.op_offload = params.op_offload
    return cp, swa_full


def fill_batch(bv: BatchViews, entries, pads: dict[int, int], pad_logits: dict[int, int]):
    """Write entries (seq_id, tokens, first position, logits: True every token, False
    the last, None none) and each one's pads (copies of its last token at the next
    positions, the first pad_logits of them with a logit row nobody reads) into the
    llama_batch of `bv` (through its numpy views: a drafted decode's rows in half the time
    of ctypes' per-field writes). Returns (per entry, the batch indices of its logit rows;
    per batch index, whether it has a logit row)."""
    i = 0
    rows: list[list[int]] = []
    out: list[bool] = []
    tok, pos, seq, logits = bv.token, bv.pos, bv.seq, bv.logits
    for seq_id, tokens, pos0, all_logits in entries:
        n, p = len(tokens), pads.get(seq_id, 0)
        if all_logits:
            mine, want = list(range(i, i + n)), [True] * n
        elif all_logits is None:
            mine, want = [], [False] * n
        else:
            mine, want = [i + n - 1], [False] * (n - 1) + [True]
        q = min(pad_logits.get(seq_id, 0), p)
        want += [True] * q + [False] * (p - q)
        last = tokens[n - 1] if n else 0  # the pads' token
        for k, w in enumerate(want):
            tok[i], pos[i], seq[i], logits[i] = tokens[k] if k < n else last, pos0 + k, seq_id, w
            i += 1
        out += want
        rows.append(mine)
    bv.batch.n_tokens = i
    return rows, out


def _fill_head(ctx: "Context", entries, pads: dict[int, int], rows: list[list[int]],
               out: list[bool], argmax_only: bool) -> None:
    """After an armed decode: our output layer's rows (Hook.fill), in llama.cpp's order."""
    lengths = tuple((seq_id, len(t) + pads.get(seq_id, 0)) for seq_id, t, _, _ in entries)
    order = own_head.output_order(lengths, tuple(out), ctx.n_ubatch, ctx.per_seq_streams)
    ctx.head.fill(ctx, order, {j for r in rows for j in r},
                  ctx.views.pos[:len(out)].tolist(), logits=not argmax_only)


def check_chunk(tokens: Sequence[int], limit: int) -> int:
    """The length of a prompt chunk, or ValueError unless it holds 1..limit tokens."""
    n = len(tokens)
    if not 0 < n <= limit:
        raise ValueError(f"a prefill chunk holds 1..{limit} tokens, got {n}")
    return n


class Context(FreedOnCollect):
    """A llama.cpp context: KV cache for up to n_seq_max sequences, batched decode."""

    twin = None  # a TwinnedContext's prefill twin
    prompts_in_twin = False  # True in a TwinnedContext (the SWA cache's size, rule W)
    compute_s = 0.0  #: the last run_rows' llama_decode + llama_synchronize + our output layer's kernel
    fixed_rows = 0  #: every decode's rows per slot in a fixed-shape context (fixed_shape.py)

    def __init__(self, model: Model, params: ContextParams = ContextParams()):
        lc = _llama()
        self.model, self.params = model, params
        cp, swa_full = _llama_params(lc, params, self.prompts_in_twin)
        self.kernels = KernelHooks(lc, model.ptr, params, cp)
        self.head = self.kernels.get("head")  # our output layer's hook, or None (kernels/head.py)
        self.ptr = lc.llama_init_from_model(model.ptr, cp)
        if not self.ptr:
            self.kernels.close()
            raise ModelError(f"llama.cpp could not create a context of {params.n_ctx} tokens "
                             f"for {model.path}; try a smaller -c/--ctx-size")
        self.n_ctx = lc.llama_n_ctx(self.ptr)
        self.n_ctx_seq = lc.llama_n_ctx_seq(self.ptr)  # cells one sequence can use
        self.n_batch = lc.llama_n_batch(self.ptr)  # llama.cpp clamps it to n_ctx
        self.n_ubatch = lc.llama_n_ubatch(self.ptr)
        self.per_seq_streams = not cp.kv_unified
        self.invariant = params.batch_invariant
        self.logit_quantum = logit_quantum()
        # rule U1 pads a lone token only where its kernels differ (ubatch.py); measured on
        # x86-64, where the CPU backend's reference attention (no split-KV path) is set
        x86 = self.invariant and platform.machine().lower() in ("x86_64", "amd64")
        wanted = x86 and params.reference_attention and ref_attention.wanted(
            params.type_k, params.type_v, model.arch)
        self.ref_backend = ref_attention.enable(lc, self.ptr) if wanted else None
        self.lone_ok = x86 and ubatch.lone_token_invariant(params.type_k, params.type_v,
                                                           lambda: model.weight_types,
                                                           self.ref_backend is not None)
        # prompts take flash attention's tiled path (rule T) where a chunk can hold 64 rows
        self.tiled_prefill = self.invariant and min(self.n_batch, self.n_ubatch) >= TILED_PREFILL_MIN
        self.memory = lc.llama_get_memory(self.ptr)
        self.swa_span = seq_cells.swa_span(lc, model.ptr, self.n_ctx_seq, self.n_ubatch, swa_full)
        self.views = BatchViews(lc, params.n_batch, params.n_seq_max)
        self.n_vocab = model.n_vocab
        self.logit_rows = LogitRows(self.n_vocab)
        self._layouts = ubatch.Layouts()  # layout_for's memo
        if self.head is not None and self.n_batch >= HEAD_CHECK_TOKENS and self.head.verify(
                self, [(1000 + 37 * i) % self.n_vocab for i in range(HEAD_CHECK_TOKENS)]):
            self.logit_quantum = 1  # our output layer has no sgemm passes to fill

    @property
    def prefill_chunk(self) -> int:
        """Most tokens of one prompt chunk (`prefill`)."""
        return min(self.n_ubatch, self.n_batch)

    @property
    def cost_layout(self) -> dict:
        """The layout fields of `cost.DecodeCost` (split, padding, logit passes)."""
        return {"per_seq_streams": self.per_seq_streams, "n_ubatch": self.n_ubatch,
                "pad": self.invariant, "logit_quantum": self.logit_quantum,
                "lone_ok": self.lone_ok}

    def close(self) -> None:
        lc = _llama()
        if getattr(self, "views", None) is not None:
            self.views.free()
            self.views = None
        if getattr(self, "ptr", None):
            lc.llama_free(self.ptr)
            self.ptr = None
        if hasattr(self, "kernels"):
            self.kernels.close()  # after the context: its graphs call into them until then

    def decode(self, entries: Sequence[tuple[int, Sequence[int], int, bool]],
               argmax_only: bool = False) -> list[list[int]]:
        """Evaluate several sequences' tokens in ONE llama_decode.

        entries: (seq_id, tokens, first position, all_logits), in ascending seq_id.
        With all_logits the logits of every token are kept, else only the last
        token's. Returns, per entry, the batch indices of its logit rows (for
        `logits_at`/`argmax_at`/samplers). The total must fit in n_batch. `argmax_only`:
        readers likely want only `argmax_at` (our output layer then writes logits only if
        one is read).

        Batch-invariant contexts: where llama.cpp would evaluate a token alone in a
        ubatch and its kernels would differ there (`lone_ok` False: the default F16
        K/V cache), a dummy token is appended to that sequence (at the next position,
        no logits) and removed after the decode (`ubatch.pads_needed`); a decode
        that would still break an invariance rule raises ValueError.
        """
        room = self.n_ctx_seq - (entries[-1][2] + len(entries[-1][1])) if entries else None
        lay = self.layout_for([(s, len(t), len(t) if a else 1) for s, t, _, a in entries], room)
        return self.run_rows(entries, lay.pads, lay.pad_logits, argmax_only)

    def prefill(self, seq_id: int, tokens: Sequence[int], pos0: int,
                last: bool = True) -> tuple["Context", list[int]]:
        """Evaluate prompt tokens of one sequence in a llama_decode of their own, padded
        to TILED_PREFILL_MIN rows, so that flash attention takes its tiled path for
        every one of them (rule T, docs/exactness.md). Returns the context that holds
        the logits and the last token's row in it (`last`: the prompt's last chunk)."""
        n = check_chunk(tokens, self.prefill_chunk)
        with ref_attention.suspended(self.ref_backend):  # rule T needs the tiled path
            return self, self.run_rows([(seq_id, tokens, pos0, False)],
                                       {seq_id: max(0, TILED_PREFILL_MIN - n)})[0]

    def begin_prompt(self, seq_id: int, n_cached: int) -> None:
        """A new prompt for `seq_id` whose first n_cached tokens this context holds."""

    def run_rows(self, entries, pads: dict[int, int],
                 pad_logits: dict[int, int] | None = None,
                 argmax_only: bool = False) -> list[list[int]]:
        """Fill the batch (`fill_batch`), decode, drop the pads. Raises ValueError,
        before writing anything, when they exceed n_batch: the llama_batch holds no
        more rows. Invariant: `argmax_at` and `logits_at` answer for this decode only."""
        total = sum(len(t) + pads.get(seq_id, 0) for seq_id, t, _, _ in entries)
        if total > self.n_batch:
            raise ValueError(f"a decode of {total} tokens exceeds n_batch={self.n_batch}")
        if self.head is not None:
            self.head.forget()
        rows, out = fill_batch(self.views, entries, pads, pad_logits or {})
        armed = self.head is not None and self.head.wants(sum(out))
        if armed:
            self.head.arm()
        if self.swa_span is not None:
            for seq_id, tokens, pos0, _ in entries:
                seq_cells.keep_window_ordered(self, seq_id, pos0 + len(tokens) + pads.get(seq_id, 0))
        lc, t0 = _llama(), time.perf_counter()
        rc = lc.llama_decode(self.ptr, self.views.batch)
        try:
            if rc != 0:
                raise RuntimeError(f"llama_decode failed with code {rc} (batch of {len(out)} tokens)")
            lc.llama_synchronize(self.ptr)  # a device returns before it has finished
            compute = time.perf_counter() - t0
            self.kernels.check()
        except BaseException:
            if armed:
                self.head.disarm()
            raise
        if armed:  # our output layer: the rows' argmaxes, and logits into llama.cpp's buffer
            _fill_head(self, entries, pads, rows, out, argmax_only)
            compute += self.head.kernel_s
        self.compute_s = compute
        for seq_id, tokens, pos0, _ in entries:  # drop the padding tokens' KV entries
            if pads.get(seq_id):
                self.truncate(seq_id, pos0 + len(tokens))
        return rows

    def layout_for(self, entries: Sequence[tuple[int, int, int]],
                   room: int | None = None) -> ubatch.Layout:
        """`ubatch.checked_layout` of a decode of entries (seq_id, n_tokens, n_logits)
        in this context; `room`: cells left in the last entry's stream after its tokens.
        Memoised (`ubatch.Layouts`): the Layout is shared, read it and never change it."""
        return self._layouts.get(entries, self.n_batch, self.n_ubatch, self.per_seq_streams,
                                 self.invariant, self.logit_quantum, room, self.lone_ok)

    def logits_at(self, index: int) -> np.ndarray:
        """Logits of batch index `index` of the last decode (a view; `Hook.materialize`)."""
        if self.head is not None:
            self.head.materialize(self)
        return self.logit_rows.row(self.ptr, index)

    def argmax_at(self, index: int) -> int:
        """numpy's argmax of `logits_at(index)` (our output layer's, where it found it)."""
        tok = self.head.tops.get(index) if self.head is not None else None
        return tok if tok is not None else int(self.logits_at(index).argmax())

    def logits_source(self, index: int) -> tuple:
        """(llama_context, batch index) holding logit row `index` (llama.cpp's samplers)."""
        return self.ptr, index

    def seq_handle(self, seq_id: int) -> tuple:
        """(llama_context, llama.cpp sequence id) of `seq_id`'s cells (slot files)."""
        return self.ptr, seq_id

    def truncate(self, seq_id: int, n: int) -> None:
        """Drop KV entries of `seq_id` at positions >= n."""
        _llama().llama_memory_seq_rm(self.memory, seq_id, n, -1)

    def shift(self, seq_id: int, n_keep: int, n_discard: int, n_past: int) -> None:
        """Context shift: drop positions [n_keep, n_keep + n_discard) of `seq_id` and move
        positions [n_keep + n_discard, n_past) down by n_discard (llama.cpp re-rotates
        their keys at the next decode)."""
        lc = _llama()
        lc.llama_memory_seq_rm(self.memory, seq_id, n_keep, n_keep + n_discard)
        lc.llama_memory_seq_add(self.memory, seq_id, n_keep + n_discard, n_past, -n_discard)

    def positions(self, seq_id: int) -> tuple[int, int]:
        """(lowest, highest) position `seq_id` has in the KV cache; (-1, -1) if none."""
        lc = _llama()
        return (int(lc.llama_memory_seq_pos_min(self.memory, seq_id)),
                int(lc.llama_memory_seq_pos_max(self.memory, seq_id)))

    def clear(self, seq_id: int | None = None) -> None:
        """Empty `seq_id` (None: every sequence)."""
        if seq_id is None:
            _llama().llama_memory_clear(self.memory, True)
        else:
            self.truncate(seq_id, 0)
