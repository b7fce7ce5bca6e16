"""The chains of one engine: a DrafterChain per SpecConfig in use, on one pool.

Invariants:
- Chains for equal configs are one object; a drafter with given parameters exists
  once (`drafter_keys`), so ngram-mod's table is one table for every sequence.
- At most MAX_CONFIGS chains and drafters are kept (oldest evicted): a sequence keeps
  its own chain object, and a re-created drafter with the same parameters reads the
  same pool entries, so eviction only costs per-request statistics, never correctness.
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
            chain = self._chains[cfg] = DrafterChain(cfg, self.pool, drafters)
        return chain

    def stats(self) -> dict[str, DrafterStats]:
        """llama.cpp-style counters per drafter, summed over every chain kept. Safe to
        call from another thread while the engine drafts (it reads copies of the dicts;
        a count may be one step behind)."""
        total: dict[str, DrafterStats] = {}
        for chain in list(self._chains.values()):
            for name, st in list(chain.stats.items()):
                acc = total.setdefault(name, DrafterStats(name))
                for k, v in list(st.__dict__.items()):
                    if k == "acc_per_pos":
                        acc.acc_per_pos += [0] * (len(v) - len(acc.acc_per_pos))
                        for i, x in enumerate(v):
                            acc.acc_per_pos[i] += x
                    elif k != "name":
                        setattr(acc, k, getattr(acc, k) + v)
        return total
