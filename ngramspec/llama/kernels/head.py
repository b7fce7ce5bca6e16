"""The output layer of generation decodes, computed by ngramspec, bit-identical to llama.cpp's.

Gemma 3's output layer (262,144 x 640, Q8_0) is over half of a one-token decode.
llama.cpp evaluates several logit rows through llamafile's tinyBLAS, whose passes
over the matrix cost about one column's time each for every two columns on AVX2. Our
kernel (`native/q8_head.c`) reads each weight row once for up to 4 columns and
computes every column in the exact arithmetic order of ggml's `vec_dot_q8_0_q8_0`, so
2 / 4 / 8 logit rows cost ~12 / 16 / 30 ms instead of ~21 / 28 / 42 ms
(docs/benchmarks-history.md, "An output layer of our own").

How a decode uses it (`Context.run_rows`, every decode with a logit row): the context's
eval callback (llama.cpp's public `cb_eval`, a C function in the same library) ends
the graph after `result_norm`, the last node before the output matmul (every KV write
comes earlier), keeping its rows; this module then finds each wanted row's argmax
and writes its logits into llama.cpp's own logits buffer (`llama_get_logits_ith`), so
samplers and `logits_at` read them as if llama.cpp had computed them. A decode whose
samplers only take the argmax (`Context.decode(argmax_only=True)`) writes no logits:
they are computed only if some reader asks for them before the next decode
(`materialize`), so a greedy verify step neither writes a megabyte a row nor pays
llama.cpp's reordering of its output rows (`llama_get_logits_ith` swaps whole rows
into batch order the first time it is called after a multi-sequence decode).

Invariants:
- used only where a start-up check (`Hook.verify`) found our rows bit-identical to
  llama.cpp's on this CPU, model and build; otherwise every decode is llama.cpp's;
- used only when the output matmul over `result_norm` is the graph's
  `result_output` (no logit soft-capping after it) and its weight is a plain Q8_0
  matrix;
- a one-row decode takes ours, or llama.cpp's where start-up timing found it faster and
  its one-row logits bit-identical to ours (`Hook.choose_one_row`): the same values;
- an argmax is numpy's argmax of the same row's logits (the first greatest value, or
  the first NaN), checked at start-up with the logits (`verify`);
- rows are matched to batch indices in llama.cpp's output order: ubatch by ubatch
  (`ubatch.split`), within a ubatch sequence by sequence, as `llama_batch_allocr`
  orders them; the callback records each row's position (the ubatch's `inp_pos` at the
  row's `out_ids` entry) and `fill` raises unless every row has the position of the
  batch index it is matched to, so a changed order never reaches a logit.
Set NGRAMSPEC_OWN_HEAD=0 to turn it off.
"""
from __future__ import annotations

import ctypes as C
import functools
import time
from typing import Sequence

import numpy as np

from .. import ubatch
from . import ggml
from .kernel import HookArgs, Kernel

QK8_0 = 32
ONE_ROW_REPS = 3  # timed one-row decodes each way at start-up (`Hook.choose_one_row`)


class _Hook(C.Structure):
    """native/q8_head.c's hook_t, field by field."""
    _fields_ = [("name_off", C.c_int64), ("data_off", C.c_int64), ("ne_off", C.c_int64),
                ("op_off", C.c_int64), ("src_off", C.c_int64),
                ("op_mul_mat", C.c_int32), ("stop", C.c_int32),
                ("rows", C.c_void_p), ("cap", C.c_int64), ("n_rows", C.c_int64),
                ("overflow", C.c_int32), ("norm", C.c_void_p), ("head", C.c_void_p),
                ("head_is_output", C.c_int32), ("row_pos", C.c_void_p), ("ub_pos", C.c_void_p),
                ("ub_out", C.c_void_p), ("pos_cap", C.c_int64), ("n_ub_pos", C.c_int64),
                ("n_ub_out", C.c_int64)]


class Hook:
    """A context's eval callback and the output layer it hands rows to.

    `create` gives one where the kernel and llama.cpp's libraries can be had;
    `install(params)` puts the C callback into llama_context_params before the context
    is created; `verify(ctx)` (once, on an empty context) finds the output weight and
    checks our rows against llama.cpp's; `active` says whether decodes use it."""

    @classmethod
    def create(cls, lib: C.CDLL, args: HookArgs) -> "Hook":
        return cls(lib, args.n_embd, args.n_batch, args.n_threads)

    def __init__(self, lib: C.CDLL, n_embd: int, max_rows: int, n_threads: int):
        self.from_float = ggml.from_float(ggml.GGML_TYPE_Q8_0)
        off = ggml.tensor_offsets()
        self.lib, self.n_embd, self.n_threads = lib, n_embd, n_threads
        self.rows = np.zeros((max_rows, n_embd), np.float32)
        # row_pos, ub_pos, ub_out: a ubatch holds at most n_batch tokens
        self.pos = np.zeros((3, max_rows), np.int32)
        self.hook = _Hook(name_off=off["name"], data_off=off["data"], ne_off=off["ne"],
                          op_off=off["op"], src_off=off["src"], op_mul_mat=ggml.op_code("MUL_MAT"),
                          rows=self.rows.ctypes.data, cap=self.rows.size,
                          row_pos=self.pos[0].ctypes.data, ub_pos=self.pos[1].ctypes.data,
                          ub_out=self.pos[2].ctypes.data, pos_cap=max_rows, n_ub_pos=-1,
                          n_ub_out=-1)
        self.cb = C.cast(lib.ngs_eval_cb, C.c_void_p).value
        self.argmax = np.zeros(max_rows, np.int64)
        self._idx = np.zeros(max_rows, np.int32)  # _compute's arguments, made once
        self._ptrs = np.zeros(max_rows, np.uintp)
        self._addr = (self.rows.ctypes.data, self._idx.ctypes.data, self._ptrs.ctypes.data,
                      self.argmax.ctypes.data)
        self.weight: tuple[int, int] | None = None  # (data pointer, rows)
        self.active = self._checking = False
        self.one_row = True  # one-row decodes take ours too (`choose_one_row`)
        self.one_row_ms: tuple[float, float] | None = None  # (ours, llama.cpp's) one-row decode
        self.one_row_same = False  # llama.cpp's one-row logits are ours bit for bit
        self.one_row_folded = False  # re-timed against folded steps (engine/fold.py)
        self._lazy: tuple[list[int], list[int]] | None = None  # rows, batch indices
        self.tops: dict[int, int] = {}  # the last armed decode's argmax by batch index
        self.kernel_s = 0.0  # seconds in the kernel since the last decode began (`forget`)

    def install(self, cparams) -> None:
        import llama_cpp

        cparams.cb_eval = C.cast(self.cb, llama_cpp.ggml_backend_sched_eval_callback)
        cparams.cb_eval_user_data = C.cast(C.pointer(self.hook), C.c_void_p)

    def _find_weight(self) -> tuple[int, int] | None:
        """The output layer's weight as (data, rows) if it is a plain contiguous Q8_0
        matrix multiplied into `result_output` itself, else None."""
        off, h = ggml.tensor_offsets(), self.hook
        if not h.head or not h.head_is_output:
            return None
        t = h.head
        if C.c_int.from_address(t + off["type"]).value != ggml.GGML_TYPE_Q8_0:
            return None
        ne0, ne1 = (C.c_int64.from_address(t + off["ne"] + 8 * i).value for i in (0, 1))
        nb1 = C.c_size_t.from_address(t + off["nb"] + 8).value
        data = C.c_void_p.from_address(t + off["data"]).value
        if ne0 != self.n_embd or ne0 % QK8_0 or nb1 != ne0 // QK8_0 * 34 or not data:
            return None
        return data, ne1

    def wants(self, n_logits: int) -> bool:
        """Whether a decode with n_logits logit rows takes our output layer: any with a
        logit row, once verified (or being verified). One row too where that is faster
        on this CPU (`choose_one_row`): our kernel reads the matrix once as llama.cpp's
        vec_dot does, and the argmax comes with it (no logits written, no scan of the row
        by numpy; docs/benchmarks.md)."""
        return (self.active or self._checking) and n_logits >= (1 if self.one_row else 2)

    def arm(self) -> None:
        """Before a decode that takes our layer: end its graph at result_norm, keeping the
        rows. Invariant: only such a decode runs armed (`fill` or `disarm` ends it)."""
        self.hook.stop, self.hook.n_rows, self.hook.overflow = 1, 0, 0

    def disarm(self) -> None:
        self.hook.stop = 0

    def fill(self, ctx, order: Sequence[int], wanted: set[int], positions: Sequence[int],
             logits: bool = True) -> None:
        """After an armed decode: `tops` = {batch index: argmax} of the batch indices in
        `wanted`, and (with `logits`, else on `materialize`) their logits, written into
        llama.cpp's buffer. `order`: the batch index of each result_norm row, in the order llama.cpp
        evaluated them; `positions`: each batch index's position. Raises RuntimeError
        unless llama.cpp's rows are as many and each has the position of the batch index
        `order` gives it. During `verify`'s decode only the rows are kept (verify
        computes them into buffers of its own)."""
        h = self.hook
        self.forget()
        self.disarm()
        if h.overflow or h.n_rows != len(order):
            raise RuntimeError(f"the output layer got {h.n_rows} rows for {len(order)} "
                               f"logit rows (overflow={h.overflow})")
        got, want = self.pos[0, :h.n_rows].tolist(), [positions[i] for i in order]
        if got != want:
            bad = next(k for k, (a, b) in enumerate(zip(got, want)) if a != b)
            raise RuntimeError(f"the output layer's row {bad} is at position {got[bad]}, "
                               f"batch index {order[bad]} at {want[bad]}: llama.cpp's row "
                               f"order is not the one assumed")
        which = [j for j, i in enumerate(order) if i in wanted]
        if not which or self._checking:
            return
        batch = [order[j] for j in which]
        if logits:
            self._compute(which, self._buffers(ctx, batch), argmax=True)
        else:
            self._compute(which, None, argmax=True)
            self._lazy = (which, batch)
        self.tops = dict(zip(batch, self.argmax[:len(which)].tolist()))

    def materialize(self, ctx) -> None:
        """The logits `fill` left unwritten (logits=False), written now: called before
        anything reads llama.cpp's logits buffer, and before the next decode only (the
        kept rows are the last decode's)."""
        if self._lazy is not None:
            which, batch = self._lazy
            self._lazy = None
            self._compute(which, self._buffers(ctx, batch))

    def kept(self, n: int) -> None:
        """After a folded run through this layer (engine/fold.py) of n rows, row j for batch
        index j: its logits, unwritten, are computed if anything reads them (`materialize`)."""
        self._lazy, self.tops = (list(range(n)), list(range(n))), {}

    def forget(self) -> None:
        """A new decode begins: the last one's argmaxes and unwritten logits are gone."""
        self._lazy, self.tops, self.kernel_s = None, {}, 0.0

    @staticmethod
    def _buffers(ctx, batch: Sequence[int]) -> list[int]:
        import llama_cpp

        return [C.cast(llama_cpp.llama_get_logits_ith(ctx.ptr, i), C.c_void_p).value
                for i in batch]

    def _compute(self, which: Sequence[int], out: Sequence[int] | None,
                 argmax: bool = False) -> None:
        """Logits of the kept result_norm rows `which` into the float buffers at the
        addresses `out` (None: not kept); with `argmax`, each row's argmax into
        self.argmax[:len(which)]. Allocates nothing: its arguments go through buffers
        made once (`_idx`, `_ptrs`)."""
        w, n_vocab = self.weight
        rows, idx, ptrs, best = self._addr
        k = len(which)
        self._idx[:k] = which
        self._ptrs[:k] = 0 if out is None else out
        t0 = time.perf_counter()
        rc = self.lib.ngs_q8_0_head(w, n_vocab, self.n_embd, rows, self.n_embd, idx, k, ptrs,
                                    self.n_threads, self.from_float, best if argmax else None)
        self.kernel_s += time.perf_counter() - t0
        if rc != 0:
            raise MemoryError("the output layer could not allocate its quantized columns")

    def verify(self, ctx, tokens: Sequence[int]) -> bool:
        """On an empty context: decode `tokens` (5 or more, all logits) in sequence 0 with
        llama.cpp's output layer, then again ended at result_norm, and turn ours on if
        the weight qualifies and our logits of the kept rows, computed into fresh
        buffers, are bit-identical to llama.cpp's. Leaves sequence 0 empty."""
        rows = ctx.run_rows([(0, tokens, 0, True)], {})[0]
        theirs = np.stack([ctx.logits_at(i).copy() for i in rows])
        ctx.truncate(0, 0)
        self.weight = self._find_weight()
        if self.weight is None:
            return False
        self._checking = True
        try:
            ctx.run_rows([(0, tokens, 0, True)], {})
        except RuntimeError:  # `fill` found other rows or positions than asked: never used
            return False
        finally:
            self._checking = False
            ctx.truncate(0, 0)
        ours = np.full_like(theirs, np.nan)
        self._compute(range(len(tokens)), [r.ctypes.data for r in ours], argmax=True)
        self.active = bool(np.array_equal(ours.view(np.uint32), theirs.view(np.uint32)) and
                           np.array_equal(self.argmax[:len(tokens)], np.argmax(theirs, axis=1)))
        if self.active:
            self.choose_one_row(ctx, tokens[0])
        return self.active

    def choose_one_row(self, ctx, token: int) -> None:
        """Whether one-row decodes (spec-off's step) take ours or llama.cpp's output layer:
        llama.cpp's where its one-row logits (its vec_dot, not the sgemm `verify`
        compared) are bit-identical to ours, so that every row gets the same values
        either way, and its decode with numpy's argmax is faster here (ONE_ROW_REPS
        decodes each way, alternating, on an empty context; medians). Leaves sequence
        0 empty."""
        got, times = {}, {True: [], False: []}
        for rep in range(ONE_ROW_REPS + 1):
            for mine in (True, False):
                self.one_row = mine
                t0 = time.perf_counter()
                row = ctx.run_rows([(0, [token], 0, True)], {}, argmax_only=rep > 0)[0][0]
                top = ctx.argmax_at(row)
                times[mine].append(time.perf_counter() - t0)
                if rep == 0:
                    got[mine] = (ctx.logits_at(row).copy(), top)
                ctx.truncate(0, 0)
        same = (np.array_equal(got[True][0].view(np.uint32), got[False][0].view(np.uint32))
                and got[True][1] == got[False][1])
        ours, theirs = (float(np.median(times[m][1:])) * 1e3 for m in (True, False))
        self.one_row_ms = (ours, theirs)
        self.one_row_same = same
        self.one_row = not same or ours <= theirs  # not in the cost key (cost._kernel_key)


@functools.lru_cache(maxsize=4096)
def output_order(lengths: tuple[tuple[int, int], ...], logits: tuple[bool, ...], n_ubatch: int,
                 per_seq_streams: bool) -> tuple[int, ...]:
    """The batch indices of the rows with logits, in the order llama.cpp evaluates them:
    ubatch after ubatch (`ubatch.split` of the batch's (seq_id, tokens) entries, laid out
    entry after entry), within a ubatch entry by entry, each entry's tokens in order.
    Memoised (a step's decode usually repeats an earlier one's shape): pass tuples."""
    start, cursor = {}, {}
    at = 0
    for seq_id, n in lengths:
        start[seq_id], cursor[seq_id] = at, 0
        at += n
    order = []
    for ub in ubatch.split(lengths, n_ubatch, per_seq_streams):
        for seq_id, n in ub.take:
            first = start[seq_id] + cursor[seq_id]
            order.extend(i for i in range(first, first + n) if logits[i])
            cursor[seq_id] += n
    return tuple(order)


#: checked on each context's own output weight (`Hook.verify`), not once per process
KERNEL = Kernel(
    name="head", source="q8_head", env="NGRAMSPEC_OWN_HEAD", hook_struct=_Hook,
    functions={"ngs_q8_0_head": (C.c_int, [C.c_void_p, C.c_int64, C.c_int64, C.c_void_p,
                                           C.c_int64, C.c_void_p, C.c_int, C.c_void_p, C.c_int,
                                           C.c_void_p, C.c_void_p])},
    create=Hook.create, node_kernel=False, variants=("avx512vnni", "avx2"))
