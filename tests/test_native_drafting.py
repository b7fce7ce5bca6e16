"""The C drafting loops (llama/kernels/native/drafting.c) against pool.py's Python reference:
the same slots, values and counts on random and repetitive histories; and every
drafter's proposals the same with the C loops on and off."""
from __future__ import annotations

import numpy as np
import pytest

from ngramspec.speculative import native
from ngramspec.speculative.drafters import make_drafter
from ngramspec.speculative.pool import HashPool

pytestmark = pytest.mark.skipif(native.kernel() is None,
                                reason=f"no C drafting here: {native.reason()}")


def _pools(monkeypatch, nbytes: int = 1 << 14) -> tuple[HashPool, HashPool]:
    """(C pool, Python pool) of the same size."""
    c = HashPool(nbytes)
    monkeypatch.setenv(native.ENV, "0")
    py = HashPool(nbytes)
    monkeypatch.delenv(native.ENV)
    assert c._c is not None and py._c is None
    return c, py


def _same_salts(monkeypatch) -> None:
    """The per-request salts from epoch 1 again (drafters/index.py), so a run with C and
    one without index into the same slots, collisions included, whatever ran before."""
    import itertools

    from ngramspec.speculative.drafters import index

    monkeypatch.setattr(index, "_epochs", itertools.count(1))


def _history(rng, length: int, vocab: int) -> np.ndarray:
    """Random tokens with copied stretches (so keys repeat and chains follow)."""
    h = rng.integers(0, vocab, length).astype(np.int32)
    for _ in range(length // 40):
        a, b = sorted(rng.integers(0, length, 2))
        n = min(int(rng.integers(5, 40)), length - b)
        h[b:b + n] = h[a:a + n]
    return h


@pytest.mark.parametrize("keep", ["last", "first"])
def test_put_windows_fills_the_same_slots(monkeypatch, keep):
    rng = np.random.default_rng(1)
    c, py = _pools(monkeypatch)  # 2048 slots: collisions happen
    for length, n, vocab in [(50, 3, 20), (400, 5, 50), (1200, 2, 9), (3, 3, 5), (2, 4, 5)]:
        toks = _history(rng, length, vocab)
        vals = rng.integers(0, 1 << 31, max(length, 1)).astype(np.int32)[:max(length - n + 1, 0)]
        c.put_windows(toks, n, 77 + n, vals, keep=keep)
        c.put_windows(toks, n, 99 + n, value0=int(length), keep=keep)
        py.put_ngrams(toks.tolist(), n, 77 + n, vals.tolist(), keep=keep)  # the reference
        py.put_ngrams(toks.tolist(), n, 99 + n, range(length, 2 * length), keep=keep)
        np.testing.assert_array_equal(c.table, py.table)
        assert c.used == py.used == int(np.count_nonzero(c.table))


def test_follow_and_find_agree(monkeypatch):
    rng = np.random.default_rng(2)
    c, py = _pools(monkeypatch, 1 << 16)
    hist = _history(rng, 3000, 40)
    for n in (1, 2, 4, 8):
        c.put_windows(hist[:-1], n, n, hist[n:])
        c.put_windows(hist, n, 100 + n, value0=0, keep="first")
    py.table[:] = c.table  # the same contents: only the lookups are compared here
    for L in rng.integers(20, 3000, 200):
        last = int(hist[L]) if rng.random() < 0.8 else int(rng.integers(0, 40))
        for n in (1, 2, 4, 8):
            got = c.follow_key(hist[:L], last, n, n, 64)
            want = py.follow_key(hist[:L], last, n, n, 64)
            np.testing.assert_array_equal(got, want)
            assert got.dtype == np.int32
            assert c.find_key(hist[:L], last, n, 100 + n) == py.find_key(hist[:L], last, n, 100 + n)
    pos, _ = c.find_key(hist[:500], int(hist[500]), 4, 104)
    assert pos < 0 or hist[pos:pos + 4].tolist() == [*hist[497:500].tolist(), int(hist[500])]


@pytest.mark.parametrize("keep", ["last", "first"])
def test_an_index_step_in_one_call_equals_put_then_find(monkeypatch, keep):
    """HashPool.index_find (C: ngs_index_find) against the Python reference's put_windows
    then find_key: the same positions, hashes, slots and counts, step after step."""
    rng = np.random.default_rng(4)
    c, py = _pools(monkeypatch, 1 << 14)
    hist = _history(rng, 1500, 25)
    for n, lag in ((3, 0), (5, 7), (8, 64)):
        done = {c: 0, py: 0}
        for L in range(n + lag + 2, 1500, int(rng.integers(1, 9))):
            last = int(hist[L])
            got = []
            for pool in (c, py):
                pos, h, done[pool] = pool.index_find(hist[:L], last, n, 31 + n, done[pool], lag, keep)
                got.append((pos, h, done[pool]))
            assert got[0] == got[1]
            np.testing.assert_array_equal(c.table, py.table)
            assert c.used == py.used


@pytest.mark.parametrize("name", ["ngram-mod", "ngram-simple", "ngram-map-k", "ngram-map-k4v"])
def test_drafters_propose_the_same(monkeypatch, name):
    """A drafter's drafts over a generation are the same with the C loops and without."""
    rng = np.random.default_rng(3)
    hist = _history(rng, 900, 30)
    drafts = []
    for on in (True, False):
        monkeypatch.setenv(native.ENV, "1" if on else "0")
        _same_salts(monkeypatch)
        d = make_drafter(name)
        assert (d.pool._c is not None) == on if hasattr(d, "pool") else True
        d.begin(0, hist[:300])
        out = []
        for L in range(300, 880):
            draft = d.draft(0, hist[:L], int(hist[L]), 16)
            out.append(draft.tolist())
            if len(draft):
                d.accept(0, int(np.argmax(np.append(draft != hist[L + 1:L + 1 + len(draft)], True))))
        drafts.append(out)
    assert drafts[0] == drafts[1]
    assert sum(map(len, drafts[0])) > 50  # the history's copies were drafted


def test_decode_layouts_are_ubatch_pys():
    """The planner's C layout (cost._native_features) gives ubatch.layout's features and
    padding on random decodes: consecutive and scattered slots, lone tokens, drafts
    across the flash-attention tile, every logit quantum, small ubatches; where the
    Python layout cannot pad (n_ubatch 1), the C one declines too."""
    from ngramspec.speculative.cost import _layout_features, _native_features

    rng = np.random.default_rng(11)
    lengths = [1, 1, 1, 2, 3, 4, 5, 9, 17, 33, 63, 64, 65, 130]
    compared = 0
    for _ in range(6000):
        m = int(rng.integers(1, 10))
        start = int(rng.integers(0, 4))
        ids = (sorted(rng.choice(16, m, replace=False).tolist()) if rng.random() < 0.3
               else list(range(start, start + m)))
        entries = []
        for s in ids:
            n = int(rng.choice(lengths))
            entries.append((int(s), n, n if rng.random() < 0.8 else int(rng.choice([0, 1, n]))))
        args = (int(rng.choice([512, 64, 8, 3, 1])), bool(rng.random() < 0.8),
                int(rng.choice([1, 2, 4])), bool(rng.random() < 0.3))
        got = _native_features(tuple(entries), *args)
        try:
            want = _layout_features(tuple(entries), args[0], True, *args[1:])
        except AssertionError:  # padding cannot keep every ubatch invariant
            assert got is None
            continue
        assert got is not None and got[0].tolist() == want[0].tolist() and got[1] == want[1], (
            entries, args)
        compared += 1
    assert compared > 5000


def test_expected_tokens_in_c_equal_numpys(monkeypatch):
    """drafting.c's `ngs_expected` gives AcceptanceStats.expected_tokens the numpy
    reference's values exactly, on random histories of verified drafts (decays, the
    fold of the scale, drafts longer than the positions kept)."""
    from ngramspec.speculative.acceptance import AcceptanceStats

    rng = np.random.default_rng(11)
    for trial in range(200):
        decay = float(rng.choice([0.5, 0.97, 0.995, 1.0]))
        c = AcceptanceStats(decay=decay)
        monkeypatch.setenv(native.ENV, "0")
        py = AcceptanceStats(decay=decay)
        monkeypatch.delenv(native.ENV)
        assert c._lib is not None and py._lib is None
        for _ in range(int(rng.integers(0, 400 if decay == 0.5 else 60))):
            k = int(rng.integers(1, 80))
            n = int(rng.integers(0, k + 1)) if rng.random() < 0.6 else k
            c.update(k, n)
            py.update(k, n)
        assert np.array_equal(c.expected_tokens(), py.expected_tokens())


def test_the_options_table_in_c_equals_numpys():
    """drafting.c's `ngs_best_expected` (acceptance.best_expected: CostPolicy.options'
    table of several proposals) against the numpy table: the same best value and the same
    proposal per draft length, ties to the earlier proposal, lengths past a proposal's
    draft not offered by it, drafts longer than MAX_DRAFT cut, the extra tokens shrunk by
    the same scale in the same order."""
    from ngramspec.speculative import acceptance as A

    rng = np.random.default_rng(12)
    for trial in range(300):
        m = int(rng.integers(1, 6))
        stats = [A.AcceptanceStats(decay=float(rng.choice([0.9, 0.97]))) for _ in range(m)]
        for s in stats[:int(rng.integers(0, m + 1))]:  # some never updated: equal curves
            for _ in range(int(rng.integers(1, 30))):
                k = int(rng.integers(1, 70))
                s.update(k, int(rng.integers(0, k + 1)))
        lens = [int(rng.integers(1, 80)) for _ in range(m)]
        idx = sorted(rng.choice(8, m, replace=False).tolist())
        got = A.OptionsTable()
        got.expected[:], got.pick[:] = np.nan, 99
        want = (np.full(A.MAX_DRAFT + 1, np.nan), np.full(A.MAX_DRAFT + 1, 99, np.int64))
        scale = float(rng.choice([1.0, rng.uniform(0.5, 1.0)]))
        top = A.best_expected(stats, lens, idx, got, scale)
        assert top == A._best_expected_numpy(stats, lens, idx, *want, scale) == min(max(lens), 64)
        assert np.array_equal(got.expected, want[0], equal_nan=True)
        assert np.array_equal(got.pick, want[1]) and got.pick[0] == -1


def _chain_run(monkeypatch, native_on: bool, types: list, first_only: bool, seed: int):
    """A chain of `types` over a generation with repeats: every step's proposals, then
    the pool's table and count and every drafter's state row (C: one `ngs_propose` a step)."""
    from ngramspec.settings.config import SpecConfig
    from ngramspec.speculative.drafters import DrafterChain

    monkeypatch.setenv(native.ENV, "1" if native_on else "0")
    _same_salts(monkeypatch)
    rng = np.random.default_rng(seed)
    hist = _history(rng, 1400, 12)
    pool = HashPool(1 << 14)  # 2048 slots: the namespaces collide
    chain = DrafterChain(SpecConfig(types=tuple(types), draft_min=2), pool)
    assert (chain._params is not None) == native_on
    log = []
    for seq in (0, 1):
        chain.begin(seq, hist[:200 + 50 * seq])
    L = {0: 200, 1: 250}
    while L[0] < 1300:
        for seq in (0, 1):
            n = L[seq]
            props = (chain.watch(seq, hist[:n], int(hist[n]), 40) if n % 7 == 0 else
                     chain.propose(seq, hist[:n], int(hist[n]), 40, first_only=first_only))
            log.append([(d.name, dr.tolist()) for d, dr in props])
            if props:
                d, dr = props[-1]
                chain.commit(seq, d, dr)
                acc = int(np.argmax(np.append(dr != hist[n + 1:n + 1 + len(dr)], True)))
                chain.accept(seq, acc)
                L[seq] += acc
            L[seq] += 1 + int(rng.integers(0, 2))
    rows = [d.row(s).tolist() for d in chain.drafters if hasattr(d, "row") for s in (0, 1)]
    stats = [(s.n_call_draft, s.n_prop_drafts, s.n_prop_tokens) for s in chain.stats.values()]
    return log, pool.table.copy(), pool.used, rows, stats


@pytest.mark.parametrize("first_only", [False, True])
@pytest.mark.parametrize("types", [
    ["ngram-simple", "ngram-map-k", "ngram-mod"],
    ["ngram-mod", "ngram-map-k4v", "ngram-simple"],
    ["ngram-map-k", "ngram-simple"],
])
def test_a_chain_in_one_call_equals_its_drafters_in_python(monkeypatch, types, first_only):
    """`ngs_propose` (native_chain.py) against the drafters' Python `draft` in order: the
    same proposals step after step (watches too), the same pool slots and count, the same
    state rows and counters, with an ngram-map-k4v drafted in Python between C calls and
    ngram-mod's chunks added in Python."""
    for seed in (5, 6):
        got = _chain_run(monkeypatch, True, types, first_only, seed)
        want = _chain_run(monkeypatch, False, types, first_only, seed)
        assert got[0] == want[0]
        np.testing.assert_array_equal(got[1], want[1])
        assert got[2:] == want[2:]
        assert sum(len(p) for p in got[0]) > 20  # drafted: the copies were found
