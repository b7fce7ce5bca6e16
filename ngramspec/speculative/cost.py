"""Cost model: the time of one llama_decode (acceptance statistics: acceptance.py).

A decode runs as the ubatches llama.cpp splits it into (`ubatch.py`), each a
graph of its own, so its time is modelled from that split:

    t = per_ubatch * ubatches + per_token * tokens (padding included)
        + per_logit * logit rows + per_kv * sum over tokens of (stream cells / 1000)
        + per_odd * ubatches with a ragged logit count (`ubatch.ragged`)
        + per_multi * ubatches with 2+ logit rows

On a 2-core CPU with Gemma 3 270M: ~9 ms per ubatch (weights streamed once per
graph), ~1.8 ms per token, ~1.2 ms more per logit row (the 262k-row output layer),
and ~8.5 ms once a ubatch has two logit rows or more: llama.cpp evaluates a single
logit row with vec_dot and several with llamafile's sgemm, whose setup over the
output layer costs that much (measured: 1 token 10.8 ms, 2 tokens with one logit
row 13.1 ms, with two 23.0 ms; 16 tokens with one 37.7 ms, with sixteen 64.4 ms).

Invariant: `DecodeCost.seconds` is positive and non-decreasing in every entry's tokens
(all coefficients are >= 0 and per_ubatch > 0).
"""
from __future__ import annotations

import ctypes as C
import functools
import json
import os
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

import numpy as np

from ..llama import ubatch
from . import native
from ..settings.paths import cache_dir

MAX_DRAFT = 64
#: what `DecodeCost.features` counts per decode, in the order of `DecodeCost.coef`
FEATURES = ("ubatches", "tokens", "logit rows", "token-kilocells", "ragged ubatches",
            "multi-logit ubatches")
#: `DecodeCost`'s coefficient fields, one per feature, in FEATURES' order
COEF_FIELDS = ("per_ubatch", "per_token", "per_logit", "per_kv", "per_odd", "per_multi")


class Shape(NamedTuple):
    """One entry of a decode: a sequence's tokens, how many want logits, its stream's cells
    (a named tuple: the engine makes one per sequence per step)."""

    seq_id: int
    n_tokens: int
    n_logits: int
    n_kv: int = 0


@functools.lru_cache(maxsize=16384)
def _fixed_features(entries: tuple, n_ubatch: int, per_seq_streams: bool, pad: bool,
                    quantum: int, lone_ok: bool, fixed_rows: int = 0
                    ) -> tuple[np.ndarray, tuple[int, ...]]:
    """(the features of a decode of `entries` = ((seq_id, n_tokens, n_logits), ...) with
    the KV term 0, each entry's tokens with its padding), laid out by `ubatch.layout`,
    remembered: the planner prices the same few shapes thousands of times a run (a
    layout does not depend on the cells or the coefficients). Read-only.

    `fixed_rows` (a fixed-shape context, llama/fixed_shape.py): each entry is decoded
    as ceil(n / fixed_rows) decodes of fixed_rows rows, all with logits, over the whole
    cache (no KV term: its size never changes), so a draft that fits costs nothing more."""
    if fixed_rows:
        n_dec = sum(-(-n // fixed_rows) for _, n, _ in entries)
        rows = n_dec * fixed_rows
        x = np.array([n_dec, rows, rows, 0.0, 0, n_dec if fixed_rows > 1 else 0])
        x.flags.writeable = False
        return x, (0,) * len(entries)
    fast = _native_features(entries, n_ubatch, pad, quantum, lone_ok) if per_seq_streams else None
    if fast is not None:
        return fast
    return _layout_features(entries, n_ubatch, per_seq_streams, pad, quantum, lone_ok)


def _layout_features(entries: tuple, n_ubatch: int, per_seq_streams: bool, pad: bool,
                     quantum: int, lone_ok: bool) -> tuple[np.ndarray, tuple[int, ...]]:
    """`_fixed_features` without fixed rows, by `ubatch.layout` (`_native_features`' reference)."""
    lay = ubatch.layout(list(entries), n_ubatch, per_seq_streams, pad=pad, quantum=quantum,
                        lone_ok=lone_ok)
    padded = tuple(n + lay.pads.get(s, 0) for s, n, _ in entries)
    odd = sum(1 for n in lay.logits if ubatch.ragged(n, quantum))
    multi = sum(1 for n in lay.logits if n >= 2)
    x = np.array([len(lay.ubatches), sum(padded), sum(lay.logits), 0.0, odd, multi])
    x.flags.writeable = False
    return x, padded


def _native_features(entries: tuple, n_ubatch: int, pad: bool, quantum: int,
                     lone_ok: bool) -> tuple[np.ndarray, tuple[int, ...]] | None:
    """`_layout_features` in C for one KV stream per sequence (drafting.c
    `ngs_layout_features`: ~6 us hot, not ~26), through buffers made once per thread (the
    call releases the GIL); None without the library, past native.MAX_ENTRIES entries, or
    where padding cannot keep a ubatch invariant (ubatch.py answers)."""
    lib = native.kernel()
    m = len(entries)
    if lib is None or m > native.MAX_ENTRIES:
        return None
    bufs = getattr(_NATIVE, "buffers", None)
    if bufs is None:  # entries (seq id, tokens, logit rows), features, padded
        bufs = _NATIVE.buffers = ((C.c_int32 * (3 * native.MAX_ENTRIES))(), (C.c_double * 6)(),
                                  (C.c_int32 * native.MAX_ENTRIES)())
    e, x, padded = bufs
    e[:3 * m] = [v for entry in entries for v in entry]
    if lib.ngs_layout_features(e, m, n_ubatch, pad, quantum, lone_ok, x, padded) != 0:
        return None
    out = np.array(x[:])
    out.flags.writeable = False
    return out, tuple(padded[:m])


_NATIVE = threading.local()  # `_native_features`' buffers


@functools.lru_cache(maxsize=64)
def _alone_features(*layout) -> tuple[np.ndarray, np.ndarray]:
    """(features, tokens with padding) of one sequence verifying 1..MAX_DRAFT+1 tokens
    with all logits, one row each (`DecodeCost.alone`)."""
    rows = [_fixed_features(((0, n, n),), *layout) for n in range(1, MAX_DRAFT + 2)]
    return np.array([x for x, _ in rows]), np.array([float(p[0]) for _, p in rows])


@dataclass(frozen=True)
class DecodeCost:
    """Seconds of one llama_decode, from the ubatches llama.cpp splits it into."""

    per_ubatch: float
    per_token: float
    per_logit: float
    per_kv: float = 0.0  # per token per 1000 cells of its stream
    per_odd: float = 0.0  # per ubatch with a ragged logit count (a second sgemm pass)
    per_multi: float = 0.0  # per ubatch with 2+ logit rows (the output layer's sgemm)
    per_seq_streams: bool = False  # the context's KV layout (decides the split)
    n_ubatch: int = 512
    pad: bool = True  # batch-invariant padding (ubatch.pads_needed)
    lone_ok: bool = False  # a lone token needs no padding row (Context.lone_ok)
    logit_quantum: int = 2  # sgemm columns per pass (model.logit_quantum)
    fixed_rows: int = 0  # rows of every decode of a fixed-shape context (0: none)

    def __post_init__(self) -> None:
        if self.per_ubatch <= 0 or min(self.per_token, self.per_logit, self.per_kv,
                                       self.per_odd, self.per_multi) < 0:
            raise ValueError(f"a decode cost needs a positive per-ubatch cost and no negative "
                             f"coefficient: {self}")

    def _fixed(self, entries: tuple) -> tuple[np.ndarray, tuple[int, ...]]:
        """`_fixed_features` of `entries` in this model's layout."""
        return _fixed_features(entries, self.n_ubatch, self.per_seq_streams, self.pad,
                               self.logit_quantum, self.lone_ok, self.fixed_rows)

    def features(self, shapes: Sequence[Shape]) -> np.ndarray:
        """(ubatches, tokens with padding, logit rows, token-kilocells, ragged-logit
        ubatches, multi-logit ubatches) of one decode, laid out as `Context.decode`
        lays it out."""
        shapes = [s for s in shapes if s.n_tokens > 0]
        x, padded = self._fixed(tuple((s.seq_id, s.n_tokens, s.n_logits) for s in shapes))
        x = x.copy()
        x[3] = sum(p * s.n_kv for p, s in zip(padded, shapes)) / 1000.0
        return x

    @property
    def coef(self) -> np.ndarray:
        """The coefficients in COEF_FIELDS' order (made once per model; read-only)."""
        c = self.__dict__.get("_coef")
        if c is None:
            c = self.__dict__["_coef"] = np.array([getattr(self, f) for f in COEF_FIELDS])
            c.flags.writeable = False
        return c

    def with_coef(self, coef: Sequence[float]) -> "DecodeCost":
        """The same layout with other coefficients (in COEF_FIELDS' order)."""
        return replace(self, **{f: float(c) for f, c in zip(COEF_FIELDS, coef)})

    def price(self, entries: tuple, kvs: Sequence[int]) -> float:
        """Seconds of a decode of `entries` ((seq_id, n_tokens, n_logits) each, n_tokens
        > 0) whose streams hold `kvs` cells: `seconds` without building Shapes (the
        planner's inner loop; the fixed part is remembered per model, in its __dict__:
        a refit makes a new model)."""
        memo = self.__dict__.setdefault("_memo", {})
        hit = memo.get(entries)
        if hit is None:
            x, padded = self._fixed(entries)
            s = 0.0  # left to right, as drafting.c's search prices (planner.py)
            for a, c in zip(x.tolist(), self.coef.tolist()):
                s += a * c
            hit = memo[entries] = (s, padded)
        return hit[0] + self.per_kv * sum(p * k for p, k in zip(hit[1], kvs)) / 1000.0

    def seconds(self, shapes: Sequence[Shape]) -> float:
        return float(self.features(shapes) @ self.coef)

    def alone(self) -> tuple[np.ndarray, np.ndarray, float]:
        """One sequence alone verifying 1 + K tokens, all logits, K = 0..MAX_DRAFT:
        (seconds without the KV term, tokens with padding, the least seconds an extra
        token adds: min over K >= 1 of (t[K] - t[0]) / K without the KV term, which only
        adds more). t[K] at n_kv cells = seconds[K] + per_kv * tokens[K] * n_kv / 1000.
        Computed once per model (the planner's closed form, `planner.plan`)."""
        memo = self.__dict__.setdefault("_memo", {})
        hit = memo.get("alone")
        if hit is None:
            x, tok = _alone_features(self.n_ubatch, self.per_seq_streams, self.pad,
                                     self.logit_quantum, self.lone_ok, self.fixed_rows)
            sec = x @ self.coef
            slope = float(np.min((sec[1:] - sec[0]) / np.arange(1, len(sec))))
            hit = memo["alone"] = (sec, tok, max(slope, 0.0))
        return hit

    def t(self, n: int, n_kv: int = 0) -> float:
        """One sequence verifying n tokens (all logits)."""
        return self.seconds([Shape(0, n, n, n_kv)])

    def table(self, k_max: int = MAX_DRAFT, n_kv: int = 0) -> np.ndarray:
        """t(K+1) for K = 0..k_max (one sequence alone)."""
        return np.asarray([self.t(k + 1, n_kv) for k in range(k_max + 1)])

    @classmethod
    def linear(cls, base_s: float, per_token_s: float) -> "DecodeCost":
        """A synthetic single-stream model t(n) = base + per_token * (n - 1), exactly
        (no padding) (tests)."""
        return cls(per_ubatch=base_s - per_token_s, per_token=0.0, per_logit=per_token_s,
                   pad=False)

    @classmethod
    def fit(cls, samples: Sequence[tuple[Sequence[Shape], float]], **layout) -> "DecodeCost":
        """Least squares over measured decodes, coefficients kept >= 0. A feature the
        samples do not determine (never observed, or a combination of the others, as
        "2+ logit rows" is when every sample had them) keeps 0, so the model does not
        extrapolate it to decodes unlike the samples."""
        probe = cls(1.0, 0.0, 0.0, **layout)
        x = np.array([probe.features(sh) for sh, _ in samples])
        y = np.array([sec for _, sec in samples])
        n = x.shape[1]
        active = [bool(x[:, i].any()) for i in range(n)]  # unobserved features stay 0
        # features the samples cannot tell apart stay 0 too, the later ones first (e.g.
        # "2+ logit rows" when every sample had them, which is then the per-ubatch cost)
        for i in range(n - 1, 0, -1):
            cols = [j for j in range(n) if active[j]]
            if np.linalg.matrix_rank(x[:, cols]) == len(cols):
                break
            active[i] = False
        coef = _nonneg_lstsq(x, y, np.ones(len(y)), active)
        return cls(*[float(c) for c in coef], **layout)


# ------------------------------------------------------------------ calibration


def cache_path() -> Path:
    """decode_cost.json in the cache folder (paths.cache_dir)."""
    return cache_dir() / "decode_cost.json"


def calibration_shapes(per_seq_streams: bool, n_seq: int = 4,
                       n_ctx_seq: int = 4096, n_batch: int = 512,
                       pad: bool = True) -> list[list[Shape]]:
    """Decodes measured to fit a DecodeCost: one stream at several sizes, with and
    without logits, with and without context; with one stream per sequence also
    several streams and decodes llama.cpp splits into two ubatches. Every shape
    fits a sequence of n_ctx_seq cells and n_seq sequences, and one decode of n_batch
    tokens (`fits_batch`, with padding when `pad`)."""
    sizes = [n for n in (1, 2, 4, 8, 32, 63) if n < n_ctx_seq]
    shapes = [[Shape(0, n, n)] for n in sizes]
    shapes += [[Shape(0, n, 1)] for n in (4, 16, 63) if n < n_ctx_seq]
    kv = min(1024, (n_ctx_seq - 64) // 64 * 64)
    if kv >= 256:
        shapes += [[Shape(0, n, n, kv)] for n in (2, 32)]
    k = min(n_seq, 4)
    if per_seq_streams and k >= 2 and n_ctx_seq > 16:
        shapes += [[Shape(s, 1, 1) for s in range(k)],
                   [Shape(0, 9, 9)] + [Shape(s, 1, 1) for s in range(1, k)],
                   [Shape(0, 2, 2), Shape(1, 5, 5)]]
        if k >= 3:  # an odd logit count no padding row can even out
            shapes += [[Shape(s, 1, 1) for s in range(3)], [Shape(s, 3, 3) for s in range(3)]]
    return [sh for sh in shapes if fits_batch(sh, n_batch, pad)]


def fits_batch(shapes: Sequence[Shape], n_batch: int, pad: bool = True) -> bool:
    """Whether one decode of `shapes` fits a batch of n_batch tokens, counting the one
    padding token a batch-invariant context (`pad`) may add per sequence."""
    return sum(s.n_tokens + pad for s in shapes) <= n_batch


Sample = tuple[Sequence[Shape], float]  # one measured decode: its entries, its seconds


#: the curve measured for Gemma 3 270M Q4_K_M on 2 cores (AVX-512), one stream, with
#: llama.cpp's output layer (vec_dot for one logit row, sgemm passes for several: the
#: per_multi and per_odd terms): the prior of a model that has no cached curve yet, where
#: that layer runs; refitted to the run's first decodes (CostTracker)
DEFAULT_COEF = {"per_ubatch": 0.0092, "per_token": 0.0015, "per_logit": 0.0017,
                "per_kv": 0.0012, "per_odd": 0.020, "per_multi": 0.0085}
#: the same measured with ngramspec's output layer on every logit row (kernels/head.py;
#: AMD Zen 5, 2 cores, `calibrate` over `calibration_shapes`): no pass structure, so a
#: second row costs 1.24x of one instead of 1.9x; the prior where that layer runs
OWN_HEAD_COEF = {"per_ubatch": 0.0056, "per_token": 0.00069, "per_logit": 0.0011,
                 "per_kv": 0.00077, "per_odd": 0.0, "per_multi": 0.0}


@dataclass(frozen=True)
class Calibration:
    """The decode-cost model a run starts from, and how it was obtained.

    source: "cache" (the cached curve), "default" (no cached curve: the prior;
    `save` then writes the curve the run has learnt to the cache, once: CostPolicy
    calls it after SAVE_AFTER decodes) or "measured" (`refresh`: measured in full and
    cached). Either way the run refines its curve from its own decodes (CostTracker)."""

    cost: DecodeCost
    source: str
    seconds: float  # wall time spent on it (reading the cache, or measuring in full)
    save: Callable[[DecodeCost], None] | None = None


def calibrate(measure: Callable[[Sequence[Shape]], float], layout: dict,
              shapes: Sequence[Sequence[Shape]], repeats: int = 3) -> DecodeCost:
    """Fit a DecodeCost to `measure(shapes)` = seconds of one decode (the minimum of
    `repeats` runs: the least disturbed one)."""
    samples = [(sh, min(measure(sh) for _ in range(repeats))) for sh in shapes]
    return DecodeCost.fit(samples, **layout)


def _read_cache(path: Path) -> dict:
    try:
        return json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        return {}


def save_curve(key: str, cost: DecodeCost, replace: bool = True) -> None:
    """Write `cost` as the cached curve of `key` (with replace=False only if the cache
    has none yet, e.g. another process wrote one meanwhile). A read-only cache folder
    only costs the next run its default start."""
    path = cache_path()
    data = _read_cache(path)
    if not replace and key in data:
        return
    coef = {k: v for k, v in asdict(cost).items() if k.startswith("per_") and k != "per_seq_streams"}
    data[key] = {"coef": coef, "measured_at": time.time()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)
    except OSError:
        pass


def load_or_calibrate(key: str, measure: Callable[[Sequence[Shape]], float], layout: dict,
                      n_seq: int = 4, n_ctx_seq: int = 4096, refresh: bool = False,
                      n_batch: int = 512, prior: dict[str, float] = DEFAULT_COEF) -> Calibration:
    """The cost model for `key` (model file + size + threads + kernels + KV layout).

    Invariants: nothing is measured on the caller's critical path (a blocking
    re-check flapped on timing noise and cost more than the generation it was for;
    even two probe decodes cost a start-up 0.1-0.5 s on a busy 2-core machine): the
    run starts from the cached curve, or from `prior` (DEFAULT_COEF, or OWN_HEAD_COEF where
    ngramspec's output layer runs) when none is cached (then
    the curve the run learns is cached once, `Calibration.save`), and its own decodes
    refine the curve within the run (CostTracker; its first refits after
    CostTracker.FIRST_REFITS decodes). Only `refresh` measures every calibration shape
    and rewrites the entry; every decode it measures fits n_batch."""
    t0 = time.perf_counter()
    if refresh:
        shapes = calibration_shapes(layout.get("per_seq_streams", False), n_seq, n_ctx_seq,
                                    n_batch, layout.get("pad", True))
        cost = calibrate(measure, layout, shapes)
        save_curve(key, cost)
        return Calibration(cost, "measured", time.perf_counter() - t0)
    entry = _read_cache(cache_path()).get(key)
    if entry is not None:
        try:
            return Calibration(DecodeCost(**entry["coef"], **layout), "cache",
                               time.perf_counter() - t0)
        except (KeyError, TypeError, ValueError):
            pass
    return Calibration(DecodeCost(**prior, **layout), "default", time.perf_counter() - t0,
                       save=lambda cost: save_curve(key, cost, replace=False))


def _nonneg_lstsq(x: np.ndarray, y: np.ndarray, w: np.ndarray,
                  active: list[bool] | None = None) -> np.ndarray:
    """Weighted least squares over the `active` columns (default: every column some row
    uses), coefficients kept >= 0 (`nonneg_active_set`)."""
    sw = np.sqrt(w)[:, None]
    if active is None:
        active = [bool(x[:, i].any()) for i in range(x.shape[1])]
    return nonneg_active_set(
        active, lambda cols: np.linalg.lstsq(x[:, cols] * sw, y * sw[:, 0], rcond=None)[0])


def nonneg_active_set(active: Sequence[bool], solve: Callable[[list[int]], np.ndarray]
                      ) -> np.ndarray:
    """Coefficients from `solve(columns)` (a least-squares solution over those columns)
    with every coefficient >= 0: a negative one leaves the fit and it is solved again;
    the first (per-ubatch) is kept > 0. Columns not `active` stay 0."""
    active = list(active)
    coef = np.zeros(len(active))
    for _ in range(len(active)):
        cols = [i for i, on in enumerate(active) if on]
        coef[:] = 0
        coef[cols] = solve(cols)
        neg = [i for i in cols if coef[i] < 0 and i != 0]
        if not neg:
            break
        for i in neg:
            active[i] = False
    coef[0] = max(coef[0], 1e-4)
    return coef


# ------------------------------------------------------------------ a context's curve


def _measure_on(ctx, scratch: dict[int, int]) -> Callable[[Sequence[Shape]], float]:
    """`measure(shapes)`: seconds of one decode of `shapes` in `ctx` on scratch content.
    The sequences must be free; each keeps its n_kv scratch cells (recorded in
    `scratch`) for the next measurement; the caller clears them. Scratch content is
    decoded in chunks of at most n_batch."""
    rng = np.random.default_rng(0)
    chunk = min(512, ctx.n_batch)

    def measure(shapes: Sequence[Shape]) -> float:
        for s in shapes:
            if scratch.get(s.seq_id, 0) != s.n_kv:
                ctx.clear(s.seq_id)
                for p in range(0, s.n_kv, chunk):
                    n = min(chunk, s.n_kv - p)
                    ctx.run_rows([(s.seq_id, rng.integers(1000, 20000, n), p, False)], {})
                scratch[s.seq_id] = s.n_kv
        entries = [(s.seq_id, rng.integers(1000, 20000, s.n_tokens), s.n_kv,
                    s.n_logits == s.n_tokens) for s in shapes]
        ctx.decode(entries)
        for s in shapes:
            ctx.truncate(s.seq_id, s.n_kv)
        return ctx.compute_s  # timed as the run's decodes are (Context.compute_s)
    return measure


def _kernel_key(ctx) -> str:
    """The cost key's part for the context's kernels: ":<name>=<scope>" for each active
    one (kernels.KERNELS order; "own", or "q5_0" for a matmul that leaves the K-quants to
    llama.cpp), then each instruction-set variant other than AVX2 in use. Not the output
    layer's one-row choice (`Hook.choose_one_row`): it is timed per context and flips
    between starts only where both ways cost about the same, and a key that flipped with
    it made a start miss the curve the run before had cached (test_calibration)."""
    states = ctx.kernels.state() if hasattr(ctx, "kernels") else {}  # {}: a stand-in
    return ("".join(f":{n}={st.get('scope', 'own')}" for n, st in states.items() if st["active"])
            + "".join(sorted({f":{st['variant']}" for st in states.values()
                              if st["active"] and st["variant"] != "avx2"})))


def _backend_key(ctx) -> str:
    """The cost key's part for the backend: the devices llama.cpp has besides the CPU
    (a CUDA, Vulkan or Metal build prices decodes differently even at -ngl 0, where
    large matmuls may still be offloaded) and the layers offloaded. Empty on a CPU build
    (the CPU's curve keeps its key)."""
    from ..llama.kernels import guard

    devices = [name for name, kind in guard.devices() if kind != "CPU"]
    if not devices:
        return ""
    ngl = getattr(getattr(ctx, "model", None), "n_gpu_layers", 0)
    return f":devices={'+'.join(devices)}:ngl={ngl}"


def calibrate_context(model_path: Path, ctx, refresh: bool = False) -> Calibration:
    """The decode-cost model of a context (`llama.context.Context`): its model file, layout and
    thread count (cached; `load_or_calibrate`), with the time it took. Decodes nothing
    unless `refresh`; then it measures on the context's sequences, which must be free
    (no engine's cached prompt in them), and clears them after (a warm-up decode
    first: the first decodes allocate buffers)."""
    t0 = time.perf_counter()
    layout = ctx.cost_layout
    kv = (ctx.params.type_k, ctx.params.type_v)
    # model=v4: the output layer is ours on one-row decodes too (kernels/head.py), so
    # a curve learnt before prices spec-off's decode wrong
    key = (f"{model_path.resolve()}:{model_path.stat().st_size}:threads={ctx.params.n_threads}:"
           f"invariant={ctx.invariant}:streams={ctx.per_seq_streams}:model=v4"
           + ("" if kv == ("f16", "f16") else f":kv={kv[0]}/{kv[1]}")
           + _kernel_key(ctx) + _backend_key(ctx)
           + (f":rows={ctx.fixed_rows}" if ctx.fixed_rows else ""))
    scratch: dict[int, int] = {}
    measure = _measure_on(ctx, scratch)
    try:
        if refresh:
            warm = min(8, ctx.n_batch - ctx.invariant)
            measure([Shape(0, warm, warm)])
        head = getattr(ctx, "head", None)
        prior = OWN_HEAD_COEF if head is not None and head.active else DEFAULT_COEF
        cal = load_or_calibrate(key, measure, layout, ctx.params.n_seq_max, ctx.n_ctx_seq,
                                refresh=refresh, n_batch=ctx.n_batch, prior=prior)
        return replace(cal, seconds=time.perf_counter() - t0)
    finally:
        for seq_id in scratch:
            ctx.clear(seq_id)
