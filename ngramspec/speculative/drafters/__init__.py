"""Draftless drafters: llama.cpp's four n-gram methods behind one protocol."""
from .base import EMPTY, Drafter, as_token, as_tokens, common_prefix
from .chain import REGISTRY, DrafterChain, make_drafter
from .ngram_map import NgramMapK, NgramMapK4V, dominant, value_counts
from .ngram_mod import NgramMod
from .ngram_simple import NgramSimple

__all__ = ["EMPTY", "Drafter", "DrafterChain", "NgramMapK", "NgramMapK4V", "NgramMod",
           "NgramSimple", "REGISTRY", "as_token", "as_tokens", "common_prefix", "dominant", "make_drafter",
           "value_counts"]
