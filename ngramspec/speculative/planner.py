"""The batch planner: every sequence's draft length for one decode, chosen together.

Objective (cost-aware policies): the tokens all sequences are expected to emit,
divided by the modelled time of the whole decode,

    sum_i E_i[tokens | K_i] / t(decode with 1 + K_i tokens for sequence i)

where t comes from `DecodeCost` and so counts llama.cpp's ubatch split, the
batch-invariant padding and every logit row. Drafts are worth it when they raise
the batch's tokens per second, not one sequence's: a draft that makes llama.cpp
split the decode into another ubatch pays for that ubatch.

Search: coordinate ascent from "no drafts". Each sequence in turn tries no draft,
its longest draft, the length that pays best for it alone and the other sequences'
current lengths (equal lengths share ubatches), keeping any change that raises the
objective, until a round changes nothing; each plan is priced once. The search runs in C
(drafting.c `ngs_ascend`: the same arithmetic in the same order, so the same lengths) where
the context has one KV stream per sequence and the library is loaded, else here. A decode
of one sequence is solved in closed form instead: every length priced at once from the
model's per-length table, after a bound that says "no draft" without pricing anything
(`_alone`); that is exactly `acceptance.best_length` (llama.cpp's single-slot case with
cost).

Invariants: K_i <= the sequence's options and its per-sequence row limit; the
total stays within `total_max`; the fixed policy takes each draft whole, in order,
while the budget lasts (llama.cpp's behaviour).
"""
from __future__ import annotations

import ctypes as C
import threading
from typing import Sequence

import numpy as np

from . import native
from .cost import DecodeCost, Shape
from .speculation import DraftOptions

MAX_ROUNDS = 4


def plan(options: Sequence[DraftOptions], base: Sequence[Shape], cost: DecodeCost | None,
         per_seq_max: int, total_max: int, trust: float = 1.0) -> list[int]:
    """Draft length per sequence. `base[i]` is sequence i's entry without a draft
    (its sampled token: 1 token, 1 logit row, its stream's cells). `trust` (<= 1, the
    policy's DraftTrust factor): a plan with drafts is kept only if its objective
    times `trust` beats no drafts."""
    caps = [max(0, min(o.k_max, per_seq_max - s.n_tokens)) for o, s in zip(options, base)]
    budget = total_max - sum(s.n_tokens for s in base)
    if cost is None or all(o.fixed for o in options):
        ks = []
        for cap in caps:
            k = max(0, min(cap, budget))
            budget -= k
            ks.append(k)
        return ks
    if len(options) == 1:
        return [_alone(options[0], base[0], cost, min(caps[0], budget), trust)]
    ks = _native_ascend(options, base, cost, caps, budget, trust)
    return ks if ks is not None else _ascend(options, base, cost, caps, budget, trust)


def _alone(opt: DraftOptions, base: Shape, cost: DecodeCost, cap: int, trust: float) -> int:
    """One sequence in the decode: every length priced at once from the model's table
    (`DecodeCost.alone`), the best rate E[tokens | K] / t(1 + K) kept if `trust` times
    it beats plain decoding. Before pricing: E[K] - 1 <= K * (E[1] - 1) (each further
    token is accepted with the chances of all before it), and t(1 + K) >= t(1) + K *
    slope, so when (E[1] - 1) * t(1) <= slope no length can beat plain decoding. In C
    where the library is loaded (drafting.c `ngs_alone`: the same arithmetic, the same
    length; tests/test_planner.py)."""
    e = opt.expected
    k_top = min(cap, len(e) - 1) if e is not None else 0
    if k_top <= 0:
        return 0
    lib, at = native.kernel(), opt.at  # at: the sequence's table (no `.ctypes.data` to take)
    if lib is not None and (at or (e.dtype == np.float64 and e.flags.c_contiguous)):
        _, sec, tok, slope = _native_model(cost)  # drafting.c's ngs_alone: the same lengths
        return lib.ngs_alone(at or e.ctypes.data, k_top, sec, tok, slope, cost.per_kv,
                             base.n_kv, trust)
    sec, tok, slope = cost.alone()
    if (e[1] - 1.0) * (sec[0] + cost.per_kv * base.n_kv / 1000.0 * tok[0]) <= slope:
        return 0
    rate = _alone_rates(e, cost, base.n_kv, k_top)
    k = int(np.argmax(rate))
    return k if rate[k] * trust > rate[0] * (1 + 1e-9) else 0


def _alone_rates(e: np.ndarray, cost: DecodeCost, n_kv: int, k_top: int) -> np.ndarray:
    """E[tokens | K] / t(1 + K) for K = 0..k_top of a sequence alone in a decode whose
    stream holds n_kv cells (`DecodeCost.alone`'s table plus the KV term)."""
    sec, tok, _ = cost.alone()
    kv = cost.per_kv * n_kv / 1000.0
    return e[:k_top + 1] / (sec[:k_top + 1] + kv * tok[:k_top + 1])


def _best_alone(e: np.ndarray, cost: DecodeCost, n_kv: int, cap: int) -> int:
    """The length K <= cap with the best rate E[tokens | K] / t(1 + K) for the sequence
    alone (`_alone_rates`): where its own drafts pay most."""
    return int(np.argmax(_alone_rates(e, cost, n_kv, min(cap, len(e) - 1))))


def _ascend(options, base, cost: DecodeCost, caps: list[int], budget: int,
            trust: float) -> list[int]:
    """Coordinate ascent (module docstring) over the sequences that pass the bound: a
    sequence i can raise the batch's rate r >= r0 (the plain decode's: the ascent keeps
    only raises) only if (E_i[1] - 1) > r0 * slope, since E_i[K] - 1 <= K * (E_i[1] - 1)
    and K more tokens add at least K * slope seconds (slope: `DecodeCost.alone`'s least
    per-token cost, the marginal row of a batch priced as one sequence's); the others
    keep K = 0 without being priced. A sequence tries 0, its cap, its best length alone
    (`_best_alone`) and the others' current lengths (equal lengths share ubatches); a
    decode of one sequence tries every length. Each plan is priced once per call."""
    ks = [0] * len(options)
    if not any(caps):
        return ks
    kvs = [s.n_kv for s in base]
    priced: dict[tuple, float] = {}

    def price() -> float:
        key = tuple(ks)
        t = priced.get(key)
        if t is None:
            t = priced[key] = cost.price(tuple((b.seq_id, b.n_tokens + k, b.n_logits + k)
                                               for b, k in zip(base, ks)), kvs)
        return t

    gain = [float(o.expected[0]) if o.expected is not None else 1.0 for o in options]
    total = sum(gain)
    best = plain = total / price()
    slope = cost.alone()[2]
    active = [i for i, c in enumerate(caps)
              if c > 0 and options[i].expected[1] - options[i].expected[0] > plain * slope]
    own = {i: {0, caps[i], _best_alone(options[i].expected, cost, base[i].n_kv, caps[i])}
           for i in active} if len(options) > 1 else {}
    for _ in range(MAX_ROUNDS if active else 0):
        changed = False
        for i in active:
            e, was = options[i].expected, ks[i]
            room = budget - (sum(ks) - was)
            cands = sorted(own[i] | {ks[j] for j in active}) if own else range(
                min(caps[i], room) + 1)
            pick = was
            for k in cands:
                if k == was or k > caps[i] or k > room:
                    continue
                ks[i] = k
                r = (total - gain[i] + e[k]) / price()
                if r > best * (1 + 1e-9):
                    best, pick = r, k
            ks[i] = pick
            if pick != was:
                total += e[pick] - gain[i]
                gain[i] = float(e[pick])
                changed = True
        if not changed:
            break
    return ks if best * trust > plain else [0] * len(ks)


_BUFS = threading.local()  # `_native_ascend`'s ctypes buffers, made once per thread


def _native_ascend(options, base, cost: DecodeCost, caps: list[int], budget: int,
                   trust: float) -> list[int] | None:
    """`_ascend` by drafting.c's `ngs_ascend` (candidates in ascending order, as here), or
    None where C does not apply (no library, a shared KV stream or a fixed-shape context,
    more than native.MAX_ENTRIES entries, a layout C declines): then `_ascend` answers."""
    lib = native.kernel()
    m = len(base)
    if lib is None or not cost.per_seq_streams or cost.fixed_rows or m > native.MAX_ENTRIES:
        return None
    b = getattr(_BUFS, "b", None)
    if b is None:
        n = native.MAX_ENTRIES
        b = _BUFS.b = ((C.c_int32 * n)(), (C.c_int32 * n)(), (C.c_int32 * n)(),
                       (C.c_int64 * n)(), (C.c_void_p * n)(), (C.c_int32 * n)(),
                       (C.c_int32 * n)(), (C.c_int32 * n)())
    ids, n_tok, n_log, kv, exp, lens, cap, ks = b
    ids[:m] = [s.seq_id for s in base]
    n_tok[:m] = [s.n_tokens for s in base]
    n_log[:m] = [s.n_logits for s in base]
    kv[:m] = [s.n_kv for s in base]
    arrays = [None if o.expected is None or o.at else  # a sequence's table: its address
              np.ascontiguousarray(o.expected, dtype=np.float64) for o in options]
    exp[:m] = [o.at or (None if a is None else a.ctypes.data) for o, a in zip(options, arrays)]
    lens[:m] = [0 if o.expected is None else len(o.expected) for o in options]
    cap[:m] = caps
    coef, sec, tok, slope = _native_model(cost)
    if lib.ngs_ascend(ids, n_tok, n_log, kv, m, exp, lens, cap, budget, coef, cost.per_kv,
                      cost.n_ubatch, cost.pad, cost.logit_quantum, cost.lone_ok, sec, tok,
                      slope, trust, MAX_ROUNDS, ks) != 0:
        return None
    return ks[:m]


def _native_model(cost: DecodeCost) -> tuple[int, int, int, float]:
    """The addresses of `cost`'s coefficients and `DecodeCost.alone`'s table (seconds,
    tokens), and its slope, remembered per model (the arrays live as long as it)."""
    memo = cost.__dict__.setdefault("_memo", {})
    hit = memo.get("native")
    if hit is None:
        sec, tok, slope = cost.alone()
        hit = memo["native"] = (cost.coef.ctypes.data, sec.ctypes.data, tok.ctypes.data, slope)
    return hit
