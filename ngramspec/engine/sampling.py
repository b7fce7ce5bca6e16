"""The per-sequence sampler (llama.cpp's sampler chain) over SamplingParams (settings/sampling.py).

Invariants:
- Greedy with no grammar and no penalties uses numpy argmax on the logits (the
  same token llama.cpp's greedy sampler picks: the first maximum).
- Otherwise every token comes from the llama.cpp sampler chain, which also
  *accepts* the token into the chain (grammar state, penalty history, RNG). With
  a grammar the chain is applied, the selected token checked (a token the grammar
  rejected would make llama.cpp abort on accept), then accepted: a grammar with no
  continuation raises GrammarError, and its cost per token is bounded
  (`_guard_grammar`). The verify
  loop samples the drafted positions in order and stops at the first mismatch,
  so the chain only ever accepts tokens that are emitted: its state is exactly
  that of plain decoding, and no rollback of sampler state is needed.
- With a fixed seed, one RNG draw per emitted token in both modes, so sampled
  speculative output equals sampled plain output when the logits agree.
- `logit_bias` is the chain's first sampler (as in llama.cpp's common sampler), so
  plain decoding and speculative verification apply it alike.
- With `n_probs > 0` every sampled token gets a `TokenProbs` computed from the very
  row it was sampled from (no extra decode); `take_probs` hands them over in
  sampling order. Pre-sampling probabilities are the softmax of the raw logits;
  post-sampling ones are the candidates the chain left, as llama-server reports.
"""
from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import ConfigError, GrammarError
from ..llama.context import Context
from ..llama.backend import _llama
from ..settings.sampling import SamplingParams
from .sampler_chain import add_samplers


#: a grammar whose sampling of one token is estimated to cost more than this is refused
GRAMMAR_MAX_SECONDS = 1.0
GRAMMAR_PROBE_STRIDE = 128  # the estimate applies the grammar to every 128th token id
GRAMMAR_DEAD_END = ("the grammar admits no continuation here: no token can follow the text "
                    "generated so far (check the grammar or JSON schema)")
@dataclass(frozen=True)
class TokenProbs:
    """Probabilities of one sampled token: its own and the top ones (best first)."""

    token: int
    prob: float  # probability of `token` (0.0 when the chain removed it)
    top: tuple[tuple[int, float], ...]  # (token id, probability), at most n_probs
    post_sampling: bool = False


def raw_probs(logits: np.ndarray, token: int, n: int) -> TokenProbs:
    """Softmax of a raw logits row: `token`'s probability and the n most likely tokens
    (ties keep the lower id first, as a stable sort by logit would)."""
    x = logits.astype(np.float64)
    e = np.exp(x - x.max())
    p = e / e.sum()
    n = min(n, len(p))
    top = np.argpartition(-x, n - 1)[:n] if n < len(p) else np.arange(len(p))
    top = top[np.lexsort((top, -x[top]))]
    return TokenProbs(token, float(p[token]), tuple((int(t), float(p[t])) for t in top))


TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data


def _candidates(ids: np.ndarray, logits: np.ndarray | float = 0.0) -> np.ndarray:
    """A llama_token_data array of `ids` with their logits."""
    cand = np.zeros(len(ids), dtype=TOKEN_DATA)
    cand["id"] = ids
    cand["logit"] = logits
    return cand


def _left(cur, cand: np.ndarray) -> np.ndarray:
    """The candidates a sampler chain left in `cur`, which was built over `cand`: a view
    of `cand` when the chain kept its buffer, else a copy (a sampler may point `data` at
    memory of its own, which the next apply can free)."""
    n = int(cur.size)
    if ctypes.cast(cur.data, ctypes.c_void_p).value == cand.ctypes.data:
        return cand[:n]
    nbytes = n * TOKEN_DATA.itemsize
    raw = np.ctypeslib.as_array(ctypes.cast(cur.data, ctypes.POINTER(ctypes.c_uint8)),
                                shape=(nbytes,)) if nbytes else np.zeros(0, np.uint8)
    return raw.view(TOKEN_DATA).copy()


def _probe_cost(smpl, n_vocab: int, stride: int, extra: list[int]) -> tuple[float, bool]:
    """(seconds a full apply of `smpl` would take, estimated from every `stride`-th token
    id plus `extra`; whether any of those is admitted)."""
    probe = np.union1d(np.arange(0, n_vocab, stride), np.asarray(extra, dtype=np.int64))
    t0 = time.perf_counter()
    admitted = _apply_alone(smpl, probe)
    return (time.perf_counter() - t0) * n_vocab / len(probe), admitted


def _apply_alone(smpl, ids: np.ndarray) -> bool:
    """Apply one sampler (no side effect: a grammar) to candidates `ids`: whether any
    keeps a finite logit."""
    lc = _llama()
    cand = _candidates(ids)
    cur = lc.llama_token_data_array(cand.ctypes.data_as(ctypes.POINTER(lc.llama_token_data)),
                                    len(cand), -1, False)
    lc.llama_sampler_apply(smpl, ctypes.byref(cur))
    return bool(np.isfinite(cand["logit"][:cur.size]).any())


class Sampler:
    """Picks the token at a logits row of the last decode, for one sequence."""

    def __init__(self, ctx: Context, params: SamplingParams, prompt: Sequence[int] = ()):
        """`prompt`: the sequence's prompt tokens; the samplers that keep history (the
        penalties, DRY) take its last repeat_last_n / dry_penalty_last_n (llama-server
        accepts the prompt into its chain but the grammar), so they apply to text the
        prompt already holds."""
        self.ctx, self.params = ctx, params
        self.chain = None
        self._probs: list[TokenProbs] = []
        self._parts: dict[str, object] = {}  # "penalties", "dry", "grammar": inside the chain
        if not params.plain_argmax:
            self.chain, self._parts = self._build(ctx, params)
        for name, last_n in (("penalties", params.repeat_last_n),
                             ("dry", params.dry_penalty_last_n)):
            hist = self._parts.get(name)
            if hist is not None and last_n != 0 and len(prompt):
                for tok in prompt[-last_n if last_n > 0 else -len(prompt):]:
                    _llama().llama_sampler_accept(hist, int(tok))
        if params.grammar is not None:
            try:
                self._guard_grammar(start=True)
            except GrammarError:
                self.close()
                raise

    @staticmethod
    def _build(ctx: Context, p: SamplingParams) -> tuple[object, dict[str, object]]:
        """The chain (sampler_chain.py's order), and its penalties, DRY and grammar
        samplers (owned by the chain: used in place, to prime the history samplers with
        the prompt and to probe the grammar)."""
        lc = _llama()
        chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        parts: dict[str, object] = {}
        biases = p.biases(ctx.model)
        outside = [t for t, _ in biases if not 0 <= t < ctx.n_vocab]
        if outside:
            lc.llama_sampler_free(chain)
            raise ConfigError(f"logit bias token {outside[0]} is outside the vocabulary "
                              f"[0, {ctx.n_vocab})")
        if biases:
            arr = (lc.llama_logit_bias * len(biases))(*biases)
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_logit_bias(
                ctx.n_vocab, len(biases), arr))
        if p.grammar is not None:
            g = lc.llama_sampler_init_grammar(ctx.model.vocab, p.grammar.encode(), b"root")
            if not g:
                lc.llama_sampler_free(chain)
                raise ConfigError("invalid grammar: llama.cpp could not parse the GBNF "
                                  "(check the rule named 'root' and the syntax)")
            lc.llama_sampler_chain_add(chain, g)
            parts["grammar"] = g
        parts.update(add_samplers(lc, chain, ctx, p))
        return chain, parts

    def sample(self, index: int, ctx: Context | None = None) -> int:
        """Sample (and accept) the token for batch index `index` of the last decode of
        `ctx` (default: the sampler's context; a prompt's last chunk may come from the
        prefill twin); with n_probs > 0 its TokenProbs (from this same row) is kept for
        `take_probs`. GrammarError when the grammar admits no token at this row."""
        p, ctx = self.params, ctx or self.ctx
        if self.chain is not None and (p.grammar is not None or
                                       (p.n_probs > 0 and p.post_sampling_probs)):
            logits = ctx.logits_at(index)
            left, sel = self._apply(logits)
            tok = int(left["id"][sel])
            _llama().llama_sampler_accept(self.chain, tok)
            if p.n_probs > 0:
                self._probs.append(self._post_probs(left, tok) if p.post_sampling_probs
                                   else raw_probs(logits, tok, p.n_probs))
            return tok
        if self.chain is None:
            tok = ctx.argmax_at(index)
        else:
            ctx.logits_at(index)  # llama.cpp's buffer holds the row (Hook.materialize)
            tok = int(_llama().llama_sampler_sample(self.chain, *ctx.logits_source(index)))
        if p.n_probs > 0:  # post-sampling without a chain: greedy argmax, probability 1
            self._probs.append(TokenProbs(tok, 1.0, ((tok, 1.0),), True) if p.post_sampling_probs
                               else raw_probs(ctx.logits_at(index), tok, p.n_probs))
        return tok

    @property
    def argmax_only(self) -> bool:
        """Whether `sample` reads no more of a row than its argmax (`Context.argmax_at`)."""
        return self.chain is None and self.params.n_probs <= 0

    def take_probs(self) -> list[TokenProbs]:
        """TokenProbs of the tokens sampled since the last call, in sampling order."""
        out, self._probs = self._probs, []
        return out

    def _guard_grammar(self, start: bool = False) -> None:
        """Bound what the grammar costs, before the chain applies it to a whole row.

        Applying a grammar has no side effect, so it is applied alone to every
        GRAMMAR_PROBE_STRIDE-th token id (and the EOG tokens): the time, scaled to the
        vocabulary, estimates the full apply (~0.4 ms for a JSON grammar). Timing noise
        only adds, so an estimate over GRAMMAR_MAX_SECONDS but under 3 times it is
        measured again and confirmed on a probe 8 times larger before the request is
        refused; one far over is refused at once, so a hostile grammar costs the other
        slots one probe (a grammar with thousands of alternatives costs seconds per
        token, and every slot waits for it). At `start`,
        a grammar that admits no first token at all is refused too (checked on the whole
        vocabulary when the probe admits none)."""
        g, n = self._parts["grammar"], self.ctx.n_vocab
        eog = self.ctx.model.eog_tokens()
        est, admitted = _probe_cost(g, n, GRAMMAR_PROBE_STRIDE, eog)
        if GRAMMAR_MAX_SECONDS < est < 3 * GRAMMAR_MAX_SECONDS:  # noise, or a close call
            est = min(est, _probe_cost(g, n, GRAMMAR_PROBE_STRIDE, eog)[0])
            if est > GRAMMAR_MAX_SECONDS:
                est, admitted = _probe_cost(g, n, GRAMMAR_PROBE_STRIDE // 8, eog)
        if est > GRAMMAR_MAX_SECONDS:
            raise GrammarError(f"the grammar is too costly: sampling one token with it would take "
                               f"about {est:.1f} s over this model's {n}-token vocabulary (limit "
                               f"{GRAMMAR_MAX_SECONDS:g} s); use fewer alternatives")
        if start and not admitted and not _apply_alone(g, np.arange(n)):
            raise GrammarError("the grammar admits no token: no text can start it (check the "
                               "grammar or JSON schema, e.g. an empty character range)")

    def _apply(self, logits: np.ndarray) -> tuple[np.ndarray, int]:
        """Apply the chain to a row as llama_sampler_sample does, without accepting:
        (the candidates the chain left, the selected index among them).

        The token is checked BEFORE anything accepts it: llama.cpp's grammar aborts the
        process (an exception across the C API) when it accepts a token it rejected,
        which is what a greedy or dist sampler selects once the grammar has banned
        every token (all logits -inf). That case raises GrammarError instead."""
        lc = _llama()
        if self.params.grammar is not None:
            self._guard_grammar()
        n = len(logits)
        cand = _candidates(np.arange(n, dtype=np.int32), logits)
        cur = lc.llama_token_data_array(cand.ctypes.data_as(ctypes.POINTER(lc.llama_token_data)),
                                        n, -1, False)
        lc.llama_sampler_apply(self.chain, ctypes.byref(cur))
        left = _left(cur, cand)
        sel = int(cur.selected)
        if not 0 <= sel < len(left) or not np.isfinite(left["logit"][sel]):
            raise GrammarError(GRAMMAR_DEAD_END)
        return left, sel

    def _post_probs(self, left: np.ndarray, tok: int) -> TokenProbs:
        """Post-sampling probabilities: the candidates the chain left, best first. A
        greedy chain selects without probabilities: its token gets 1.0, as llama.cpp's
        temperature-0 chain gives."""
        if self.params.greedy:
            return TokenProbs(tok, 1.0, ((tok, 1.0),), True)
        ids, probs = left["id"], left["p"]
        order = np.argsort(-probs, kind="stable")[:self.params.n_probs]
        top = tuple((int(ids[i]), float(probs[i])) for i in order if probs[i] > 0.0)
        own = probs[ids == tok]
        return TokenProbs(tok, float(own[0]) if len(own) else 0.0, top, True)

    def close(self) -> None:
        if self.chain is not None:
            _llama().llama_sampler_free(self.chain)
            self.chain = None

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass
