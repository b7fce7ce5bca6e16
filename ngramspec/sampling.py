"""Sampling parameters and the per-sequence sampler (llama.cpp's sampler chain).

Invariants:
- Greedy with no grammar and no penalties uses numpy argmax on the logits (the
  same token llama.cpp's greedy sampler picks: the first maximum).
- Otherwise every token comes from `llama_sampler_sample`, which also *accepts*
  the token into the chain (grammar state, penalty history, RNG). The verify
  loop samples the drafted positions in order and stops at the first mismatch,
  so the chain only ever accepts tokens that are emitted: its state is exactly
  that of plain decoding, and no rollback of sampler state is needed.
- With a fixed seed, one RNG draw per emitted token in both modes, so sampled
  speculative output equals sampled plain output when the logits agree.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import ConfigError
from .model import Context, _llama


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # <= 0: greedy
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: random
    grammar: str | None = None  # GBNF

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or self.temperature != self.temperature:
            raise ConfigError(f"--temp must be a number, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"--top-k must be an integer >= 0, got {self.top_k!r}")
        for name, v in (("--top-p", self.top_p), ("--min-p", self.min_p)):
            if not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                raise ConfigError(f"{name} must be between 0 and 1, got {v!r}")
        if not isinstance(self.repeat_penalty, (int, float)) or self.repeat_penalty <= 0:
            raise ConfigError(f"--repeat-penalty must be > 0, got {self.repeat_penalty!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"--seed must be a non-negative integer, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def plain_argmax(self) -> bool:
        return self.greedy and self.grammar is None and self.repeat_penalty == 1.0


class Sampler:
    """Picks the token at a logits row of the last decode, for one sequence."""

    def __init__(self, ctx: Context, params: SamplingParams):
        self.ctx, self.params = ctx, params
        self.chain = None
        if not params.plain_argmax:
            self.chain = self._build(ctx, params)

    @staticmethod
    def _build(ctx: Context, p: SamplingParams):
        lc = _llama()
        chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        if p.repeat_penalty != 1.0:
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_penalties(
                ctx.n_vocab, p.repeat_last_n, p.repeat_penalty, 0.0, 0.0))
        if p.grammar is not None:
            g = lc.llama_sampler_init_grammar(ctx.model.vocab, p.grammar.encode(), b"root")
            if not g:
                lc.llama_sampler_free(chain)
                raise ConfigError("invalid grammar: llama.cpp could not parse the GBNF "
                                  "(check the rule named 'root' and the syntax)")
            lc.llama_sampler_chain_add(chain, g)
        if p.greedy:
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
        else:
            if p.top_k > 0:
                lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_k(p.top_k))
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_p(p.top_p, 1))
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_min_p(p.min_p, 1))
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(p.temperature))
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_dist(p.seed & 0xFFFFFFFF))
        return chain

    def sample(self, index: int) -> int:
        """Sample (and accept) the token for batch index `index` of the last decode."""
        if self.chain is None:
            return int(np.argmax(self.ctx.logits_at(index)))
        return int(_llama().llama_sampler_sample(self.chain, self.ctx.ptr, index))

    def close(self) -> None:
        if self.chain is not None:
            _llama().llama_sampler_free(self.chain)
            self.chain = None

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass


def json_grammar() -> str:
    """llama.cpp's generic JSON grammar (GBNF)."""
    from llama_cpp.llama_grammar import JSON_GBNF

    return JSON_GBNF


def schema_grammar(schema: dict | str) -> str:
    """GBNF for a JSON schema, or ConfigError naming what is wrong."""
    import json

    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        text = schema if isinstance(schema, str) else json.dumps(schema)
        return json_schema_to_gbnf(text)
    except Exception as e:  # the converter raises assorted errors on bad schemas
        raise ConfigError(f"invalid JSON schema: {e}") from None
