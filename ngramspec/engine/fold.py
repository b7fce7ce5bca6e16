"""Plain greedy steps folded into one C call (llama/kernels/native/fold.c `ngs_fold_steps`).

A generation step made from Python costs ~75-115 us of host time on 2 cores (the layout,
the batch, the checks, the output, on caches each decode has cooled), more than a whole
decode of a small model on a GPU. Where every generating sequence of a step samples
greedily and the step's plan proposed nothing it verifies (spec-off; a resting auto
sequence; any sequence whose drafters found nothing), the steps after it hold nothing
Python must decide until a drafter finds a draft: one row per sequence, its argmax, the
token appended. `Fold.run` makes up to MAX_STEPS of them (MAX_MS of wall time at most)
in one C call, asking each sequence's drafters before every step as that step's plan
would (every drafter, or a resting sequence's watcher alone: `_schedule`), and then
replays in Python what each step would have recorded: the policy's `observe_decode` per
decode (the cost curve, the Rest's counters), the drafters' counts, the history and the
output (`Engine._emit`).

Invariants:
- The emitted tokens, the KV cache, the history and every drafter's state are those of
  the same steps made one `Engine.step` at a time (tests/test_fold.py): the rows are the
  ones `Context.decode` writes, the argmax numpy's, a look the chain's own C call
  (`ngs_propose`); a look that finds a draft (or needs Python) ends the run before that
  step, which `Engine.step` then makes, resuming that look (`NativeChain.preset`: no
  drafter is asked twice for one step).
- A run starts only after the step's own plan verified nothing, and never spans an
  end-of-generation token, n_predict, a context shift, a sliding-window cache's re-import
  (seq_cells.keep_window_ordered: positions stay within the window after the sequence's
  lowest cell) or a layout that needs padding rows. A decode our output layer would take
  (`Hook.wants`) takes it in the run too: armed, its kept rows checked as `Hook.fill`
  checks them (one per sequence, each at its sequence's position; else the run fails
  there), its kernel's argmax; only where llama.cpp's rows come in batch order
  (`_rows_in_order`), else no run. A Rest's schedule is read off a copy of it
  stepped through the run (`_schedule`): the steps' decisions are the Rest's own, up to
  the copy's estimates of a decode's and a look's time.
- `StepOutput.decodes` says how many decodes a folded output covers (counters of
  decodes: the server's metrics, batch's speed).
"""
from __future__ import annotations

import ctypes as C
import os
import time
from typing import Sequence

import numpy as np

from ..llama.backend import _llama
from ..llama.context import Context
from ..llama.kernels import build
from ..llama.kernels.head import output_order
from ..speculative import native
from ..speculative.cost import MAX_DRAFT, Shape
from ..speculative.drafters import seq_row as R

MAX_STEPS = 64  # steps of one run
#: steps of one run for a sequence whose text has stop strings (Request.stop): the run cannot
#: see them, so it may go past one by up to this many steps less one (the caller drops them)
STOP_STEPS = 4
MAX_MS = 50.0  # a run's wall time, at most (a server's new request waits for it)
ENV = "NGRAMSPEC_FOLD"  # 0: every step from Python
_P = C.c_void_p


class _Run(C.Structure):
    _fields_ = [("ctx", _P), ("decode", _P), ("sync", _P), ("row", _P), ("batch", _P),
                ("eog", _P), ("propose", _P), ("table", _P), ("resets", C.c_int64),
                ("max_ns", C.c_int64), ("shift", C.c_int32), ("n_vocab", C.c_int32),
                ("n_seqs", C.c_int32), ("max_steps", C.c_int32), ("n_steps", C.c_int32),
                ("why", C.c_int32), ("rc", C.c_int32), ("pad_", C.c_int32),
                ("head", _P), ("head_w", _P), ("head_rows", _P), ("head_idx", _P),
                ("head_out", _P), ("head_ff", _P), ("head_best", _P), ("hook_stop", _P),
                ("hook_n_rows", _P), ("hook_overflow", _P), ("row_pos", _P),
                ("head_vocab", C.c_int64), ("head_embd", C.c_int64),
                ("head_threads", C.c_int32), ("pad2_", C.c_int32)]


class _Seq(C.Structure):
    _fields_ = [("tokens", _P), ("emitted", _P), ("look", _P), ("look_ns", _P), ("params", _P),
                ("states", _P), ("out", _P), ("lens", _P), ("starts", _P), ("filled", _P),
                ("n_hist", C.c_int64), ("seq_id", C.c_int32), ("sampled", C.c_int32),
                ("room", C.c_int32), ("max_draft", C.c_int32), ("min_len", C.c_int32),
                ("w", C.c_int32), ("n_d", C.c_int32), ("first_only", C.c_int32),
                ("out_stride", C.c_int32), ("n_watch", C.c_int32), ("n_all", C.c_int32),
                ("resume", C.c_int32)]


WHY = ("steps", "eog", "time", "look", "failed")  # fold.c's NGS_FOLD_*
FAILED = {-1: "llama.cpp handed out no logit row",  # fold.c's ngs_fold_decode's own codes
          -2: "the output layer's rows are not one per sequence at its position",
          -3: "the output layer could not allocate its quantized columns"}
NONE, WATCH, ALL = range(3)  # a step's look (fold.c NGS_LOOK_*)


def library() -> C.CDLL | None:
    """fold.c compiled (plain C, any CPU), or None (no compiler, NGRAMSPEC_FOLD=0)."""
    if os.environ.get(ENV, "1") == "0":
        return None
    lib = build.library(build.FOLD, build.GENERIC).lib
    if lib is None:
        return None
    lib.ngs_fold_steps.restype, lib.ngs_fold_steps.argtypes = C.c_int, (_P, _P, _P)
    lib.ngs_fold_argmax.restype, lib.ngs_fold_argmax.argtypes = C.c_int32, (_P, C.c_int32)
    return lib if layout(lib) == mirrored() else None


def layout(lib) -> list[int]:
    """fold.c's struct sizes and last fields' offsets (`ngs_fold_layout`)."""
    out = np.zeros(5, np.int64)
    lib.ngs_fold_layout.restype, lib.ngs_fold_layout.argtypes = None, (_P,)
    lib.ngs_fold_layout(out.ctypes.data)
    return out.tolist()


def mirrored() -> list[int]:
    """The same, of fold.py's ctypes mirrors."""
    return [C.sizeof(_Run), _Run.head_threads.offset, C.sizeof(_Seq), _Seq.n_hist.offset,
            _Seq.resume.offset]


def _address(fn) -> int:
    return C.cast(fn, C.c_void_p).value


def batch_matches(lc) -> bool:
    """Whether llama_cpp's llama_batch has the fields fold.c's ngs_batch reads, at the
    same offsets (a llama-cpp-python of another layout: no folding)."""
    want = ("n_tokens", "token", "embd", "pos", "n_seq_id", "seq_id", "logits")
    fields = [f[0] for f in lc.llama_batch._fields_]
    if fields[:len(want)] != list(want):
        return False
    ptr = C.sizeof(C.c_void_p)
    return [getattr(lc.llama_batch, f).offset for f in want] == [0] + [ptr * i for i in range(1, 7)]


class Fold:
    """One engine's folded runs (`Engine.fold`): the C call's structures and buffers, made
    once and reused (a run allocates nothing it can keep)."""

    def __init__(self, lib: C.CDLL, ctx: Context, model):
        lc, n = _llama(), ctx.params.n_seq_max
        self.lib, self.ctx, self.model = lib, ctx, model
        self.run_ = _Run(ctx=ctx.ptr, decode=_address(lc.llama_decode),
                         sync=_address(lc.llama_synchronize),
                         row=_address(lc.llama_get_logits_ith),
                         batch=C.addressof(ctx.views.batch), n_vocab=model.n_vocab,
                         max_ns=int(MAX_MS * 1e6))
        drafting = native.kernel()
        self.run_.propose = _address(drafting.ngs_propose) if drafting is not None else None
        self.seqs = (_Seq * n)()
        self.emitted = np.zeros((n, MAX_STEPS), np.int32)
        self.look = np.zeros((n, MAX_STEPS), np.uint8)
        self.look_ns = np.zeros((n, MAX_STEPS), np.int64)
        self.compute = np.zeros(MAX_STEPS, np.int64)
        for j in range(n):
            q = self.seqs[j]
            q.emitted, q.look_ns = self.emitted[j].ctypes.data, self.look_ns[j].ctypes.data
        self._look_at = [self.look[j].ctypes.data for j in range(n)]
        self._args = (C.addressof(self.run_), C.addressof(self.seqs), self.compute.ctypes.data)
        self._eog = np.ascontiguousarray(model._eog, dtype=np.uint8)  # 1: ends generation
        self.run_.eog = self._eog.ctypes.data
        self._tokens_at: dict[int, tuple[np.ndarray, int]] = {}  # seq id: (buffer, address)
        self._head_fn = self._wire_head(ctx.head)  # our output layer's kernel, or None
        self.look_s = 10e-6  # a look's seconds, as a Rest's copy prices it (`_schedule`)
        self.horizon = MAX_STEPS  # steps a run may make: twice the last run's, 8 to MAX_STEPS
        self.n_runs = 0
        self.n_folded = 0  # steps made in runs

    def _wire_head(self, head) -> int | None:
        """Our output layer's kernel and the hook's fields for fold.c (their addresses, taken
        once), or None without a verified layer (every run then reads llama.cpp's rows)."""
        if head is None or head.weight is None:
            return None
        r, hook, base = self.run_, head.hook, C.addressof(head.hook)
        n = len(self.seqs)
        self._rows_of = np.arange(n, dtype=np.int32)  # row j is sequence j's (`_rows_in_order`)
        self._no_logits = np.zeros(n, np.uintp)  # no row's logits written
        self._argmax = np.zeros(n, np.int64)
        r.head_w, r.head_vocab = head.weight
        r.head_rows, r.head_idx = head.rows.ctypes.data, self._rows_of.ctypes.data
        r.head_out, r.head_best = self._no_logits.ctypes.data, self._argmax.ctypes.data
        r.head_ff, r.head_embd, r.head_threads = head.from_float, head.n_embd, head.n_threads
        r.hook_stop, r.hook_n_rows = base + type(hook).stop.offset, base + type(hook).n_rows.offset
        r.hook_overflow, r.row_pos = base + type(hook).overflow.offset, hook.row_pos
        return _address(head.lib.ngs_q8_0_head)

    def _arm(self, n: int) -> bool:
        """Whether a run of n sequences takes our output layer (as Context.run_rows would:
        `Hook.wants`); fold.c's kernel pointer set accordingly."""
        head = self.ctx.head
        mine = head is not None and self._head_fn is not None and head.wants(n)
        self.run_.head = self._head_fn if mine else None
        return mine

    @classmethod
    def of(cls, ctx: Context, model, draft_drafter=None) -> "Fold | None":
        """A Fold for `ctx`, or None where its decodes are not Context's plain ones (a
        fixed-shape context, a draft model to keep in step) or fold.c is not at hand."""
        if (draft_drafter is not None or ctx.fixed_rows or type(ctx).decode is not Context.decode
                or type(ctx).run_rows is not Context.run_rows):
            return None
        lib = library()
        if lib is None or not batch_matches(_llama()):
            return None
        fold = cls(lib, ctx, model)
        head = ctx.head
        if head is not None and head.one_row_same and not head.one_row_folded:
            fold._claim_one_row(head)
        return fold

    def _claim_one_row(self, head, steps: int = 6, reps: int = 2) -> None:
        """Where llama.cpp's one-row logits are our output layer's bit for bit (start-up
        chose between the two through the engine's path: decode, then argmax), time
        `steps` one-row steps each way again as folded runs, ours and llama.cpp's,
        alternating `reps` times on sequence 0 (emptied before and after; an engine starts
        with no slot cache): one-row decodes go to the faster (medians). head.one_row_ms
        then holds these timings. Once per context."""
        ctx, times = self.ctx, {True: [], False: []}
        scratch = np.zeros(steps + 1, np.int32)
        token = int(self.model.n_vocab // 3)
        for _ in range(reps):
            for mine in (True, False):
                ctx.truncate(0, 0)
                head.one_row = mine
                t0 = time.perf_counter()
                made = self._scratch_run(scratch, token, steps)
                times[mine].append((time.perf_counter() - t0) / max(made, 1) * 1e3)
        ctx.truncate(0, 0)
        head.forget()
        ours, theirs = (float(np.median(times[m])) for m in (True, False))
        head.one_row_ms, head.one_row, head.one_row_folded = (ours, theirs), ours <= theirs, True

    def _scratch_run(self, scratch: np.ndarray, token: int, steps: int) -> int:
        """A folded run of up to `steps` steps of sequence 0 from position 0
        (`_claim_one_row`), through our output layer where it takes one row; the steps
        it made."""
        r, q = self.run_, self.seqs[0]
        r.n_seqs, r.max_steps = 1, steps
        self._arm(1)
        q.tokens, q.n_hist, q.seq_id, q.sampled, q.look = scratch.ctypes.data, 0, 0, token, None
        return self.lib.ngs_fold_steps(*self._args)

    def steps(self, engine, active: Sequence) -> int:
        """How many steps a run may make for the generating sequences `active` (ascending
        ids) whose plan for this step proposed nothing; 0: none (module docstring)."""
        ctx = self.ctx
        if ctx.head is not None and ctx.head.wants(len(active)) and (
                self._head_fn is None or not self._rows_in_order(active)):
            return 0
        steps = self.horizon
        for st in active:
            if not st.sampler.argmax_only:
                return 0
            steps = min(steps, st.n_predict - st.n_generated, st.fold_steps or MAX_STEPS)
            if st.n_keep is not None:  # no step of the run may need a context shift
                steps = min(steps, ctx.n_ctx_seq - st.n_hist - 1)
            if ctx.swa_span is not None:  # nor a re-import of its window (keep_window_ordered)
                lo = ctx.positions(st.seq_id)[0]
                steps = steps if lo < 0 else min(steps, ctx.swa_span + lo - st.n_hist)
        if steps < 2:
            return 0
        last = active[-1]
        lay = ctx.layout_for([(st.seq_id, 1, 1) for st in active],
                             ctx.n_ctx_seq - last.n_hist - 1)
        if lay.pads:
            return 0
        decode_s = ctx.compute_s / len(active)
        for j, st in enumerate(active):
            steps = min(steps, self._schedule(engine, st, j, steps, decode_s, len(active) > 1))
            if steps < 2:
                return 0
        return steps

    def _rows_in_order(self, active: Sequence) -> bool:
        """Whether llama.cpp's output rows of a step of `active` (one token each) come in
        batch order (head.output_order), as fold.c gives row j to sequence j."""
        n, ctx = len(active), self.ctx
        order = output_order(tuple((st.seq_id, 1) for st in active), (True,) * n,
                             ctx.n_ubatch, ctx.per_seq_streams)
        return order == tuple(range(n))

    def _schedule(self, engine, st, j: int, steps: int, decode_s: float, crowded: bool) -> int:
        """Sequence `st`'s row j of the run: what each step's plan asks (`Speculation.plan`:
        every drafter where its policy has no Rest or its Rest is active, the chain's
        watcher where it rests and watches, else nothing), read off a copy of its Rest
        stepped through the run's decodes (each priced at `decode_s`, crowded where the run
        has several sequences, each look at the mean look so far); and the steps it allows
        (fewer where a look needs Python)."""
        q, sp = self.seqs[j], st.speculation
        q.look = None
        if sp is None:
            return steps
        if sp.own:
            return 0
        chain, look = sp.chain, self.look[j]
        rest = engine.policy.rest_of(st.seq_id)
        codes = [NONE] + [ALL] * (steps - 1)
        if rest is not None:
            sim = rest.clone()
            watch = WATCH if chain._watch is not None else NONE  # no watcher: it asks nothing
            for s in range(1, steps):
                sim.decode(0.0, decode_s, 1, False, crowded)
                codes[s] = ALL if sim.active else watch if sim.watching else NONE
                if sim.active:
                    sim.spent(self.look_s)
        look[:steps] = codes
        first = next((s for s, c in enumerate(codes) if c != NONE), None)
        if first is None:
            return steps
        nat = chain._native.get(st.seq_id)
        kinds = None if nat is None else nat.params[:, R.KIND]
        if nat is None or self.run_.propose is None or (kinds == R.PY).any():
            return first  # its first look needs Python
        q.look = self._look_at[j]
        q.params, q.states, q.out, q.lens, q.starts, q.filled = (a.value for a in nat._args)
        q.out_stride, q.w, q.n_d = nat.stride, chain._watch or 0, len(kinds)
        q.first_only = not getattr(engine.policy, "compare_all", False)
        q.room = engine._room(st)
        capped = rest is not None  # the cost policy caps a draft at MAX_DRAFT (CostPolicy.options)
        q.max_draft = min(MAX_DRAFT, chain._cap) if capped else min(chain._cap, 1 << 30)
        q.min_len = chain._min
        return steps

    def _tokens_address(self, st) -> int:
        """The address of st's history buffer (taken once per buffer: `.ctypes.data`
        costs ~15 us right after a decode)."""
        got = self._tokens_at.get(st.seq_id)
        if got is None or got[0] is not st.tokens:
            got = self._tokens_at[st.seq_id] = (st.tokens, st.tokens.ctypes.data)
        return got[1]

    def run(self, engine, active: Sequence, steps: int, observed: bool) -> tuple[int, dict]:
        """Make the run (`steps` from `steps()`), then replay what its steps recorded
        (`_replay`) and settle each sequence (`_settle`). A decode that fails before any
        step was made raises as Context.run_rows does; after some, the run ends there
        (the next step meets it). Returns (the steps made, {id(state): emitted tokens
        kept}); each state's finish_reason is set as Engine._emit sets it."""
        r, ctx, pool = self.run_, self.ctx, engine.pool
        r.table, r.shift, r.resets = pool._ptr, pool._shift, pool.resets
        r.n_seqs, r.max_steps = len(active), steps
        hist0 = [st.n_hist for st in active]
        for j, st in enumerate(active):
            q = self.seqs[j]
            q.tokens, q.n_hist, q.seq_id, q.sampled = (self._tokens_address(st), st.n_hist,
                                                       st.seq_id, st.sampled)
            q.n_watch = q.n_all = 0
        if ctx.head is not None:
            ctx.head.forget()
        mine = self._arm(len(active))
        k = self.lib.ngs_fold_steps(*self._args)
        ctx.kernels.check()
        if WHY[r.why] == "failed":  # a decode with no rows to read may have written its cells
            for j, st in enumerate(active):
                ctx.truncate(st.seq_id, self.seqs[j].n_hist)
        if k == 0 and WHY[r.why] == "failed":
            raise RuntimeError(FAILED.get(r.rc, f"llama_decode failed with code {r.rc}")
                               + f" (batch of {len(active)} tokens)")
        if mine and k:  # the last decode's logits: computed if anything reads them (materialize)
            ctx.head.kept(len(active))
        seconds = (self.compute[:k] * 1e-9).tolist()
        ctx.compute_s = sum(seconds)
        self.n_runs += 1
        self.n_folded += k
        self.horizon = min(MAX_STEPS, max(8, 2 * k))  # what a Rest's copy is stepped through
        looks = self.look_ns[:len(active), 1:k]
        n_looks = np.count_nonzero(looks)
        if n_looks:  # a look's mean, for the next run's schedule
            self.look_s += 0.1 * (float(looks.sum()) * 1e-9 / n_looks - self.look_s)
        toks = [self.emitted[j, :k].tolist() for j in range(len(active))]
        self._replay(engine, active, hist0, seconds, toks, observed)
        stopped = WHY[r.why] == "look"
        return k, {id(st): self._settle(engine, st, j, k, toks[j], stopped)
                   for j, st in enumerate(active)}

    def _replay(self, engine, active, hist0: list[int], seconds: list[float], toks, observed):
        """What each step of the run records, in a step's order: a look of every drafter
        timed as the policy's own host time (CostPolicy.options is), the decode observed
        (`observed`: as Engine._timed_decode would), the first step's proposals (it had
        some where the planner declined them all) scored on its token."""
        policy = engine.policy
        k, n = len(seconds), len(active)
        looked = (np.where(self.look[:n, :k] == ALL, self.look_ns[:n, :k], 0) * 1e-9).tolist()
        rests = [policy.rest_of(st.seq_id) for st in active]
        for s, sec in enumerate(seconds):
            for rest, spent in zip(rests, looked):
                if rest is not None and spent[s]:
                    rest.spent(spent[s])
            if observed:
                policy.observe_decode(
                    [Shape(st.seq_id, 1, 1, h + s) for st, h in zip(active, hist0)], sec)
            if s == 0:
                for st, t in zip(active, toks):
                    if st.speculation is not None:
                        st.speculation.settle(t[:1], 0)

    def _settle(self, engine, st, j: int, k: int, tokens: list[int], stopped: bool) -> list[int]:
        """Sequence `st` (row j) after a run of k steps: its history, steps, its drafters'
        counts (a look that found nothing is a call of each drafter it asked), the look
        that ended the run (`stopped`) handed to the next ask (NativeChain.preset), its
        output (`_emit`)."""
        q = self.seqs[j]
        st.n_hist, st.sampled = q.n_hist, q.sampled
        st.steps += k
        sp = st.speculation
        if sp is not None:
            if sp.shadows:  # the run's later tokens (its first was settled: `_replay`)
                sp.shadows.follow(tokens[1:])
            chain = sp.chain
            nat = chain._native.get(st.seq_id)
            looked = self.look_ns[j, 1:k].sum() / 1e3
            calls = q.n_watch + q.n_all * len(chain.drafters)
            for i, stats in enumerate(chain._stats_of):
                n = q.n_all + (q.n_watch if i == chain._watch else 0)
                stats.n_call_draft += n
                stats.t_draft_us += looked * n / calls if calls else 0.0
            if nat is not None:
                engine.pool.used += int(nat.filled[0])
                nat.filled[0] = 0
                if stopped and q.resume >= 0:
                    nat.preset(self._call(q, self.look[j, k], k), q.resume)
        return engine._emit(st, tokens)

    @staticmethod
    def _call(q, mode: int, s: int) -> tuple:
        """The ask (NativeChain.ask's arguments) of row q's look `mode` before step s."""
        room = q.room - s
        lo, hi = (q.w, q.w + 1) if mode == WATCH else (0, q.n_d)
        return (q.n_hist, q.sampled, min(room, q.max_draft), q.min_len,
                bool(True if mode == WATCH else q.first_only), lo, hi)
