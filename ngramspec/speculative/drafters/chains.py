"""The chains of one engine: a DrafterChain per SpecConfig in use, on one pool.

Invariants:
- Chains for equal configs are one object; a drafter with given parameters exists
  once (`drafter_keys`), so ngram-mod's table is one table for every sequence.
- At most MAX_CONFIGS chains and drafters are kept (oldest evicted): a sequence keeps
  its own chain object, and a re-created drafter with the same parameters reads the
  same pool entries, so eviction never costs correctness.
- Every chain counts into one stats dict (per drafter name), so `stats()` is monotonic
  and eviction loses no count.
- The draft-model drafter, if any, is the last link of every chain (draftless first).
"""
from __future__ import annotations

from ...settings.config import SpecConfig
from ..pool import HashPool
from ..stats import DrafterStats
from .base import Drafter
from .chain import DrafterChain, drafter_keys, make_drafter_for

MAX_CONFIGS = 64


class Chains:
    """The cache of chains (see the module docstring)."""

    def __init__(self, pool: HashPool, draft_drafter: Drafter | None = None):
        self.pool, self.draft_drafter = pool, draft_drafter
        self._drafters: dict[tuple, Drafter] = {}
        self._chains: dict[SpecConfig, DrafterChain] = {}
        self._stats: dict[str, DrafterStats] = {}

    def get(self, cfg: SpecConfig) -> DrafterChain:
        """The chain for `cfg`, built from shared drafter instances."""
        chain = self._chains.get(cfg)
        if chain is None:
            for cache in (self._chains, self._drafters):
                while len(cache) >= MAX_CONFIGS:
                    del cache[next(iter(cache))]
            drafters = []
            for key in drafter_keys(cfg):
                if key not in self._drafters:
                    self._drafters[key] = make_drafter_for(key, self.pool)
                drafters.append(self._drafters[key])
            if self.draft_drafter is not None:
                drafters.append(self.draft_drafter)
            chain = self._chains[cfg] = DrafterChain(cfg, self.pool, drafters, self._stats)
        return chain

    def stats(self) -> dict[str, DrafterStats]:
        """llama.cpp-style counters per drafter, over every chain this engine has used
        (monotonic). Safe to call from another thread while the engine drafts: it returns
        copies (a count may be one step behind)."""
        out: dict[str, DrafterStats] = {}
        for name, st in list(self._stats.items()):
            out[name] = DrafterStats(name)
            out[name].add(st)
        return out
