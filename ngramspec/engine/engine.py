"""The speculative engine: draft, verify in one batched decode, keep accepted + 1, roll back.

Layers (each a generator over the one below, as in mlx-lm):
    Engine.prefill(st) / Engine.step(seqs)   one llama_decode each
    Engine.generate_step(...)                StepOutput per decode, for one sequence
    generate.stream_generate(...)            GenerationResponse per step (text, stats)
    generate.generate(...)                   the whole text + final stats

A sequence's life: `start` (admission: sampler, speculation, prompt cache; no
decode) -> `prefill` until its prompt is in the KV cache (the last chunk samples
the first token) -> `step` together with every other generating sequence ->
`finish` (its KV stays as the slot's prompt cache).

Invariants (per sequence, after every step):
- KV cache holds exactly tokens[:n_hist] at positions 0..n_hist-1; `sampled`
  (the last emitted token) is not yet in the KV cache or history.
- A step evaluates [sampled] + draft at positions n_hist.., samples every row
  in order and stops at the first row whose token differs from the draft: it
  emits accepted + 1 tokens; KV entries past them are removed.
- Spec-off is the same loop with empty drafts, so the two modes differ only in
  how many tokens one llama_decode evaluates. The sampler (its chain and RNG)
  samples exactly the rows of the emitted tokens, in order, in both modes, so a
  seeded sampled run gives spec-off's tokens too.
- A StepOutput's `probs` (when the sampling asks for n_probs) come from the rows
  its tokens were sampled from, one per emitted token.
- A draft never makes a step overshoot n_predict or the context.
- Context shift (a sequence started with `context_shift`): before a step whose
  token would take the slot's last cell (n_hist + 1 >= n_ctx_seq), n_discard
  tokens after n_keep are dropped from the KV and the history and the rest move
  down (llama-server's rule, `_shift`). Drafts never cross that point, so the
  shift happens at the same token with speculation on and off. Only the tokens
  before n_keep keep the values a fresh prefill gives (`n_unshifted`).
- Prompt tokens are evaluated by `Context.prefill` (tiled attention, 64+ rows)
  when the prompt has 64 tokens or more, else by one ordinary decode (the small-row
  path that generation steps take too); either way the prompt's KV is a function
  of the prompt alone (docs/exactness.md), so a cached prefix is reused only where
  it was evaluated that same way: a long prompt reuses the tiled cells of the last
  prompt, a short one every cell of a slot whose last prompt was short (its prompt
  and generated tokens alike).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from ..settings.config import SpecConfig
from ..speculative.cost import Calibration, Shape
from ..speculative.draft_model import DraftModelDrafter
from ..speculative.drafters import EMPTY, as_tokens, common_prefix
from ..speculative.drafters.chains import Chains
from ..speculative.drafters.prediction import PredictionDrafter, unused_tokens
from ..errors import ConfigError, NgramSpecError
from ..llama.context import MAX_INVARIANT_BATCH, TILED_PREFILL_MIN, Context
from ..llama.model import ContextOverflow, Model
from ..speculative.policy import DraftPolicy, FixedPolicy
from ..speculative.pool import HashPool
from .fold import MAX_STEPS, STOP_STEPS, Fold
from .request import Request, output_budget
from .sampling import Sampler
from ..settings.sampling import SamplingParams
from ..speculative.speculation import NO_OPTIONS, Speculation
from ..speculative.stats import DrafterStats

#: bytes of logit rows one generation decode may produce (Engine._limits): 128 rows of
#: a 262k vocabulary, about what llama-server's 8 slots with 16-token drafts produce
LOGIT_BUFFER_MAX = 128 << 20


@dataclass
class SeqState:
    """One sequence being generated (a request, a server slot)."""

    seq_id: int
    sampler: Sampler
    n_predict: int
    tokens: np.ndarray  # history buffer, int32, capacity n_ctx + 1
    n_prompt: int
    speculation: Speculation | None = None
    n_hist: int = 0  # tokens in the KV cache (during prefill: prompt tokens so far)
    n_cached: int = 0  # prompt tokens reused from the slot's cache
    sampled: int = -1
    n_generated: int = 0
    steps: int = 0
    finish_reason: str | None = None
    t_start: float = 0.0
    t_prompt_done: float = 0.0
    t_last: float = 0.0
    n_keep: int | None = None  # context shift: tokens kept (None: no shift, stop when full)
    n_discard: int = 0  # context shift: tokens dropped per shift (0: half of the rest)
    n_shifted: int = 0  # tokens dropped by context shifts so far
    n_unshifted: int = 1 << 62  # leading KV tokens no shift has moved
    host_s: float = 0.0  # wall time of its generation steps outside the decodes' compute
    fold_steps: int = 0  # the most steps a folded run makes of it (fold.py; 0: the default)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def prefilling(self) -> bool:
        return self.sampled < 0 and not self.done

    @property
    def speculative(self) -> bool:
        return self.speculation is not None

    @property
    def draft_n(self) -> int:
        return self.speculation.draft_n if self.speculation else 0

    @property
    def draft_n_accepted(self) -> int:
        return self.speculation.draft_n_accepted if self.speculation else 0

    @property
    def prediction(self) -> tuple[int, int] | None:
        """(tokens drafted from the request's prediction and verified, of them accepted);
        None for a sequence without a prediction (or without speculation)."""
        if self.speculation is None or not self.speculation.own:
            return None
        return self.speculation.own_n, self.speculation.own_n_accepted

    def prediction_unused(self) -> int | None:
        """The request's prediction tokens that do not appear in its completion so far
        (`prediction.unused_tokens`; OpenAI's rejected_prediction_tokens); None without
        a prediction. The completion is read from the history (after a context shift,
        what the slot still holds of it)."""
        if self.speculation is None or not self.speculation.own:
            return None
        at = min(self.n_prompt, self.n_hist)
        done = self.tokens[at:self.n_hist].tolist() + [self.sampled]
        return unused_tokens(self.speculation.own[0].pred, done[:self.n_generated])


@dataclass
class StepOutput:
    """Tokens one decode emitted for one sequence (EOG excluded)."""

    tokens: list[int]
    drafted: int = 0
    accepted: int = 0
    finish_reason: str | None = None
    probs: list = field(default_factory=list)  # TokenProbs per token (n_probs > 0), same order
    error: NgramSpecError | None = None  # this sequence's own input failed it (finish "error")
    decodes: int = 1  # the decodes it covers (a folded run of plain steps: fold.py)


@dataclass
class SlotCache:
    """What a sequence id's KV holds after its last request (llama-server's cache_prompt)."""

    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    reusable: int = 0  # leading tokens reusable as prompt, all evaluated on one path:
    tiled: bool = True  # the tiled prefill (True) or the small-row path (False)


class Engine:
    """A model context plus drafters on one shared pool; serves up to n_seq_max sequences.

    Each sequence may use its own SpecConfig (server requests can override the
    type and lengths); chains for equal configs are shared, and a drafter with
    given parameters exists once, so ngram-mod's table is one table for all.
    """

    def __init__(self, model: Model, ctx: Context, spec: SpecConfig | None = None,
                 draft_drafter=None, policy: DraftPolicy | None = None,
                 calibration: Calibration | None = None):
        self.model, self.ctx = model, ctx
        self.spec = spec or SpecConfig(types=())
        self.policy: DraftPolicy = policy or FixedPolicy()
        self.pool = HashPool(self.spec.pool_bytes)
        self.draft_drafter = draft_drafter
        self.chains = Chains(self.pool, draft_drafter)
        self.cache: dict[int, SlotCache] = {}
        self.calibration = calibration  # how the cost model was obtained (cost.calibrate_context)
        self.host_s = 0.0  # generation steps' wall time outside their decodes' compute
        self.n_steps = 0  # generation steps (decodes) made
        self.fold = Fold.of(ctx, model, draft_drafter)  # plain steps in one C call, or None

    # ------------------------------------------------------------ admission
    def reusable_prefix(self, seq_id: int, prompt: np.ndarray) -> int:
        """Prompt tokens sequence `seq_id`'s KV already holds, evaluated as a prefill of
        this prompt would evaluate them (the same path: tiled or small-row); at least
        one token is always left to evaluate (its logits give the first token)."""
        c = self.cache.get(seq_id)
        if c is None or c.tiled != self._tiled(len(prompt)):
            return 0
        return min(common_prefix(c.tokens[:c.reusable], prompt), len(prompt) - 1)

    def speculates(self, spec: SpecConfig | None = None, wanted: bool = True,
                   prediction: bool = False) -> bool:
        """The one rule for whether a sequence speculates: the client wants it (`wanted`)
        and something can draft: a spec type of `spec` (default: the engine's), the
        draft model, or the request's own `prediction`. `start` applies it; callers
        that report the decision before the start (response headers, props) ask it."""
        cfg = self.spec if spec is None else spec
        return wanted and (cfg.enabled or self.draft_drafter is not None or prediction)

    def start(self, seq_id: int, req: Request) -> SeqState:
        """Admit a new sequence for `req` (a Request, or the jobs layer's Job, which is
        one): sampler, speculation and the slot's cached prefix. Nothing is evaluated:
        `prefill` does that."""
        prompt, shift = as_tokens(req.prompt, "prompt"), req.context_shift
        if len(prompt) == 0:
            raise ConfigError("the prompt is empty")
        n_ctx = self.ctx.n_ctx_seq
        if len(prompt) >= n_ctx:
            raise ContextOverflow(len(prompt), n_ctx)
        if shift is not None and self.ctx.swa_span is not None:
            raise ConfigError("context shift needs a full-size sliding-window cache (llama.cpp "
                              "cannot shift a window-size one): load with --swa-full")
        want = -1 if req.n_predict is None else req.n_predict
        n_predict = output_budget(want, n_ctx - len(prompt), shift is not None)[0]
        if n_predict < 0:  # a context shift: until the end of generation
            n_predict = 1 << 62
        cfg = self.spec if req.spec is None else req.spec
        sampler = Sampler(self.ctx, req.sampling, prompt)
        st = SeqState(seq_id=seq_id, sampler=sampler, n_predict=n_predict,
                      tokens=np.zeros(n_ctx + 1, dtype=np.int32), n_prompt=len(prompt))
        st.t_start = time.perf_counter()
        st.fold_steps = STOP_STEPS if req.stop else MAX_STEPS
        st.tokens[:len(prompt)] = prompt
        if shift is not None:
            keep, st.n_discard = shift
            keep = (len(prompt) if keep < 0 else keep) + int(self.model.add_bos)
            st.n_keep = min(n_ctx - 4, keep)  # llama-server counts BOS on top of n_keep
        st.n_cached = self.reusable_prefix(seq_id, prompt) if req.cache_prompt else 0
        self.ctx.truncate(seq_id, st.n_cached)
        self.ctx.begin_prompt(seq_id, st.n_cached)
        self.cache.pop(seq_id, None)
        st.n_hist = st.n_cached
        if isinstance(self.draft_drafter, DraftModelDrafter):
            self.draft_drafter.set_p_min(seq_id, cfg.draft_p_min)
        pred = req.prediction
        own = [PredictionDrafter(pred)] if pred is not None and len(pred) else []
        if self.speculates(cfg, req.speculative, bool(own)):
            st.speculation = Speculation(seq_id, self.chains.get(cfg), self.policy, own)
            st.speculation.begin(prompt, st.tokens)
        return st

    def prefill(self, st: SeqState, max_tokens: int = 512) -> StepOutput | None:
        """Evaluate the next chunk of st's prompt (one llama_decode, this sequence alone).

        Returns the first token's StepOutput when the prompt is complete, else None.
        """
        if not self._tiled(st.n_prompt):
            step = MAX_INVARIANT_BATCH if self.ctx.invariant else self.ctx.n_batch
            end = min(st.n_prompt, st.n_hist + step)
            src = self.ctx
            rows = self.ctx.decode([(st.seq_id, st.tokens[st.n_hist:end], st.n_hist, False)])[0]
        else:
            end = self._chunk_end(st, max_tokens)
            src, rows = self.ctx.prefill(st.seq_id, st.tokens[st.n_hist:end], st.n_hist,
                                         last=end == st.n_prompt)
        st.n_hist = end
        if end < st.n_prompt:
            return None
        st.t_prompt_done = st.t_last = time.perf_counter()
        if st.n_predict == 0:
            st.finish_reason = "length"
            return StepOutput([], finish_reason="length")
        st.sampled = st.sampler.sample(rows[-1], src)
        kept = self._emit(st, [st.sampled])
        return StepOutput(kept, finish_reason=st.finish_reason,
                          probs=st.sampler.take_probs()[:len(kept)])

    def _tiled(self, n_prompt: int) -> bool:
        """Whether a prompt of n_prompt tokens is evaluated by the tiled prefill."""
        return self.ctx.tiled_prefill and n_prompt >= TILED_PREFILL_MIN

    def _chunk_end(self, st: SeqState, max_tokens: int) -> int:
        """End of the next tiled chunk: at most max_tokens (>= 128, <= prefill_chunk), never
        leaving a remainder under TILED_PREFILL_MIN; a last chunk that is short and
        has no room for padding before the slot's end re-evaluates earlier prompt
        tokens instead (same values: the tiled path is per-token deterministic)."""
        cap = min(max(max_tokens, 2 * TILED_PREFILL_MIN), self.ctx.prefill_chunk)
        left = st.n_prompt - st.n_hist
        n = min(left, cap)
        if n < left and left - n < TILED_PREFILL_MIN:
            n = left - TILED_PREFILL_MIN
        if n < TILED_PREFILL_MIN and st.n_hist + TILED_PREFILL_MIN > self.ctx.n_ctx_seq:
            st.n_hist = st.n_prompt - TILED_PREFILL_MIN
            st.n_cached = min(st.n_cached, st.n_hist)
            self.ctx.truncate(st.seq_id, st.n_hist)
            n = TILED_PREFILL_MIN
        return st.n_hist + n

    def finish(self, st: SeqState) -> None:
        """Release a sequence: drafter state and sampler; its KV stays as the slot's
        prompt cache (the part that a later prefill would evaluate alike): a long
        prompt's tiled cells, or, after a short prompt, every cell (its prompt and its
        generation steps both took the small-row path) while the KV still holds them
        from position 0 (a window-size SWA cache drops cells out of the window)."""
        tiled = self._tiled(st.n_prompt)
        if tiled:
            reusable = st.n_prompt if not st.prefilling else 0
        elif self.ctx.positions(st.seq_id)[0] > 0:
            reusable = 0  # a window-size SWA cache no longer holds the first cells
        else:
            reusable = st.n_hist
        reusable = min(reusable, st.n_unshifted)
        self.cache[st.seq_id] = SlotCache(st.tokens[:st.n_hist].copy(), reusable, tiled)
        self.policy.flush()  # the cost curve it learnt, cached between steps
        if st.speculation is not None:
            st.speculation.end()
        st.sampler.close()
        if st.finish_reason is None:
            st.finish_reason = "cancelled"

    def forget(self, seq_id: int) -> None:
        """Drop a sequence id's KV and cache entry (after a failure)."""
        self.cache.pop(seq_id, None)
        self.ctx.clear(seq_id)

    # ------------------------------------------------------------ one step
    def _room(self, st: SeqState) -> int:
        return min(st.n_predict - st.n_generated - 1, self.ctx.n_ctx_seq - st.n_hist - 2)

    def _limits(self) -> tuple[int, int]:
        """(rows per sequence, rows per decode) a generation decode may hold. Every row
        of a generation decode has logits, and llama.cpp's output buffer keeps as many
        rows resident as the largest decode had (n_vocab floats each: 1 MiB with a
        262k vocabulary), so a decode holds at most LOGIT_BUFFER_MAX bytes of them (at
        least one row per slot). Draft lengths never change an output."""
        n_seq = self.ctx.params.n_seq_max
        logit_rows = max(LOGIT_BUFFER_MAX // (4 * self.model.n_vocab), n_seq)
        if self.ctx.fixed_rows:  # a decode of fixed_rows rows a slot (llama/fixed_shape.py)
            return self.ctx.fixed_rows, self.ctx.fixed_rows * n_seq
        if not self.ctx.invariant:
            return self.ctx.n_batch, min(self.ctx.n_batch, logit_rows)
        if self.ctx.per_seq_streams:  # U2 per stream; padding needs one spare row per entry
            return MAX_INVARIANT_BATCH, min(self.ctx.n_batch - n_seq, logit_rows)
        return MAX_INVARIANT_BATCH, min(MAX_INVARIANT_BATCH, logit_rows)

    def step(self, seqs: Sequence[SeqState], fold: bool = True) -> list[StepOutput]:
        """One verify step for every generating sequence in `seqs`, in ONE llama_decode.
        The decode takes the sequences in ascending seq id whatever the order of `seqs`
        (llama.cpp forms fewer ubatches from runs of consecutive ids: ubatch.py). With
        `fold`, plain steps after it may be made in the same call (fold.py): a caller
        with a prompt to evaluate meanwhile passes False."""
        t0 = time.perf_counter()
        active = sorted((s for s in seqs if not s.done and not s.prefilling),
                        key=lambda s: s.seq_id)
        for st in active:
            if st.n_keep is not None and st.n_hist + 1 >= self.ctx.n_ctx_seq:
                self._shift(st)
        drafts = self._drafts(active)
        observed = self.speculates() or any(st.speculation is not None for st in active)
        folded = (fold and bool(active) and self.fold is not None and not any(map(len, drafts))
                  and self.fold.steps(self, active))
        if folded:  # this step and the plain ones after it in one C call (fold.py)
            folded, kept = self.fold.run(self, active, folded, observed)
            out = {id(st): StepOutput(kept[id(st)], finish_reason=st.finish_reason,
                                      decodes=folded) for st in active}
        else:
            entries = [(st.seq_id, [st.sampled, *d.tolist()], st.n_hist, True)
                       for st, d in zip(active, drafts)]
            rows = self._timed_decode(entries, all(st.sampler.argmax_only for st in active),
                                      observed)
            out = {id(st): self._checked_verify(st, d, r)
                   for st, d, r in zip(active, drafts, rows)}
        if active:
            host = time.perf_counter() - t0 - self.ctx.compute_s
            self.host_s += host
            self.n_steps += folded or 1
            for st in active:
                st.host_s += host
        return [out.get(id(s), StepOutput([], finish_reason=s.finish_reason)) for s in seqs]

    def _drafts(self, active: list[SeqState]) -> list[np.ndarray]:
        """Each sequence's draft for this step: its proposals (`Speculation.plan`: none
        while the policy rests, rest.py, unless the sequence has drafters of its own or its
        chain's watch fires), the lengths the policy chooses for all together, and the
        drafts committed; a step where nothing proposed asks the policy nothing."""
        opts = [st.speculation.plan(st.tokens[:st.n_hist], st.sampled, self._room(st))
                if st.speculation is not None else NO_OPTIONS for st in active]
        if all(o is NO_OPTIONS for o in opts):
            return [EMPTY] * len(active)
        base = [Shape(st.seq_id, 1, 1, st.n_hist) for st in active]
        ks = self.policy.plan(opts, base, *self._limits())
        return [st.speculation.commit(k) if st.speculation is not None else EMPTY
                for st, k in zip(active, ks)]

    def _timed_decode(self, entries: list, argmax_only: bool = False,
                      speculating: bool = True) -> list[list[int]]:
        """ctx.decode of a generation step; its compute time (until the device finished,
        `Context.compute_s`) and shape go to the policy, whose cost model learns from
        every step (policy.observe_decode), except, on an engine where only requests'
        predictions draft (no spec type, no draft model), the steps where no sequence
        speculates: they cost spec-off's host time, as does a policy without a cost model."""
        if not entries:
            return []
        rows = self.ctx.decode(entries, argmax_only)
        if speculating and self.policy.cost is not None:
            self.policy.observe_decode([Shape(e[0], len(e[1]), len(e[1]), e[2])
                                        for e in entries], self.ctx.compute_s)
        return rows

    def _checked_verify(self, st: SeqState, draft: np.ndarray, rows: list[int]) -> StepOutput:
        """`_verify`, except that an error of this sequence's own input (its grammar
        reaching a dead end) ends this sequence alone with finish_reason "error" and the
        error in its StepOutput; the other sequences of the decode go on."""
        try:
            return self._verify(st, draft, rows)
        except NgramSpecError as e:
            st.finish_reason = "error"
            self.ctx.truncate(st.seq_id, st.n_hist)
            return StepOutput([], len(draft), 0, "error", error=e)

    def _shift(self, st: SeqState) -> None:
        """llama-server's context shift: drop n_discard tokens after n_keep (default half
        of the rest), move the later ones down; the drafters start over on the result."""
        n_left = st.n_hist - st.n_keep
        n_discard = st.n_discard or n_left // 2
        n_discard = min(max(n_discard, 0), max(0, n_left - 1))
        self.ctx.shift(st.seq_id, st.n_keep, n_discard, st.n_hist)
        a, b = st.n_keep, st.n_keep + n_discard
        st.tokens[a:st.n_hist - n_discard] = st.tokens[b:st.n_hist].copy()
        st.n_hist -= n_discard
        st.n_shifted += n_discard
        st.n_unshifted = min(st.n_unshifted, st.n_keep)
        if st.speculation is not None:
            st.speculation.end()
            st.speculation.begin(st.tokens[:st.n_hist], st.tokens)

    def _accepted(self, st: SeqState, draft: np.ndarray, rows: list[int]) -> list[int]:
        """Sample the rows in order (one sampler call each: chain, RNG) and return the
        emitted tokens: the accepted draft tokens, then the target's token at the first
        position not accepted."""
        out: list[int] = []
        for i, idx in enumerate(rows):
            tok = st.sampler.sample(idx)
            if i < len(draft):
                d = int(draft[i])
                if tok == d:
                    out.append(d)
                    continue
            out.append(tok)
            break
        return out

    def _verify(self, st: SeqState, draft: np.ndarray, rows: list[int]) -> StepOutput:
        sampled = self._accepted(st, draft, rows)
        n_acc = len(sampled) - 1
        keep = st.n_hist + 1 + n_acc
        if len(draft) > n_acc:
            self.ctx.truncate(st.seq_id, keep)
        st.tokens[st.n_hist] = st.sampled
        if n_acc:
            st.tokens[st.n_hist + 1:keep] = draft[:n_acc]
        st.n_hist = keep
        st.sampled = sampled[-1]
        st.steps += 1
        if st.speculation is not None:
            st.speculation.settle(sampled, n_acc)
        kept = self._emit(st, sampled)
        return StepOutput(kept, len(draft), n_acc, st.finish_reason,
                          st.sampler.take_probs()[:len(kept)])

    def _emit(self, st: SeqState, tokens: list[int]) -> list[int]:
        """Count emitted tokens, stopping at end-of-generation or n_predict."""
        kept = []
        for t in tokens:
            if self.model.is_eog(t):
                st.finish_reason = "stop"
                break
            kept.append(t)
            st.n_generated += 1
            if st.n_generated >= st.n_predict:
                st.finish_reason = "length"
                break
        st.t_last = time.perf_counter()
        return kept

    # ------------------------------------------------------------ one sequence
    def generate_step(self, prompt, sampling: SamplingParams, n_predict: int = 256,
                      speculative: bool = True, seq_id: int = 0, spec: SpecConfig | None = None,
                      stop: Sequence[str] = ()) -> Iterator[tuple[SeqState, StepOutput]]:
        """Yield (state, StepOutput) per decode that emitted for one sequence until it finishes."""
        st = self.start(seq_id, Request(prompt=prompt, sampling=sampling, n_predict=n_predict,
                                        speculative=speculative, spec=spec, stop=stop))
        try:
            first = None
            while first is None:
                first = self.prefill(st)
            yield st, first
            while not st.done:
                out = self.step([st])[0]
                if out.error is not None:
                    raise out.error
                yield st, out
        finally:
            self.finish(st)

    def stats(self) -> dict[str, DrafterStats]:
        """llama.cpp-style counters per drafter, summed over every chain in use."""
        return self.chains.stats()
