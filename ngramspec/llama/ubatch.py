"""How llama.cpp splits one llama_decode into ubatches, and the padding that keeps
every ubatch batch-invariant (docs/exactness.md).

llama.cpp evaluates a batch as one or more *ubatches*, each a separate graph:
- one KV stream (a unified cache; our single-sequence contexts): `split_simple`,
  consecutive tokens in batch order, at most n_ubatch per ubatch;
- one stream per sequence (our multi-slot contexts): `split_equal` with
  sequential seq ids. A ubatch takes a run of consecutive seq ids, starting with
  the sequence of the first unused token, and the same number of tokens from each:
  as many as the shortest of them has left.

So a decode of [3, 2, 2, 2] tokens for sequences 0..3 runs as {0..3: 2 each} and
then {0: 1}: sequence 0's last token alone. A lone token takes other kernels than
a token among others (flash attention's split-KV path for one query of one stream,
with an F16 K and V cache; `lone_token_invariant` says where it cannot), so its
logits differ from plain decoding.

Invariants (checked by `invariant_violation`, guaranteed by `pads_needed`):
- U1: no ubatch holds exactly one token, unless the context's kernels treat a lone
  token as one among others (`lone_ok`: no split-KV path, no float-weight sgemm);
- U2: no stream holds 64 or more tokens in one ubatch (flash attention's tiled
  path starts at 64 query rows of one stream).
This module is pure (no llama.cpp): the split is a function of the batch's token
order, which `Context.decode` builds as each entry's tokens followed by its pads,
entries in ascending seq id.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Sequence

#: flash attention takes a tiled kernel at this many query rows of one stream
FA_TILE_ROWS = 64


@dataclass(frozen=True)
class Ubatch:
    """One ubatch: tokens taken per sequence (equal for every sequence in a split_equal ubatch)."""

    take: tuple[tuple[int, int], ...]  # (seq_id, tokens), in order

    @property
    def n_tokens(self) -> int:
        return sum(n for _, n in self.take)

    @property
    def max_per_stream(self) -> int:
        return max(n for _, n in self.take)


def split_equal(lengths: Sequence[tuple[int, int]], n_ubatch: int) -> list[Ubatch]:
    """llama.cpp's split_equal(n_ubatch, sequential=True) for a batch laid out as
    `Context.decode` lays it out: entries in ascending seq id, each entry's tokens
    contiguous (llama-batch.cpp; tests/test_ubatch.py checks it against a
    token-by-token port).

    A ubatch starts at the first entry with tokens left and extends over the
    following entries while their seq ids are consecutive and they have tokens
    left; it takes from each as many tokens as the shortest of them has left,
    at most max(1, n_ubatch // entries) each. (Index loops: the planner prices
    layouts it has not seen by the thousand, `cost._fixed_features`.)
    """
    ids = [s for s, _ in lengths]
    rem = [n for _, n in lengths]
    m, first, out = len(rem), 0, []
    while True:
        while first < m and rem[first] <= 0:  # rem only falls: the first never moves back
            first += 1
        if first == m:
            return out
        end, take = first + 1, rem[first]
        while end < m and rem[end] > 0 and ids[end] == ids[end - 1] + 1 and end - first <= n_ubatch:
            take = min(take, rem[end])
            end += 1
        take = min(take, max(1, n_ubatch // (end - first)))
        for j in range(first, end):
            rem[j] -= take
        out.append(Ubatch(tuple((ids[j], take) for j in range(first, end))))


def split_simple(lengths: Sequence[tuple[int, int]], n_ubatch: int) -> list[Ubatch]:
    """llama.cpp's split_simple: consecutive tokens in batch order, n_ubatch at a time."""
    out: list[Ubatch] = []
    cur: list[tuple[int, int]] = []
    room = n_ubatch
    for s, n in lengths:
        while n > 0:
            k = min(n, room)
            cur.append((s, k))
            n, room = n - k, room - k
            if room == 0:
                out.append(Ubatch(tuple(cur)))
                cur, room = [], n_ubatch
    if cur:
        out.append(Ubatch(tuple(cur)))
    return out


def split(lengths: Sequence[tuple[int, int]], n_ubatch: int,
          per_seq_streams: bool) -> tuple[Ubatch, ...]:
    """The ubatches llama.cpp forms for entries (seq_id, n_tokens) in batch order
    (ascending seq ids when per_seq_streams). Remembered (`_split`): `pads_needed` and
    `layout` split the same lengths in turn, and the planner prices layouts by the
    thousand (`cost._fixed_features`); the tuple is shared, read-only."""
    return _split(tuple((s, n) for s, n in lengths if n > 0), n_ubatch, per_seq_streams)


@functools.lru_cache(maxsize=4096)
def _split(lengths: tuple[tuple[int, int], ...], n_ubatch: int,
           per_seq_streams: bool) -> tuple[Ubatch, ...]:
    return tuple((split_equal if per_seq_streams else split_simple)(lengths, n_ubatch))


#: llama.cpp casts an F32 K or V cache to F16 before flash attention (llama-graph.cpp)
_FA_TYPE = {"f32": "f16"}


def f16_attention(type_k: str, type_v: str) -> bool:
    """Whether flash attention sees an F16 K and an F16 V (after the F32 cast): the
    pair whose single query row takes the split-KV path."""
    return _FA_TYPE.get(type_k, type_k) == "f16" == _FA_TYPE.get(type_v, type_v)


#: weight types llamafile's sgemm takes through float FMA tiles on x86 (a 1-column
#: matmul goes through vec_dot instead, in another summation order)
FLOAT_WEIGHTS = frozenset({"f32", "f16", "bf16"})


def lone_token_invariant(type_k: str, type_v: str,
                         weight_types: Callable[[], frozenset[str] | None],
                         reference_attention: bool = False) -> bool:
    """Whether a token alone in a ubatch is computed exactly as among other rows, so
    rule U1 needs no padding row. ggml's flash attention splits one query's KV range
    over the threads (another summation order) only for a single query row of a single
    stream whose K is F16 and V of K's type (ops.cpp), so a K/V pair that is not F16/F16
    after llama.cpp's F32->F16 cast never takes it; the matmuls of a quantized weight
    (vec_dot for one column, tinyBLAS' Q0 kernels or vec_dot for several) give each
    column the same values, measured on Gemma 3 (Q4_K/Q6_K/Q8_0/Q5_0) and SmolLM2
    (Q4_1), but a float weight goes through sgemm's FMA tiles for 2+ columns only.
    `reference_attention`: the context's CPU backend computes flash attention on its
    reference path (ref_attention.py), which never splits, whatever the K/V pair.
    `weight_types()`: the model's matrix types (None: unknown, so not invariant), asked
    only when the split is ruled out."""
    if f16_attention(type_k, type_v) and not reference_attention:
        return False
    types = weight_types()
    return types is not None and not types & FLOAT_WEIGHTS


def invariant_violation(ubatches: Sequence[Ubatch], lone_ok: bool = False) -> str | None:
    """Why this split is not batch-invariant (U1/U2), or None; `lone_ok`: a lone token
    is (`lone_token_invariant`)."""
    for ub in ubatches:
        if ub.n_tokens == 1 and not lone_ok:
            return f"a ubatch holds a single token (sequence {ub.take[0][0]})"
        if ub.max_per_stream >= FA_TILE_ROWS:
            return f"a ubatch holds {ub.max_per_stream} tokens of one stream (limit {FA_TILE_ROWS - 1})"
    return None


def pads_needed(lengths: Sequence[tuple[int, int]], n_ubatch: int,
                per_seq_streams: bool) -> dict[int, int]:
    """Dummy tokens to append per sequence so that no ubatch holds a single token (U1).

    Appending one token to the lone token's sequence turns that ubatch into two
    tokens and changes no other ubatch: earlier ones took that sequence's tokens
    by another sequence's (smaller) remainder, later ones no longer contain it.
    """
    pads: dict[int, int] = {}
    for _ in range(len(lengths) + 1):
        padded = [(s, n + pads.get(s, 0)) for s, n in lengths]
        lone = [ub for ub in split(padded, n_ubatch, per_seq_streams) if ub.n_tokens == 1]
        if not lone:
            return pads
        s = lone[0].take[0][0]
        pads[s] = pads.get(s, 0) + 1
    raise AssertionError(f"padding did not converge for {list(lengths)}")  # pragma: no cover


@dataclass(frozen=True)
class Layout:
    """How one decode is laid out: padding per sequence, padding rows that carry
    logits (for a logit count the output layer's sgemm takes in one pass), the
    ubatches and their logit rows."""

    pads: dict[int, int]
    pad_logits: dict[int, int]
    ubatches: tuple[Ubatch, ...]
    logits: tuple[int, ...]  # logit rows per ubatch


def ragged(n_logits: int, quantum: int) -> bool:
    """Whether a ubatch with n_logits logit rows costs llamafile's sgemm a second pass
    over the output layer: it takes the columns `quantum` at a time (4 with 32 vector
    registers, AVX-512; else 2) and the remainder in a pass of its own. Up to
    `quantum` rows are one pass."""
    return n_logits > quantum and n_logits % quantum != 0


def _logits_per_ubatch(entries, pads, pad_logits, ubatches) -> list[int]:
    """Logit rows in each ubatch: each sequence's tokens are its real tokens (logits on
    the last n_logits of them) then its pads (logits on the first pad_logits)."""
    cursor = {s: 0 for s, _, _ in entries}
    info = {s: (n, nl) for s, n, nl in entries}
    out = []
    for ub in ubatches:
        count = 0
        for s, take in ub.take:
            n, nl = info[s]
            a, b = cursor[s], cursor[s] + take
            count += max(0, min(b, n) - max(a, n - nl))  # real rows with logits
            count += max(0, min(b, n + pad_logits.get(s, 0)) - max(a, n))  # pad rows with logits
            cursor[s] = b
        out.append(count)
    return out


def layout(entries: Sequence[tuple[int, int, int]], n_ubatch: int, per_seq_streams: bool,
           pad: bool = True, quantum: int = 2, room: int | None = None,
           lone_ok: bool = False) -> Layout:
    """The layout of a decode of entries (seq_id, n_tokens, n_logits), ascending seq_id.

    With `pad` (batch-invariant contexts): U1 padding (`pads_needed`; none where a
    lone token is invariant, `lone_ok`), then every
    ubatch whose logit count is `ragged` gets padding rows with logits up to the next
    multiple of `quantum`: with a single stream padding rows are added for that (while
    the stream stays under 64 rows and one ubatch, and the rows fit the `room` cells
    left after the last entry's tokens); with several streams only existing padding
    rows get logits. A ragged count costs the output layer a second pass
    (~15 ms on a 2-core AVX-512 CPU, ~13 ms for an odd count on AVX2), a padding row
    ~2.5 ms; the logits of a row do not depend on the others (batch invariance).
    """
    lengths = [(s, n) for s, n, _ in entries]
    pads = pads_needed(lengths, n_ubatch, per_seq_streams) if pad and not lone_ok else {}
    pad_logits: dict[int, int] = {}
    if pad and not per_seq_streams and entries:
        total = sum(nl for _, _, nl in entries)
        rows = sum(n for _, n in lengths) + sum(pads.values())
        extra = (-total) % quantum
        s = entries[-1][0]
        fits = room is None or max(pads.get(s, 0), extra) <= room
        if ragged(total, quantum) and rows + extra < min(FA_TILE_ROWS, n_ubatch + 1) and fits:
            pads[s] = max(pads.get(s, 0), extra)
            pad_logits[s] = extra
    padded = [(s, n + pads.get(s, 0)) for s, n in lengths]
    ubs = split(padded, n_ubatch, per_seq_streams)
    logits = _logits_per_ubatch(entries, pads, pad_logits, ubs)
    if pad and per_seq_streams:
        for i, ub in enumerate(ubs):
            while ragged(logits[i], quantum):
                s = next((s for s, _ in ub.take if pads.get(s, 0) > pad_logits.get(s, 0)
                          and _pad_rows_in(entries, pads, ubs, i, s)), None)
                if s is None:  # no padding row left in this ubatch
                    break
                pad_logits[s] = pad_logits.get(s, 0) + 1
                logits[i] += 1
    return Layout(pads, pad_logits, tuple(ubs), tuple(logits))


def _pad_rows_in(entries, pads, ubatches, i, s) -> bool:
    """Whether ubatch i holds one of sequence s's padding rows."""
    n = next(n for q, n, _ in entries if q == s)
    start = sum(dict(ub.take).get(s, 0) for ub in ubatches[:i])
    return start + dict(ubatches[i].take)[s] > n and pads.get(s, 0) > 0


#: layouts a context memoises at most (`Context.layout_for`; dropped all at once beyond)
MAX_LAYOUTS = 4096


def room_bound(entries: Sequence[tuple[int, int, int]]) -> int:
    """A room (cells after the last entry's tokens) from which `layout` no longer depends
    on it: its padding rows number at most len(entries) + 1 (`pads_needed`) or a logit
    quantum (<= 4) less one."""
    return len(entries) + 5


def checked_layout(entries, n_batch: int, n_ubatch: int, per_seq_streams: bool,
                   invariant: bool, quantum: int, room: int | None, lone_ok: bool) -> Layout:
    """The layout (padding, ubatches) of a decode of entries (seq_id, n_tokens, n_logits)
    in a context of these settings (`Context.layout_for`). Raises ValueError if it does
    not fit n_batch with its padding or, in a batch-invariant context, breaks a rule."""
    total = sum(n for _, n, _ in entries)
    if total > n_batch:
        raise ValueError(f"batch of {total} tokens exceeds n_batch={n_batch}")
    lay = layout(entries, n_ubatch, per_seq_streams, pad=invariant, quantum=quantum, room=room,
                 lone_ok=lone_ok)
    n_pads = sum(lay.pads.values())
    if n_pads + total > n_batch:
        raise ValueError(f"batch of {total} tokens plus {n_pads} padding tokens exceeds "
                         f"n_batch={n_batch}")
    if invariant:
        why = invariant_violation(lay.ubatches, lone_ok)
        if why is not None:
            raise ValueError(f"decode of {list(entries)} is not batch-invariant: {why}")
    return lay


class Layouts:
    """`checked_layout`, memoised (one per context): a layout is a function of the
    entries, the context's settings (the key holds them: a context may change one, e.g.
    its logit quantum after its output layer's check) and whether the room holds its
    padding, so every room of at least `room_bound(entries)` shares one entry. A layout
    that breaks a rule is not kept (it raises every time). At most MAX_LAYOUTS are kept
    (then all are dropped)."""

    def __init__(self):
        self._memo: dict[tuple, Layout] = {}

    def get(self, entries: Sequence[tuple[int, int, int]], n_batch: int, n_ubatch: int,
            per_seq_streams: bool, invariant: bool, quantum: int, room: int | None,
            lone_ok: bool) -> Layout:
        key = (tuple(entries), room if room is None else min(room, room_bound(entries)),
               n_batch, n_ubatch, per_seq_streams, invariant, quantum, lone_ok)
        lay = self._memo.get(key)
        if lay is None:
            if len(self._memo) >= MAX_LAYOUTS:
                self._memo.clear()
            lay = self._memo[key] = checked_layout(entries, n_batch, n_ubatch, per_seq_streams,
                                                   invariant, quantum, room, lone_ok)
        return lay
