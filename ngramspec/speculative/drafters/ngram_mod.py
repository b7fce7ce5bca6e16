"""ngram-mod: a next-token table shared by every sequence, drafting by rolling hash.

Semantics (llama.cpp common/ngram-mod.cpp and speculative.cpp):
- the table maps hash(n_match tokens) -> the token that followed them; a later
  occurrence overwrites an earlier one;
- `begin` adds every n-gram of the prompt; during generation new n-grams are
  added in chunks once more than 32 tokens are pending;
- a draft starts from the last n-1 history tokens + sampled, looks up the next
  token, appends it, rolls the window and repeats, up to n_max tokens; it stops
  at the first missing entry and is discarded if shorter than n_min (checked
  before the caller's cap, as llama.cpp truncates after drafting);
- the table is reset when the pool is more than 25% full at a request start,
  and after 5 consecutive drafts with acceptance below 25%.

Differences (deliberate):
- The table is a namespace of the shared pool with a 32-bit tag per slot, so a
  slot holding another n-gram's entry is a miss, not a wrong draft.
- The occupancy check runs before the prompt is added (llama.cpp adds the
  prompt first and may then wipe it).
- A low-acceptance streak of one sequence resets the table only when it is the
  only active sequence (then exactly as llama.cpp). With other sequences active
  it instead re-adds that sequence's own history, so its n-grams win where they
  conflict, and the others keep theirs (llama.cpp wipes every slot's table).
- Acceptance is measured against the draft actually proposed (after the cap).
- Windows whose next token was drafted from this table and accepted are not
  inserted again (they are already there, with that value): this keeps the
  per-step cost near the lookups alone. Only if the same n-gram occurs twice
  within one chunk with different followers can the table differ from
  llama.cpp's, and then only in which follower it proposes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...settings.config import NgramModParams
from ..pool import HashPool, mix_salt
from . import seq_row as R
from .base import EMPTY

NS_MOD = 0x56
CHUNK = 32
OCCUPANCY_RESET = 0.25
LOW_ACCEPT = 0.25
LOW_STREAK = 5


@dataclass
class _ModSeq:
    """A sequence's state: its row (seq_row.py: SALT the table's current salt, INDEXED
    i_last: n-grams starting before it have been added, LAST_SET n_draft_last, START the
    window start of the last draft's first lookup) and what only Python reads."""

    row: np.ndarray
    n_low: int = 0
    covered: list = field(default_factory=list)  # [start, stop) windows already in the table
    covered_gen: int = 0


def _gaps(start: int, stop: int, ranges: list) -> list[tuple[int, int]]:
    """The parts of [start, stop) outside the sorted, disjoint [a, b) `ranges`."""
    out, cur = [], start
    for a, b in ranges:
        if b <= cur:
            continue
        if a >= stop:
            break
        if a > cur:
            out.append((cur, a))
        cur = max(cur, b)
    if cur < stop:
        out.append((cur, stop))
    return out


class NgramMod:
    name = "ngram-mod"

    def __init__(self, params: NgramModParams, pool: HashPool):
        self.n, self.n_min, self.n_max = params.n_match, params.n_min, params.n_max
        self.pool = pool
        self.generation = 0
        self.salt = mix_salt(NS_MOD, self.n, self.generation)
        self._seqs: dict[int, _ModSeq] = {}
        self.n_resets = 0  # occupancy + low-acceptance resets of the table
        self.n_refreshes = 0  # low-acceptance streaks handled by re-adding one sequence

    # ------------------------------------------------------------------ table
    def _add(self, tokens: np.ndarray, start: int, stop: int, skip: list | None = None) -> None:
        """Add the n-grams starting at [start, stop) of `tokens`, each mapped to the token
        after it, except windows inside the sorted [a, b) ranges of `skip`."""
        for a, b in _gaps(start, stop, skip or []):
            self.pool.put_windows(tokens, self.n, self.salt, tokens[a + self.n:b + self.n],
                                  start=a, end=b + self.n - 1)

    def reset_table(self) -> None:
        """Forget every entry of this table (new salt, in every sequence's row too); other
        namespaces are untouched."""
        self.generation += 1
        self.salt = mix_salt(NS_MOD, self.n, self.generation)
        for st in self._seqs.values():
            st.row[R.SALT] = self.salt
        self.n_resets += 1

    def row(self, seq_id: int) -> np.ndarray:
        """The sequence's state row (seq_row.py)."""
        return self._seq(seq_id).row

    def native_params(self) -> np.ndarray:
        """This drafter's parameter row for drafting.c (seq_row.params)."""
        return R.params(R.MOD, self.n, self.n_max, minimum=self.n_min)

    def _seq(self, seq_id: int) -> _ModSeq:
        """The sequence's state, made (its row on the current salt) at a draft without
        `begin`; `begin` makes it otherwise, once per request."""
        st = self._seqs.get(seq_id)
        if st is None:
            st = self._seqs[seq_id] = _ModSeq(R.new_row(self.salt))
        return st

    # ------------------------------------------------------------------ protocol
    def begin(self, seq_id: int, prompt: np.ndarray) -> None:
        if self.pool.occupancy > OCCUPANCY_RESET:
            self.pool.clear()
            self.n_resets += 1
        st = self._seqs[seq_id] = _ModSeq(R.new_row(self.salt))
        if len(prompt) >= self.n:
            self._add(prompt, 0, len(prompt) - self.n)
            st.row[R.INDEXED] = len(prompt) - self.n

    def draft(self, seq_id: int, history: np.ndarray, sampled: int, max_len: int) -> np.ndarray:
        st = self._seq(seq_id)
        row = st.row
        row[R.LAST_SET] = 0
        n, L = self.n, len(history)
        if L < n:
            return EMPTY
        i_last = int(row[R.INDEXED])
        if i_last + CHUNK < L:
            skip = st.covered if st.covered_gen == self.generation else None
            self._add(history, i_last, L - n, skip)
            row[R.INDEXED] = L - n
            st.covered = []
        if max_len <= 0:
            return EMPTY
        want = max(min(max_len, self.n_max), self.n_min)
        out = self.pool.follow_key(history, sampled, n, self.salt, want)
        if len(out) < self.n_min or not len(out):
            return EMPTY
        draft = out[:max_len]
        row[R.LAST_SET], row[R.START] = len(draft), L - n + 1
        return draft

    def accept(self, seq_id: int, n_accepted: int) -> None:
        st = self._seqs.get(seq_id)
        n_draft = int(st.row[R.LAST_SET]) if st is not None else 0
        if n_draft == 0:
            return
        if n_accepted:
            if st.covered_gen != self.generation:
                st.covered, st.covered_gen = [], self.generation
            start = int(st.row[R.START])
            st.covered.append((start, start + n_accepted))
        if n_accepted / n_draft >= LOW_ACCEPT:
            st.n_low = 0
            return
        st.n_low += 1
        if st.n_low < LOW_STREAK:
            return
        st.n_low = 0
        st.row[R.INDEXED] = 0  # the next draft re-adds this sequence's whole history
        if len(self._seqs) <= 1:
            self.reset_table()
        else:
            self.n_refreshes += 1

    def end(self, seq_id: int) -> None:
        self._seqs.pop(seq_id, None)
