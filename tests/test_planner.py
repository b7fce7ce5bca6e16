"""The batch planner on hand-written options and synthetic streams (no model)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ngramspec import NgramMapParams, SpecConfig
from ngramspec.speculative.acceptance import AcceptanceStats, best_length
from ngramspec.speculative.cost import DecodeCost, Shape
from ngramspec.speculative.drafters import DrafterChain, NgramSimple
from ngramspec.speculative.planner import plan
from ngramspec.speculative.policy import CostPolicy
from ngramspec.speculative.pool import HashPool
from ngramspec.bench.replay import replay_batch
from ngramspec.speculative.speculation import DraftOptions

# measured on a 2-core CPU with Gemma 3 270M: per ubatch, per token, per logit row
CPU4 = DecodeCost(0.013, 0.003, 0.0034, per_seq_streams=True)


def stats(p: float, n: int = 200) -> AcceptanceStats:
    rng = np.random.default_rng(0)
    s = AcceptanceStats(decay=1.0)
    for _ in range(n):
        s.update(64, int(np.argmax(rng.random(64) > p)) if p < 1 else 64)
    return s


def opts(p: float, k: int = 48) -> DraftOptions:
    e = stats(p).expected_tokens()[:k + 1]
    return DraftOptions([(None, np.arange(k, dtype=np.int32))], e, np.r_[-1, np.zeros(k, int)])


def base(n: int) -> list[Shape]:
    return [Shape(i, 1, 1, 500) for i in range(n)]


def test_one_sequence_is_cost_best_length():
    cost = DecodeCost(0.013, 0.003, 0.0034)
    for p in (0.3, 0.8, 0.95, 1.0):
        o = opts(p)
        want, _ = best_length(stats(p), cost.table(48), 48)
        assert plan([o], [Shape(0, 1, 1)], cost, 63, 63) == [want]


def test_four_copies_draft_together_and_noise_does_not():
    ks = plan([opts(1.0)] * 4, base(4), CPU4, 63, 500)
    assert all(k >= 8 for k in ks) and len(set(ks)) == 1  # equal lengths: one ubatch
    assert plan([opts(0.05)] * 4, base(4), CPU4, 63, 500) == [0, 0, 0, 0]
    mixed = plan([opts(1.0), opts(0.05), opts(1.0), opts(0.05)], base(4), CPU4, 63, 500)
    assert mixed[0] > 0 and mixed[2] > 0 and mixed[1] == mixed[3] == 0


def test_fixed_options_take_whole_drafts_within_the_budget():
    fixed = [DraftOptions([(None, np.arange(40, dtype=np.int32))])] * 3
    assert plan(fixed, base(3), None, 63, 63) == [40, 20, 0]  # 63 - 3 sampled tokens
    assert plan(fixed, base(3), None, 20, 500) == [19, 19, 19]  # per-sequence cap


def _copy_and_noise(rng):
    body = rng.integers(100, 5000, 400).astype(np.int32)
    copy = (body, body[:300].copy())  # the output repeats the prompt
    noise_prompt = rng.integers(0, 8, 400).astype(np.int32)  # tiny alphabet: spurious matches
    noise = (noise_prompt, rng.integers(0, 8, 300).astype(np.int32))
    return copy, noise


def test_batch_replay_drafts_on_copies_and_backs_off_on_noise_at_four_slots():
    rng = np.random.default_rng(1)
    (c1, n1), (c2, n2) = _copy_and_noise(rng), _copy_and_noise(rng)
    streams = [c1, c2, n1, n2]  # consecutive ids: llama.cpp batches slots 2 and 3 together
    d = NgramSimple(NgramMapParams(size_n=3, size_m=64), HashPool(1 << 20))
    chain = DrafterChain(SpecConfig(types=("ngram-simple",)), drafters=[d])
    policy = CostPolicy(CPU4, compare_all=True)
    late: dict[int, list[int]] = {i: [] for i in range(4)}
    res, speedup = replay_batch(chain, policy, CPU4, streams,
                                on_step=lambda i, pos, k, a: late[i].append(k) if pos > 500 else None)
    for i in (0, 1):  # copies: long accepted drafts
        assert res[i].tokens_per_step >= 8 and res[i].acceptance_rate > 0.9
    for i in (2, 3):  # noise: drafting stopped
        assert sum(k > 0 for k in late[i]) <= 0.1 * len(late[i])
    # four copies at once: all of them draft, and the batch beats plain decoding; the
    # ceiling is 1.48x here (every verified token costs a logit row: 6.4 ms, against
    # 9.65 ms per token for four slots decoding one token each)
    four = [_copy_and_noise(rng)[0] for _ in range(4)]
    res, speedup = replay_batch(chain, CostPolicy(CPU4, compare_all=True), CPU4, four)
    assert all(r.tokens_per_step >= 8 for r in res) and speedup > 1.4


def test_a_decode_holds_at_most_the_logit_buffer_cap():
    """Engine._limits: every generation row has logits and llama.cpp keeps the largest
    decode's rows resident, so a decode holds at most LOGIT_BUFFER_MAX bytes of them
    (128 rows of a 262k vocabulary), never fewer rows than slots; a small vocabulary is
    held by the other limits only."""
    from types import SimpleNamespace

    from ngramspec.engine.engine import LOGIT_BUFFER_MAX, Engine

    def limits(n_vocab, n_seq, invariant=True, n_batch=512, fixed_rows=0):
        ctx = SimpleNamespace(invariant=invariant, per_seq_streams=n_seq > 1, n_batch=n_batch,
                              params=SimpleNamespace(n_seq_max=n_seq), fixed_rows=fixed_rows)
        return Engine._limits(SimpleNamespace(ctx=ctx, model=SimpleNamespace(n_vocab=n_vocab)))

    assert LOGIT_BUFFER_MAX // (4 * 262144) == 128
    assert limits(262144, 8) == (63, 128)
    assert limits(262144, 1) == (63, 63)
    assert limits(262144, 200, n_batch=4096) == (63, 200)  # one row per slot at least
    assert limits(49152, 8) == (63, 504)  # SmolLM2: n_batch - n_seq as before
    assert limits(262144, 8, invariant=False) == (512, 128)
    assert limits(262144, 4, fixed_rows=8) == (8, 32)  # one 8-row decode a slot (fixed_shape.py)
    # the planner keeps the total: 8 sequences that would each draft 48
    ks = plan([opts(0.9)] * 8, [Shape(s, 1, 1) for s in range(8)], None, 63, 128)
    assert sum(ks) + 8 <= 128


def test_clairvoyant_replay_verifies_exactly_the_accepted_runs():
    """replay_batch with scripts/rerun_bench.py's clairvoyant planner: each step verifies
    the longest accepted run of its proposals and nothing else, so no drafted token is
    rejected, the stream is followed to its end, and no planner using the same drafters
    is faster."""
    import importlib.util

    from ngramspec.speculative.drafters.prediction import PredictionDrafter

    path = Path(__file__).resolve().parents[1] / "scripts" / "rerun_bench.py"
    spec = importlib.util.spec_from_file_location("rerun_bench", path)
    rerun = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rerun)

    rng = np.random.default_rng(3)
    for copy, noise in (_copy_and_noise(rng), _copy_and_noise(rng)):
        for prompt, gen in (copy, noise):
            chain = DrafterChain(SpecConfig(types=("ngram-simple",)), drafters=[
                NgramSimple(NgramMapParams(size_n=3, size_m=64), HashPool(1 << 20))])
            edited = np.r_[gen[:100], gen[110:]].astype(np.int32)  # a prediction missing 10 tokens
            runs = {}
            for clair in (False, True):
                runs[clair] = replay_batch(chain, CostPolicy(CPU4, compare_all=True), CPU4,
                                           [(prompt, gen)],
                                           lengths=rerun.clairvoyant if clair else None,
                                           own=lambda i: [PredictionDrafter(edited)])
            (res,), speedup = runs[True]
            assert res.accepted == res.drafted  # nothing rejected
            assert res.steps + res.accepted == len(gen) - 1
            assert speedup >= runs[False][1]


def test_one_sequence_closed_form_equals_the_length_search():
    """A decode of one sequence is solved from the model's per-length table
    (`planner._alone`); it picks what trying every length picks (`_ascend`), at any
    cache size and trust, on padded and unpadded layouts."""
    from ngramspec.speculative.planner import _ascend

    rng = np.random.default_rng(3)
    for cost in (CPU4, DecodeCost(0.0016, 0.0002, 0.00035, per_kv=0.0003, per_multi=0.0009),
                 DecodeCost(0.0006, 0.00001, 0.00001, pad=False)):
        for _ in range(40):
            o = opts(float(rng.uniform(0.05, 1.0)), int(rng.integers(1, 64)))
            sh = Shape(0, 1, 1, int(rng.integers(0, 3000)))
            cap, trust = int(rng.integers(1, 63)), float(rng.uniform(0.6, 1.0))
            want = _ascend([o], [sh], cost, [min(o.k_max, cap)], cap, trust)
            assert plan([o], [sh], cost, cap + 1, cap + 1, trust) == want


def test_one_sequence_in_c_equals_the_closed_form_in_python(monkeypatch):
    """drafting.c's `ngs_alone` gives `planner._alone`'s numpy closed form exactly."""
    from ngramspec.speculative import native, planner

    if native.kernel() is None:
        pytest.skip(f"no C drafting here: {native.reason()}")
    rng = np.random.default_rng(4)
    cases = []
    for cost in (CPU4, DecodeCost(0.0016, 0.0002, 0.00035, per_kv=0.0003, per_multi=0.0009),
                 DecodeCost(0.0006, 0.00001, 0.00001, pad=False)):
        for _ in range(60):
            o = opts(float(rng.uniform(0.05, 1.0)), int(rng.integers(1, 64)))
            sh = Shape(0, 1, 1, int(rng.integers(0, 3000)))
            cases.append((o, sh, cost, int(rng.integers(0, 63)), float(rng.uniform(0.6, 1.0))))
    got = [planner._alone(*c) for c in cases]
    monkeypatch.setattr(native, "kernel", lambda: None)
    assert got == [planner._alone(*c) for c in cases]
    assert sum(k > 0 for k in got) > 20


def test_bound_declines_without_pricing_and_never_wrongly():
    """(E[1] - 1) * t(1) <= the least per-token slope: no length can beat plain
    decoding, so the planner returns 0 before pricing; wherever it returns 0, so does
    the full search."""
    from ngramspec.speculative.planner import _ascend

    steep = DecodeCost(0.0016, 0.0016, 0.0016, pad=False)  # a verified token: 2/3 of a decode
    sec, tok, slope = steep.alone()
    assert abs(slope - 0.0032) < 1e-12
    weak = opts(0.3)
    assert (weak.expected[1] - 1) * sec[0] <= slope
    assert plan([weak], [Shape(0, 1, 1)], steep, 63, 63) == [0]
    assert _ascend([weak], [Shape(0, 1, 1)], steep, [48], 62, 1.0) == [0]
    assert plan([opts(1.0)], [Shape(0, 1, 1)], DecodeCost(0.0016, 0.00005, 0.00005), 63, 63)[0] > 0


def test_pricing_is_remembered_per_model_and_equals_seconds():
    """`DecodeCost.price` (the search's inner loop) gives `seconds` for any decode."""
    shapes = [Shape(0, 5, 5, 700), Shape(1, 1, 1, 20), Shape(3, 9, 9, 3000)]
    entries = tuple((s.seq_id, s.n_tokens, s.n_logits) for s in shapes)
    for _ in range(2):  # the second call reads the memo
        assert abs(CPU4.price(entries, [s.n_kv for s in shapes]) - CPU4.seconds(shapes)) < 1e-12


def test_search_in_c_plans_what_the_python_search_plans():
    """drafting.c's `ngs_ascend` (the search where the context has one KV stream per
    sequence) gives `_ascend`'s lengths exactly on random batches: padded or not, lone
    tokens padded or not, logit quanta 1 and 2, small ubatches, budgets and trust."""
    from ngramspec.speculative import native
    from ngramspec.speculative.planner import _ascend, _native_ascend

    if native.kernel() is None:
        pytest.skip(f"no C drafting here: {native.reason()}")
    rng = np.random.default_rng(9)
    n_plans = drafted = 0
    for pad, lone_ok, quantum, n_ubatch in ((True, True, 2, 512), (True, False, 2, 16),
                                            (False, False, 1, 512), (True, False, 1, 8)):
        cost = DecodeCost(0.002, 0.004, 0.0003, per_kv=0.00001, per_odd=0.0001,
                          per_multi=0.0006, per_seq_streams=True, n_ubatch=n_ubatch, pad=pad,
                          lone_ok=lone_ok, logit_quantum=quantum)
        for _ in range(150):
            n = int(rng.integers(2, 12))
            o = [opts(float(rng.uniform(0.2, 1.0)), int(rng.integers(1, 64)))
                 if rng.random() < 0.75 else DraftOptions() for _ in range(n)]
            b = [Shape(int(s), 1, 1, int(rng.integers(10, 3000)))
                 for s in np.sort(rng.choice(32, n, replace=False))]
            caps = [max(0, min(x.k_max, 63)) for x in o]
            budget, trust = int(rng.choice([10, 40, 512])) - n, float(rng.choice([0.9, 1.0]))
            got = _native_ascend(o, b, cost, caps, budget, trust)
            assert got is not None
            assert got == _ascend(o, b, cost, caps, budget, trust)
            n_plans += 1
            drafted += any(got)
    assert 100 < drafted < n_plans
