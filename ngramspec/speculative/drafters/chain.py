"""The drafter registry and the ordered chain behind `--spec-type a,b,...`.

Invariants:
- One `HashPool` per chain, shared by all its drafters and all sequences.
- `draft` asks the drafters in order and returns the first draft that is at
  least draft_min long, truncated to min(max_len, draft_max) (llama.cpp's
  chain). `propose` + `commit` split that in two for policies that compare
  several drafters' proposals. Only the committed drafter gets `accept` for
  that step (llama.cpp's `impl_last`); unverified drafts are never accepted.
- Stats follow llama.cpp: calls, generated (verified)/accepted drafts and tokens,
  time (a sequence's one C call, native_chain.py, split evenly among the drafters it
  asked); and the drafts proposed, so the ones a policy declined show.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from ...settings.config import SPEC_TYPES, NgramMapParams, NgramModParams, SpecConfig
from ...errors import ConfigError
from ..pool import HashPool
from ..stats import DrafterStats
from .base import EMPTY, Drafter
from .native_chain import NativeChain, chain_params
from .ngram_map import NgramMapK, NgramMapK4V
from .ngram_mod import NgramMod
from .ngram_simple import NgramSimple

#: llama.cpp name (config.SPEC_TYPE_TABLE) -> drafter class, built on its parameters
#: (`SpecConfig.params(name)`) and a pool
_CLASSES = {"ngram-simple": NgramSimple, "ngram-map-k": NgramMapK, "ngram-map-k4v": NgramMapK4V,
            "ngram-mod": NgramMod}
REGISTRY: dict[str, Callable[[SpecConfig, HashPool], Drafter]] = {
    name: (lambda c, p, name=name: _CLASSES[name](c.params(name), p)) for name in SPEC_TYPES}


def make_drafter(name: str, config: SpecConfig | None = None,
                 pool: HashPool | None = None) -> Drafter:
    """One drafter by llama.cpp name, with `config`'s parameters (defaults if None)."""
    if name not in REGISTRY:
        raise ConfigError(f"unknown spec type {name!r}; valid values: {', '.join(SPEC_TYPES)}")
    config = config or SpecConfig(types=(name,))
    return REGISTRY[name](config, pool or HashPool(config.pool_bytes))


#: The drafters `--spec-type auto` compares every step: (type, parameters, name).
#: Long keys are precise; short keys catch copies that resume after an edit.
AUTO_CANDIDATES = (
    ("ngram-simple", NgramMapParams(size_n=12, size_m=64), "ngram-simple"),
    ("ngram-simple", NgramMapParams(size_n=5, size_m=64), "ngram-simple-n5"),
    ("ngram-map-k", NgramMapParams(size_n=8, size_m=64), "ngram-map-k-n8"),
    ("ngram-mod", NgramModParams(n_match=16, n_min=1, n_max=64), "ngram-mod-n16"),
)


def drafter_keys(cfg: SpecConfig) -> list[tuple]:
    """(type, parameters, name) of every drafter `cfg` chains, in chain order."""
    if cfg.auto:
        return list(AUTO_CANDIDATES)
    return [(t, cfg.params(t), t) for t in cfg.types]


def make_drafter_for(key: tuple, pool: HashPool):
    """One drafter for a `drafter_keys` entry (its type's class on its parameters), on `pool`."""
    t, params, name = key
    d = _CLASSES[t](params, pool)
    d.name = name
    return d


def watcher(drafters: Sequence[Drafter]) -> Drafter | None:
    """The drafter a chain watches with while its policy rests: of the ngram-mod and
    ngram-simple drafters (whose `draft` changes nothing a later call reads, so the
    step's proposals are the same with or without the watch), the one keyed on the most
    tokens (the least likely to match outside a copy); None without one."""
    found = [d for d in drafters if isinstance(d, (NgramMod, NgramSimple))]
    return max(found, key=lambda d: d.n, default=None)


class DrafterChain:
    """An ordered list of drafters on one pool, itself a `Drafter`. Without `drafters`
    it builds `drafter_keys(config)`'s, so an auto config gets the auto candidates.
    `stats` (per drafter name) may be shared by several chains: `Chains` passes one
    dict to all of its chains."""

    name = "chain"

    def __init__(self, config: SpecConfig, pool: HashPool | None = None,
                 drafters: list[Drafter] | None = None,
                 stats: dict[str, DrafterStats] | None = None):
        self.config = config
        self.pool = pool or HashPool(config.pool_bytes)
        self.drafters = drafters if drafters is not None else [
            make_drafter_for(key, self.pool) for key in drafter_keys(config)]
        self.stats = stats if stats is not None else {}
        for d in self.drafters:
            self.stats.setdefault(d.name, DrafterStats(d.name))
        self._last: dict[int, tuple[Drafter, int] | None] = {}
        self._cap = config.draft_max if config.draft_max is not None else 1 << 30
        self._min = max(config.draft_min, 1)
        w = watcher(self.drafters)
        self._watch = None if w is None else self.drafters.index(w)  # the watcher's index
        self._params = chain_params(self.pool, self.drafters)  # None: no drafter drafts in C
        self._native: dict[int, NativeChain] = {}  # per sequence, from `begin` to `end`
        self._stats_of = [self.stats[d.name] for d in self.drafters]

    def watch(self, seq_id: int, history: np.ndarray, sampled: int,
              max_len: int) -> list[tuple[Drafter, np.ndarray]]:
        """The chain's watcher's (`watcher`) proposal as `propose` makes it ([] where it
        drafts fewer than draft_min tokens): the one lookup a step pays while a policy rests
        (rest.py), to see a copy begin; where it matches, the step's only proposal (the
        other drafters are not asked). Counted as a call of that drafter and, where it
        drafts, as its proposal; nothing is committed."""
        self._last[seq_id] = None
        if self._watch is None:
            return []
        return self._ask(seq_id, history, sampled, max_len, True, lo=self._watch,
                         hi=self._watch + 1)

    def _draft(self, d: Drafter, seq_id: int, history: np.ndarray, sampled: int,
               max_len: int) -> tuple[np.ndarray, DrafterStats]:
        """`d.draft`, counted as one call of that drafter (its time too); with its stats."""
        t0 = time.perf_counter_ns()
        draft = d.draft(seq_id, history, sampled, max_len)
        st = self.stats.get(d.name) or self.stats.setdefault(d.name, DrafterStats(d.name))
        st.t_draft_us += (time.perf_counter_ns() - t0) / 1e3
        st.n_call_draft += 1
        return draft, st

    def begin(self, seq_id: int, prompt: np.ndarray, buffer: np.ndarray | None = None) -> None:
        """The drafters' `begin`; `buffer`: the int32 array whose prefix every later
        history of this sequence with it as numpy base is (the engine's token buffer:
        the C calls then read it at an address taken once, NativeChain)."""
        self._last[seq_id] = None
        for d in self.drafters:
            t0 = time.perf_counter_ns()
            d.begin(seq_id, prompt)
            st = self.stats[d.name]
            st.t_begin_us += (time.perf_counter_ns() - t0) / 1e3
            st.n_call_begin += 1
        if self._params is not None:
            self._native[seq_id] = NativeChain(self.pool, self.drafters, self._params, seq_id,
                                               buffer)

    def propose(self, seq_id: int, history: np.ndarray, sampled: int, max_len: int,
                first_only: bool = True, extra: Sequence[Drafter] = ()) -> list[tuple[Drafter, np.ndarray]]:
        """Ask the drafters in order (a sequence's own `extra` drafters first); return
        (drafter, draft) pairs, each draft cut to min(max_len, draft_max) and at least
        draft_min long. With first_only, stop at the first such draft (llama.cpp's
        chain). Nothing is committed yet."""
        self._last[seq_id] = None
        return self._ask(seq_id, history, sampled, max_len, first_only, extra)

    def _ask(self, seq_id: int, history: np.ndarray, sampled: int, max_len: int,
             first_only: bool, extra: Sequence[Drafter] = (), lo: int = 0,
             hi: int | None = None) -> list[tuple[Drafter, np.ndarray]]:
        """`propose`'s asking of `extra`, then of the chain's drafters [lo, hi): each
        draft cut to min(max_len, draft_max), kept (and counted as a proposal) where at
        least draft_min long; in one C call for the chain's drafters where the sequence
        has a NativeChain (`begin`)."""
        max_len = min(max_len, self._cap)
        out: list[tuple[Drafter, np.ndarray]] = []
        if max_len < self._min:
            return out
        hi = len(self.drafters) if hi is None else hi
        for d in extra:
            self._keep(out, d, *self._draft(d, seq_id, history, sampled, max_len), max_len)
            if first_only and out:
                return out
        plan = self._native.get(seq_id)
        if plan is None:
            for d in self.drafters[lo:hi]:
                self._keep(out, d, *self._draft(d, seq_id, history, sampled, max_len), max_len)
                if first_only and out:
                    break
            return out
        t0 = time.perf_counter_ns()
        found, end = plan.ask(seq_id, history, sampled, max_len, self._min, first_only, lo, hi)
        each = (time.perf_counter_ns() - t0) / 1e3 / max(end - lo, 1)
        for st in self._stats_of[lo:end]:
            st.n_call_draft += 1
            st.t_draft_us += each
        for j, draft in found:
            st = self._stats_of[j]
            st.n_prop_drafts += 1
            st.n_prop_tokens += len(draft)
            out.append((self.drafters[j], draft))
        return out

    def _keep(self, out: list, d: Drafter, draft: np.ndarray, st: DrafterStats,
              max_len: int) -> None:
        """`draft` of `d` into `out`, counted as a proposal, where draft_min long."""
        if len(draft) >= self._min:
            out.append((d, draft[:max_len]))
            st.n_prop_drafts += 1
            st.n_prop_tokens += min(len(draft), max_len)

    def commit(self, seq_id: int, drafter: Drafter, draft: np.ndarray) -> np.ndarray:
        """Mark `draft` (from `drafter`) as the one verified this step."""
        if len(draft):
            self._last[seq_id] = (drafter, len(draft))
            st = self.stats[drafter.name]
            st.n_gen_drafts += 1
            st.n_gen_tokens += len(draft)
        return draft

    def draft(self, seq_id: int, history: np.ndarray, sampled: int, max_len: int) -> np.ndarray:
        """llama.cpp's chain: the first non-empty draft, committed."""
        found = self.propose(seq_id, history, sampled, max_len, first_only=True)
        if not found:
            return EMPTY
        return self.commit(seq_id, *found[0])

    def accept(self, seq_id: int, n_accepted: int) -> None:
        last = self._last.get(seq_id)
        if last is None:
            return
        self._last[seq_id] = None
        d, n_drafted = last
        t0 = time.perf_counter_ns()
        d.accept(seq_id, n_accepted)
        st = self.stats[d.name]
        st.t_accept_us += (time.perf_counter_ns() - t0) / 1e3
        st.record_accept(n_accepted, n_drafted)

    def end(self, seq_id: int) -> None:
        self._last.pop(seq_id, None)
        self._native.pop(seq_id, None)
        for d in self.drafters:
            d.end(seq_id)
