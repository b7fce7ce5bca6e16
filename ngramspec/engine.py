"""The speculative engine: draft, verify in one batched decode, keep accepted + 1, roll back.

Layers (each a generator over the one below, as in mlx-lm):
    Engine.step(seqs)          one llama_decode for every active sequence
    Engine.generate_step(...)  StepOutput per verify step, for one sequence
    stream_generate(...)       GenerationResponse per token (text delta, stats)
    generate(...)              the whole text + final stats

Invariants (per sequence, after every step):
- KV cache holds exactly tokens[:n_hist] at positions 0..n_hist-1; `sampled`
  (the last emitted token) is not yet in the KV cache or history.
- A step evaluates [sampled] + draft at positions n_hist.., samples every row
  in order and stops at the first row whose token differs from the draft: it
  emits accepted + 1 tokens; KV entries past them are removed.
- Spec-off is the same loop with empty drafts, so the two modes differ only in
  how many tokens one llama_decode evaluates.
- A draft never makes a step overshoot n_predict or the context.
"""
from __future__ import annotations

import codecs
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from .config import SpecConfig
from .drafters import EMPTY, DrafterChain, as_tokens
from .drafters.chain import drafter_keys, make_drafter_for
from .policy import DraftPolicy, FixedPolicy
from .errors import ConfigError
from .model import MAX_INVARIANT_BATCH, Context, ContextOverflow, Model
from .pool import HashPool
from .sampling import Sampler, SamplingParams
from .stats import DrafterStats, timings


MAX_CONFIGS = 64


@dataclass
class SeqState:
    """One sequence being generated (a request, a server slot)."""

    seq_id: int
    sampler: Sampler
    n_predict: int
    speculative: bool
    tokens: np.ndarray  # history buffer, int32, capacity n_ctx
    n_prompt: int
    chain: DrafterChain | None = None
    n_hist: int = 0
    sampled: int = -1
    n_generated: int = 0
    steps: int = 0
    draft_n: int = 0
    draft_n_accepted: int = 0
    finish_reason: str | None = None
    t_start: float = 0.0
    t_prompt_done: float = 0.0
    t_last: float = 0.0

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


@dataclass
class StepOutput:
    """Tokens one verify step emitted for one sequence (EOG excluded)."""

    tokens: list[int]
    drafted: int
    accepted: int
    finish_reason: str | None


class Engine:
    """A model context plus drafters on one shared pool; serves up to n_seq_max sequences.

    Each sequence may use its own SpecConfig (server requests can override the
    type and lengths); chains for equal configs are shared, and a drafter with
    given parameters exists once, so ngram-mod's table is one table for all.
    """

    def __init__(self, model: Model, ctx: Context, spec: SpecConfig | None = None,
                 draft_drafter=None, policy: DraftPolicy | None = None):
        self.model, self.ctx = model, ctx
        self.spec = spec or SpecConfig(types=())
        self.policy: DraftPolicy = policy or FixedPolicy()
        self.pool = HashPool(self.spec.pool_bytes)
        self.draft_drafter = draft_drafter
        self._drafters: dict[tuple, object] = {}
        self._chains: dict[SpecConfig, DrafterChain] = {}

    def chain_for(self, cfg: SpecConfig) -> DrafterChain:
        """The (cached) chain for `cfg`, built from shared drafter instances.

        At most MAX_CONFIGS chains and drafters are cached (oldest evicted): a
        sequence keeps its own chain object, and a re-created ngram-mod drafter
        with the same parameters reads the same pool entries, so eviction only
        costs per-request statistics, never correctness.
        """
        chain = self._chains.get(cfg)
        if chain is None:
            for cache in (self._chains, self._drafters):
                while len(cache) >= MAX_CONFIGS:
                    del cache[next(iter(cache))]
            drafters = []
            for key in drafter_keys(cfg):
                if key not in self._drafters:
                    self._drafters[key] = make_drafter_for(key, cfg, self.pool)
                drafters.append(self._drafters[key])
            if self.draft_drafter is not None:  # draftless first, the draft model last
                drafters.append(self.draft_drafter)
            chain = self._chains[cfg] = DrafterChain(cfg, self.pool, drafters)
        return chain

    # ------------------------------------------------------------ lifecycle
    def start(self, seq_id: int, prompt: Sequence[int] | np.ndarray, sampling: SamplingParams,
              n_predict: int = 256, speculative: bool = True,
              spec: SpecConfig | None = None) -> SeqState:
        """Evaluate the prompt of a new sequence and sample its first token.

        `spec` overrides the engine's SpecConfig for this sequence; speculative=False
        or an empty type list turns drafting off for it.
        """
        prompt = as_tokens(prompt, "prompt")
        if len(prompt) == 0:
            raise ConfigError("the prompt is empty")
        n_ctx = self.ctx.n_ctx_seq
        if len(prompt) >= n_ctx:
            raise ContextOverflow(len(prompt), n_ctx)
        n_predict = n_ctx - len(prompt) if n_predict is None or n_predict < 0 else n_predict
        n_predict = min(n_predict, n_ctx - len(prompt))
        cfg = self.spec if spec is None else spec
        chain = None
        if speculative and (cfg.enabled or self.draft_drafter is not None):
            chain = self.chain_for(cfg)
        st = SeqState(seq_id=seq_id, sampler=Sampler(self.ctx, sampling), n_predict=n_predict,
                      speculative=chain is not None, chain=chain,
                      tokens=np.zeros(n_ctx + 1, dtype=np.int32), n_prompt=len(prompt))
        st.t_start = time.perf_counter()
        self.ctx.clear(seq_id)
        st.tokens[:len(prompt)] = prompt
        rows: list[int] = []
        # invariant: chunks under 64 tokens keep flash attention off its tiled path,
        # whose sums would depend on where the sequence's cells lie
        step = MAX_INVARIANT_BATCH if self.ctx.invariant else self.ctx.n_batch
        for i in range(0, len(prompt), step):
            chunk = prompt[i:i + step]
            rows = self.ctx.decode([(seq_id, chunk, i, False)])[0]
        st.n_hist = len(prompt)
        if st.speculative:
            st.chain.begin(seq_id, prompt)
        st.t_prompt_done = st.t_last = time.perf_counter()
        if n_predict == 0:
            st.finish_reason = "length"
            return st
        st.sampled = st.sampler.sample(rows[-1])
        return st

    def first_output(self, st: SeqState) -> StepOutput:
        """The token sampled from the prompt, as a StepOutput (counts toward n_predict)."""
        if st.done:
            return StepOutput([], 0, 0, st.finish_reason)
        return StepOutput(self._emit(st, [st.sampled]), 0, 0, st.finish_reason)

    def finish(self, st: SeqState) -> None:
        """Release a sequence: KV entries, drafter state, sampler."""
        self.ctx.clear(st.seq_id)
        if st.speculative:
            st.chain.end(st.seq_id)
            self.policy.end(st.seq_id)
        st.sampler.close()
        if st.finish_reason is None:
            st.finish_reason = "cancelled"

    # ------------------------------------------------------------ one step
    def _draft_for(self, st: SeqState, budget: int, base: int) -> np.ndarray:
        """The draft to verify for `st`; `base` = tokens already in this step's batch."""
        if not st.speculative:
            return EMPTY
        room = min(st.n_predict - st.n_generated - 1, self.ctx.n_ctx_seq - st.n_hist - 2, budget)
        if room <= 0:
            return EMPTY
        return self.policy.plan(st, room, base)

    def step(self, seqs: Sequence[SeqState]) -> list[StepOutput]:
        """One verify step for every sequence in `seqs`, in ONE llama_decode."""
        active = [s for s in seqs if not s.done]
        limit = MAX_INVARIANT_BATCH if self.ctx.invariant else self.ctx.n_batch
        budget = limit - 2 * len(active)  # `sampled` (+ padding) per sequence
        drafts = []
        base = len(active) - 1
        for st in active:
            d = self._draft_for(st, max(budget, 0), base)
            budget -= len(d)
            base += len(d)
            drafts.append(d)
        entries = [(st.seq_id, [st.sampled, *d.tolist()], st.n_hist, True)
                   for st, d in zip(active, drafts)]
        rows = self.ctx.decode(entries) if entries else []
        out: dict[int, StepOutput] = {}
        for st, d, r in zip(active, drafts, rows):
            out[id(st)] = self._verify(st, d, r)
        return [out.get(id(s), StepOutput([], 0, 0, s.finish_reason)) for s in seqs]

    def _verify(self, st: SeqState, draft: np.ndarray, rows: list[int]) -> StepOutput:
        sampled: list[int] = []
        for i, idx in enumerate(rows):
            tok = st.sampler.sample(idx)
            sampled.append(tok)
            if i >= len(draft) or tok != draft[i]:
                break
        n_acc = len(sampled) - 1
        keep = st.n_hist + 1 + n_acc
        if len(draft) > n_acc:
            self.ctx.truncate(st.seq_id, keep)
        st.tokens[st.n_hist] = st.sampled
        st.tokens[st.n_hist + 1:keep] = draft[:n_acc]
        st.n_hist = keep
        st.sampled = sampled[-1]
        st.steps += 1
        if len(draft):
            st.chain.accept(st.seq_id, n_acc)
            st.draft_n += len(draft)
            st.draft_n_accepted += n_acc
        if st.speculative:
            self.policy.observe(st, sampled, n_acc)
        return StepOutput(self._emit(st, sampled), len(draft), n_acc, st.finish_reason)

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
                      speculative: bool = True, seq_id: int = 0,
                      spec: SpecConfig | None = None) -> Iterator[tuple[SeqState, StepOutput]]:
        """Yield (state, StepOutput) per verify step for one sequence until it finishes."""
        st = self.start(seq_id, prompt, sampling, n_predict, speculative, spec)
        try:
            yield st, self.first_output(st)
            while not st.done:
                yield st, self.step([st])[0]
        finally:
            self.finish(st)

    def measure_verify(self, n: int, seq_id: int = 0) -> float:
        """Seconds for one n-token decode with all logits (sequence `seq_id` must be free)."""
        toks = (np.arange(n, dtype=np.int32) * 7919 + 1000) % max(self.model.n_vocab - 1, 1)
        self.ctx.clear(seq_id)
        t0 = time.perf_counter()
        self.ctx.decode([(seq_id, toks, 0, True)])
        dt = time.perf_counter() - t0
        self.ctx.clear(seq_id)
        return dt

    def calibrate(self, refresh: bool = False):
        """The verify-cost curve t(n) of this model, context and thread count (cached)."""
        from .cost import load_or_calibrate

        p = self.model.path
        key = (f"{p.resolve()}:{p.stat().st_size}:threads={self.ctx.params.n_threads}:"
               f"batch={self.ctx.n_batch}:invariant={self.ctx.invariant}")
        self.measure_verify(8)  # warm-up: first decodes allocate buffers
        return load_or_calibrate(key, self.measure_verify, refresh=refresh)

    def stats(self) -> dict[str, DrafterStats]:
        """llama.cpp-style counters per drafter, summed over every chain in use."""
        total: dict[str, DrafterStats] = {}
        for chain in self._chains.values():
            for name, st in chain.stats.items():
                acc = total.setdefault(name, DrafterStats(name))
                for k, v in st.__dict__.items():
                    if k == "acc_per_pos":
                        acc.acc_per_pos += [0] * (len(v) - len(acc.acc_per_pos))
                        for i, x in enumerate(v):
                            acc.acc_per_pos[i] += x
                    elif k != "name":
                        setattr(acc, k, getattr(acc, k) + v)
        return total


# ------------------------------------------------------------------ text layer


@dataclass
class GenerationResponse:
    """One streamed piece of a generation (mlx-lm style)."""

    text: str  # new text since the previous response
    tokens: list[int]  # tokens emitted by this step
    finish_reason: str | None
    prompt_tokens: int
    generation_tokens: int
    prompt_ms: float
    predicted_ms: float
    draft_n: int
    draft_n_accepted: int
    steps: int

    @property
    def predicted_per_second(self) -> float:
        return self.generation_tokens / (self.predicted_ms / 1e3) if self.predicted_ms else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.draft_n_accepted / self.draft_n if self.draft_n else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verify step (accepted + 1 each); the prompt's token excluded."""
        return (self.generation_tokens - 1) / self.steps if self.steps else 1.0

    def timings(self) -> dict:
        """llama.cpp's `timings` object."""
        return timings(self.prompt_tokens, self.prompt_ms, self.generation_tokens,
                       self.predicted_ms, self.draft_n, self.draft_n_accepted)


class TextStream:
    """Bytes of token pieces -> text, holding back partial UTF-8 and stop-string prefixes."""

    def __init__(self, model: Model, stop: Sequence[str] = ()):
        self.model = model
        self.stop = [s for s in stop if s]
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""  # all text so far (stop strings cut)
        self._sent = 0
        self.stopped = False

    def push(self, tokens: Sequence[int], final: bool = False) -> str:
        """Add tokens; return the text now safe to send."""
        for t in tokens:
            self.text += self._dec.decode(self.model.piece(t))
        if final:
            self.text += self._dec.decode(b"", final=True)
        hold = 0
        for s in self.stop:
            i = self.text.find(s, max(self._sent - len(s), 0))
            if i >= 0:
                self.text = self.text[:i]
                self.stopped = True
                hold = 0
                break
            for k in range(min(len(s) - 1, len(self.text)), 0, -1):  # a prefix at the end
                if self.text.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        upto = len(self.text) if (final or self.stopped) else len(self.text) - hold
        upto = max(upto, self._sent)
        new = self.text[self._sent:upto]
        self._sent = upto
        return new


def stream_generate(engine: Engine, prompt: str | Sequence[int], sampling: SamplingParams,
                    n_predict: int = 256, speculative: bool = True, stop: Sequence[str] = (),
                    seq_id: int = 0, spec: SpecConfig | None = None) -> Iterator[GenerationResponse]:
    """Yield a GenerationResponse per verify step; the last one has finish_reason set."""
    tokens = engine.model.tokenize(prompt) if isinstance(prompt, str) else prompt
    text = TextStream(engine.model, stop)
    for st, out in engine.generate_step(tokens, sampling, n_predict, speculative, seq_id, spec):
        finish = out.finish_reason
        delta = text.push(out.tokens, final=finish is not None)
        if text.stopped:
            finish = st.finish_reason = "stop"
        yield GenerationResponse(
            text=delta, tokens=out.tokens, finish_reason=finish, prompt_tokens=st.n_prompt,
            generation_tokens=st.n_generated,
            prompt_ms=(st.t_prompt_done - st.t_start) * 1e3,
            predicted_ms=(st.t_last - st.t_prompt_done) * 1e3,
            draft_n=st.draft_n, draft_n_accepted=st.draft_n_accepted, steps=st.steps)
        if finish is not None:
            return


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    final: GenerationResponse


def generate(engine: Engine, prompt: str | Sequence[int], sampling: SamplingParams,
             n_predict: int = 256, speculative: bool = True, stop: Sequence[str] = (),
             spec: SpecConfig | None = None) -> GenerationResult:
    """Run a whole generation; return its text, token ids and final stats."""
    parts, toks, last = [], [], None
    for r in stream_generate(engine, prompt, sampling, n_predict, speculative, stop, spec=spec):
        parts.append(r.text)
        toks.extend(r.tokens)
        last = r
    assert last is not None
    return GenerationResult("".join(parts), toks, last)
