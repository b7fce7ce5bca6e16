"""Sampling settings: `SamplingParams`, the ranges of its numbers (`RANGES`, declared
once: SamplingParams checks them on construction and the request models in jobs/types.py
take their bounds from them, `bounds`), and llama.cpp's sampler names and order.

Invariant: nothing here calls llama.cpp; engine/sampler_chain.py builds the chain these
settings describe (which sampler is `active`, one rule for the chain and `moves_top`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class Range:
    """A setting's range: a finite number in [lo, hi] (lo excluded with `above`), an
    integer where `integer`; `flag` names the command-line flag in the message."""

    lo: float = -math.inf
    hi: float = math.inf
    integer: bool = False
    above: bool = False
    flag: str = ""

    def check(self, name: str, v) -> None:
        """ConfigError naming `name` (and its flag) where `v` is outside the range."""
        kind = isinstance(v, int) if self.integer else isinstance(v, (int, float))
        ok = (kind and not isinstance(v, bool) and math.isfinite(v)
              and (v > self.lo if self.above else v >= self.lo) and v <= self.hi)
        if not ok:
            raise ConfigError(f"{name}{f' ({self.flag})' if self.flag else ''} must be "
                              f"{self.describe()}, got {v!r}")

    def describe(self) -> str:
        what = "an integer" if self.integer else "a finite number"
        if math.isfinite(self.lo) and math.isfinite(self.hi):
            return f"{what} between {self.lo:g} and {self.hi:g}"
        if math.isfinite(self.lo):
            return f"{what} {'>' if self.above else '>='} {self.lo:g}"
        return what


#: every numeric sampling setting's range (llama-server's, server-schema.cpp and
#: OpenAI's); seed and n_probs are checked apart (a request's -1 seed means random)
RANGES = {
    "temperature": Range(flag="--temp"),
    "top_k": Range(0, integer=True, flag="--top-k"),
    "top_p": Range(0.0, 1.0, flag="--top-p"),
    "min_p": Range(0.0, 1.0, flag="--min-p"),
    "repeat_penalty": Range(0.0, above=True, flag="--repeat-penalty"),
    "repeat_last_n": Range(-1, integer=True, flag="--repeat-last-n"),
    "frequency_penalty": Range(-2.0, 2.0, flag="--frequency-penalty"),
    "presence_penalty": Range(-2.0, 2.0, flag="--presence-penalty"),
    "dry_multiplier": Range(), "dry_base": Range(),
    "dry_allowed_length": Range(0, integer=True), "dry_penalty_last_n": Range(-1, integer=True),
    "xtc_probability": Range(0.0, 1.0), "xtc_threshold": Range(0.0, 1.0),
    "typical_p": Range(), "top_n_sigma": Range(),
    "mirostat": Range(0, 2, integer=True), "mirostat_tau": Range(), "mirostat_eta": Range(),
    "dynatemp_range": Range(), "dynatemp_exponent": Range(),
    "min_keep": Range(0, integer=True),
}


def bounds(name: str) -> dict:
    """`RANGES[name]` as a pydantic Field's keywords (ge/gt/le where finite)."""
    r = RANGES[name]
    out = {}
    if math.isfinite(r.lo):
        out["gt" if r.above else "ge"] = r.lo
    if math.isfinite(r.hi):
        out["le"] = r.hi
    return out


#: llama.cpp's sampler names (common_sampler_type_to_str) and one-letter forms
NAMES = {"dry": "d", "top_k": "k", "typ_p": "y", "top_p": "p", "top_n_sigma": "s", "min_p": "m",
         "temperature": "t", "xtc": "x", "penalties": "e"}
DEFAULT_ORDER = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
                 "temperature")
#: samplers that always keep the most probable token: greedy sampling leaves them out
KEEP_TOP = frozenset({"top_k", "top_p", "min_p", "top_n_sigma", "temperature"})
_ALIASES = {"nucleus": "top_p", "temp": "temperature", "typ": "typ_p", "typical_p": "typ_p",
            "typical": "typ_p"}


def parse_order(value) -> tuple[str, ...]:
    """llama.cpp's sampler order from a list of names (canonical, kebab-case, no-dash or
    an alias: "top-k", "topk", "nucleus", ...) or a string of one-letter forms
    ("edkypmxt"); `;`-separated names too (--samplers). Unknown names: ConfigError
    (llama.cpp skips them with a warning; a request that names a sampler that is not
    applied is refused here instead)."""
    chars = {c: n for n, c in NAMES.items()}
    if isinstance(value, str) and ";" not in value and all(c in chars for c in value):
        return tuple(chars[c] for c in value)
    items = value.split(";") if isinstance(value, str) else list(value)
    lookup = dict(_ALIASES)
    for n in NAMES:
        lookup.update({n: n, n.replace("_", "-"): n, n.replace("_", ""): n})
    out = []
    for item in items:
        key = str(item).strip().lower()
        if key not in lookup:
            raise ConfigError(f"unknown sampler {item!r} in samplers; valid names: "
                              f"{', '.join(NAMES)} (or the letters {''.join(NAMES.values())})")
        out.append(lookup[key])
    return tuple(out)


def order_string(order: tuple[str, ...]) -> str:
    """The one-letter form of an order (llama-server's `sampler_seq`)."""
    return "".join(NAMES[n] for n in order)


def active(p, name: str) -> bool:
    """Whether sampler `name` does something with the settings `p` (a no-op one is left
    out of the chain). The one rule: the chain and `moves_top` read it."""
    return {"penalties": p.penalized, "dry": p.dry, "top_n_sigma": p.top_n_sigma > 0,
            "top_k": p.top_k > 0, "typ_p": p.typical_p < 1, "top_p": True, "min_p": True,
            "xtc": p.xtc, "temperature": not p.greedy}[name]


def moves_top(p) -> bool:
    """Whether the chain can pick another token than the top one of the biased logits
    at temperature 0: an active sampler of the order outside KEEP_TOP (with mirostat,
    temperature 0 leaves the top token alone to it)."""
    return not p.mirostat and any(active(p, n) for n in p.samplers if n not in KEEP_TOP)


RANDOM_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: every sampler seeds itself


def seed_or_random(seed: int) -> int:
    """A seed as given by a user: llama.cpp's -1 (any negative) means random (RANDOM_SEED)."""
    return RANDOM_SEED if seed < 0 else seed


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples (llama-server's sampling settings, common/common.h's
    defaults except temperature: greedy). Every numeric range is `RANGES`'s, checked on
    construction (ConfigError); the request models take theirs from it too."""

    temperature: float = 0.0  # <= 0: greedy
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0  # OpenAI's: minus this times the token's count so far
    presence_penalty: float = 0.0  # OpenAI's: minus this once a token has occurred
    seed: int = RANDOM_SEED
    grammar: str | None = None  # GBNF
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias); -inf bans the token
    n_probs: int = 0  # > 0: report the top n_probs probabilities of every sampled token
    post_sampling_probs: bool = False  # probabilities after the chain, not of the raw logits
    ignore_eos: bool = False  # every end-of-generation token gets a -inf bias
    # llama-server's other samplers (common/common.h defaults; sampler_chain.py applies them)
    dry_multiplier: float = 0.0  # DRY: 0 off
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64  # tokens DRY scans (0: off; -1: the context)
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", "\"", "*")
    xtc_probability: float = 0.0  # XTC: 0 off
    xtc_threshold: float = 0.1  # > 0.5: off
    typical_p: float = 1.0  # 1: off
    top_n_sigma: float = -1.0  # <= 0: off
    mirostat: int = 0  # 0 off, 1 Mirostat, 2 Mirostat 2.0 (replace the samplers but temperature)
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    dynatemp_range: float = 0.0  # temperature in [temp - range, temp + range] by entropy
    dynatemp_exponent: float = 1.0
    min_keep: int = 0
    samplers: tuple[str, ...] = DEFAULT_ORDER  # llama.cpp's order (`NAMES`)

    def __post_init__(self) -> None:
        for name, r in RANGES.items():
            r.check(name, getattr(self, name))
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed (--seed) must be a non-negative integer, got {self.seed!r}")
        if not isinstance(self.n_probs, int) or self.n_probs < 0:
            raise ConfigError(f"n_probs must be an integer >= 0, got {self.n_probs!r}")
        if not all(isinstance(b, str) and b for b in self.dry_sequence_breakers):
            raise ConfigError("dry_sequence_breakers must be a list of non-empty strings")
        unknown = [n for n in self.samplers if n not in NAMES]
        if unknown:
            raise ConfigError(f"unknown sampler {unknown[0]!r}; valid names: {', '.join(NAMES)}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def penalized(self) -> bool:
        """Whether the chain holds llama.cpp's penalties sampler (repeat, frequency,
        presence: one sampler, over the last repeat_last_n emitted tokens)."""
        return (self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)

    @property
    def dry(self) -> bool:
        return (self.dry_multiplier > 0 and self.dry_base >= 1.0 and self.dry_penalty_last_n != 0
                and "dry" in self.samplers and not self.mirostat)

    @property
    def xtc(self) -> bool:
        return (self.xtc_probability > 0 and self.xtc_threshold <= 0.5 and "xtc" in self.samplers
                and not self.mirostat)

    @property
    def plain_argmax(self) -> bool:
        """Whether greedy sampling is the argmax of the raw logits: no biases, no grammar
        and no sampler that can move the top token (`moves_top`)."""
        return (self.greedy and self.grammar is None and not self.logit_bias
                and not self.ignore_eos and not moves_top(self))

    def biases(self, model) -> list[tuple[int, float]]:
        """The chain's logit biases: the request's, then -inf for EOG tokens with ignore_eos
        (llama.cpp's order)."""
        eog = [(t, float("-inf")) for t in model.eog_tokens()] if self.ignore_eos else []
        return [*self.logit_bias, *eog]
