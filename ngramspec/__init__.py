"""ngramspec: draftless (n-gram) speculative decoding for llama.cpp runtimes."""
from .config import SPEC_TYPES, NgramMapParams, NgramModParams, SpecConfig, parse_spec_types
from .drafters import Drafter, DrafterChain, make_drafter
from .errors import ConfigError, NgramSpecError, TokenError
from .pool import HashPool

__version__ = "0.1.0"
__all__ = ["ConfigError", "Drafter", "DrafterChain", "HashPool", "NgramMapParams",
           "NgramModParams", "NgramSpecError", "SPEC_TYPES", "SpecConfig", "TokenError",
           "make_drafter", "parse_spec_types"]
