"""The one output path: step outputs -> text deltas, stop strings, timings.

`Generation` turns one sequence's StepOutputs into `GenerationResponse`s; the
single-sequence generators here and the server's scheduler (and the batch job
through it) all use it, so text, stop strings and llama.cpp's `timings` are
computed in one place.

    stream_generate(engine, prompt, ...)   GenerationResponse per decode that emitted
    generate(engine, prompt, ...)          the whole text + the final response

Invariants: the concatenated `text` of a sequence's responses is its output with
stop strings cut; text that could still become a stop string is held back until
it cannot; the last response has `finish_reason` set and carries the final stats.
"""
from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from ..settings.config import SpecConfig
from .engine import Engine, SeqState, StepOutput
from ..llama.model import Model
from .sampling import TokenProbs
from ..settings.sampling import SamplingParams
from ..speculative.stats import timings, tokens_per_step


@dataclass(frozen=True)
class TokenOutput:
    """One emitted token with its probabilities (requests with n_probs > 0)."""

    text: str  # the text this token made safe to send (llama-server's text_to_send)
    probs: TokenProbs


@dataclass
class GenerationResponse:
    """One streamed piece of a generation (mlx-lm style); the last one has the totals."""

    text: str  # new text since the previous response
    tokens: list[int]  # tokens emitted by this step
    finish_reason: str | None  # None while generating; "stop" | "length" | "cancelled"
    prompt_tokens: int
    cache_n: int  # prompt tokens reused from the slot's cache
    generation_tokens: int
    prompt_ms: float
    predicted_ms: float
    draft_n: int
    draft_n_accepted: int
    steps: int  # verify steps (the prompt's first token excluded)
    speculative: bool = False
    slot_id: int = 0
    stop_type: str = "none"  # llama.cpp: none | eos | limit | word
    stopping_word: str = ""
    truncated: bool = False  # stopped because the slot's context is full, or shifted
    probs: list[TokenOutput] = field(default_factory=list)  # per emitted token, when n_probs > 0
    prediction: tuple[int, int] | None = None  # (drafted, accepted) of the request's prediction
    host_ms: float = 0.0  # its steps' wall time outside the decodes' compute (Engine.step)
    prediction_unused: int | None = None  # the final response: prediction tokens not in the output

    @property
    def final(self) -> bool:
        return self.finish_reason is not None

    @property
    def predicted_per_second(self) -> float:
        """llama.cpp's rate: tokens after the first (which the prompt's logits give)."""
        n = self.generation_tokens - 1
        return n / (self.predicted_ms / 1e3) if self.predicted_ms > 0 and n > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.draft_n_accepted / self.draft_n if self.draft_n else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens per verify step (accepted + 1 each); the prompt's token excluded."""
        return tokens_per_step(self.generation_tokens - 1, self.steps)

    def timings(self) -> dict:
        """llama.cpp's `timings` object."""
        return timings(self.prompt_tokens - self.cache_n, self.prompt_ms, self.generation_tokens,
                       self.predicted_ms, self.draft_n, self.draft_n_accepted, self.cache_n,
                       self.prediction, self.host_ms, self.steps)


class TextStream:
    """Bytes of token pieces -> text, holding back partial UTF-8 and stop-string prefixes."""

    def __init__(self, model: Model, stop: Sequence[str] = ()):
        self.model = model
        self.stop = [s for s in stop if s]
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""  # all text so far (stop strings cut)
        self._sent = 0
        self.stopped: str | None = None  # the stop string found

    def push(self, tokens: Sequence[int], final: bool = False) -> str:
        """Add tokens; return the text now safe to send."""
        for t in tokens:
            self.text += self._dec.decode(self.model.piece(t))
        if final:
            self.text += self._dec.decode(b"", final=True)
        hold = 0
        if self.stopped is None:
            found = [(i, s) for s in self.stop
                     if (i := self.text.find(s, max(self._sent - len(s), 0))) >= 0]
            if found:
                i, self.stopped = min(found)
                self.text = self.text[:i]
            else:
                for s in self.stop:
                    for k in range(min(len(s) - 1, len(self.text)), 0, -1):  # a prefix at the end
                        if self.text.endswith(s[:k]):
                            hold = max(hold, k)
                            break
        upto = len(self.text) if (final or self.stopped is not None) else len(self.text) - hold
        upto = max(upto, self._sent)
        new = self.text[self._sent:upto]
        self._sent = upto
        return new


class Generation:
    """One sequence's output: StepOutputs in, GenerationResponses out."""

    def __init__(self, model: Model, st: SeqState, stop: Sequence[str] = (),
                 truncate_at_length: bool = False):
        self.st, self.stream = st, TextStream(model, stop)
        self.truncate_at_length = truncate_at_length

    def push(self, out: StepOutput) -> GenerationResponse:
        """The response for one step's tokens.

        Invariant: a step that accepted drafted tokens past a stop string emits
        exactly what plain decoding would have: the tokens up to the one that
        completes the stop string; the rest are dropped from `tokens`, from the
        probabilities and from the generated count (`st.n_generated`)."""
        st = self.st
        finish = out.finish_reason
        tokens, probs = list(out.tokens), []
        if out.probs or self.stream.stop:  # token by token: each token's own share of the text
            pieces = self._push_each(tokens, finish is not None)
            st.n_generated -= len(tokens) - len(pieces)
            tokens = tokens[:len(pieces)]
            probs = [TokenOutput(text, p) for text, p in zip(pieces, out.probs or ())]
            delta = "".join(pieces)
        else:
            delta = self.stream.push(tokens, final=finish is not None)
        stop_type, word = "none", ""
        if self.stream.stopped is not None:
            finish = st.finish_reason = "stop"
            stop_type, word = "word", self.stream.stopped
        elif finish == "stop":
            stop_type = "eos"
        elif finish == "length":
            stop_type = "limit"
        prompt_done = st.t_prompt_done or st.t_last
        return GenerationResponse(
            text=delta, tokens=tokens, finish_reason=finish, prompt_tokens=st.n_prompt,
            cache_n=st.n_cached, generation_tokens=st.n_generated,
            prompt_ms=(prompt_done - st.t_start) * 1e3,
            predicted_ms=max(st.t_last - prompt_done, 0.0) * 1e3, draft_n=st.draft_n,
            draft_n_accepted=st.draft_n_accepted, steps=st.steps, speculative=st.speculative,
            slot_id=st.seq_id, stop_type=stop_type, stopping_word=word,
            truncated=(finish == "length" and self.truncate_at_length) or st.n_shifted > 0,
            probs=probs, prediction=st.prediction, host_ms=st.host_s * 1e3,
            prediction_unused=st.prediction_unused() if finish is not None else None)

    def _push_each(self, tokens: list[int], final: bool) -> list[str]:
        """Each token's text, stopping after the token that completes a stop string."""
        pieces = []
        for i, t in enumerate(tokens):
            if self.stream.stopped is not None:
                break  # tokens a step drafted past a stop string: plain decoding has none
            pieces.append(self.stream.push([t], final=final and i == len(tokens) - 1))
        return pieces


def stream_generate(engine: Engine, prompt: str | Sequence[int], sampling: SamplingParams,
                    n_predict: int = 256, speculative: bool = True, stop: Sequence[str] = (),
                    seq_id: int = 0, spec: SpecConfig | None = None) -> Iterator[GenerationResponse]:
    """Yield a GenerationResponse per decode that emitted; the last one has finish_reason set."""
    tokens = engine.model.tokenize(prompt) if isinstance(prompt, str) else prompt
    gen = None
    for st, out in engine.generate_step(tokens, sampling, n_predict, speculative, seq_id, spec,
                                         stop):
        gen = gen or Generation(engine.model, st, stop)
        r = gen.push(out)
        yield r
        if r.final:
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
