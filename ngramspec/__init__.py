"""ngramspec: draftless (n-gram) speculative decoding for llama.cpp runtimes."""
import os as _os

# Batch invariance (docs/exactness.md) needs ggml's tiled K-quant matmul off. ggml
# reads this once per process at the first matmul, so it is set as early as
# possible: importing ngramspec before llama.cpp evaluates anything is enough.
_os.environ.setdefault("GGML_CPU_TILED_MM", "0")
# llama.cpp's library is mapped before numpy or any other extension module: a CUDA build
# crashes at model load otherwise (llama/library.py). Keep this the first import.
from .llama import library as _library

_library.load_first()
from .settings.config import (
    SPEC_TYPES,
    NgramMapParams,
    NgramModParams,
    SpecConfig,
    parse_spec_types,
)
from .speculative.drafters import Drafter, DrafterChain, make_drafter
from .errors import ConfigError, NgramSpecError, TokenError
from .speculative.pool import HashPool

__version__ = "0.1.0"
__all__ = ["ConfigError", "Drafter", "DrafterChain", "HashPool", "NgramMapParams",
           "NgramModParams", "NgramSpecError", "SPEC_TYPES", "SpecConfig", "TokenError",
           "make_drafter", "parse_spec_types"]
