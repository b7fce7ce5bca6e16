"""The cost model on synthetic verify-cost curves (no model needed)."""
from dataclasses import replace

import numpy as np
import pytest

from ngramspec.speculative.acceptance import AcceptanceStats, best_length
from ngramspec.speculative.cost import DecodeCost, Shape


def stats_with(p_accept: float, n: int = 200) -> AcceptanceStats:
    """Stats from drafts of 64 whose tokens are each accepted with prob p (geometric)."""
    rng = np.random.default_rng(0)
    s = AcceptanceStats(decay=1.0)
    for _ in range(n):
        acc = int(np.argmax(rng.random(64) > p_accept)) if p_accept < 1 else 64
        s.update(64, acc)
    return s


def test_steep_cost_chooses_short_drafts_flat_cost_long_ones():
    # CPU-like curve (each token adds ~30% of a one-token eval) vs GPU-like (flat)
    s = stats_with(0.8)
    steep = DecodeCost.linear(0.016, 0.005).table()
    flat = DecodeCost.linear(0.016, 0.00005).table()
    k_steep, _ = best_length(s, steep, 64)
    k_flat, _ = best_length(s, flat, 64)
    assert 1 <= k_steep <= 8
    assert k_flat >= 12 and k_flat > 2 * k_steep


def test_no_draft_when_acceptance_is_poor_and_cost_steep():
    # accepted 5% of the time: plain decoding is faster than any draft
    s = stats_with(0.05)
    k, rate = best_length(s, DecodeCost.linear(0.016, 0.008).table(), 64)
    assert k == 0 and rate == pytest.approx(1 / 0.016)


def test_perfect_acceptance_drafts_as_long_as_allowed_when_cost_is_sublinear():
    s = stats_with(1.0)
    k, _ = best_length(s, DecodeCost.linear(0.016, 0.004).table(), 24)
    assert k == 24


def test_expected_tokens_is_monotone_and_starts_at_one():
    e = stats_with(0.7).expected_tokens()
    assert e[0] == 1.0 and np.all(np.diff(e) > 0)


def test_decode_cost_counts_ubatches_padding_and_logits():
    c = DecodeCost(per_ubatch=0.010, per_token=0.002, per_logit=0.003, per_kv=0.001,
                   per_seq_streams=True)
    # one token alone is padded (2 tokens, 1 logit row)
    assert c.seconds([Shape(0, 1, 1)]) == pytest.approx(0.010 + 2 * 0.002 + 0.003)
    # four streams with one token each: one ubatch, no padding
    assert c.seconds([Shape(s, 1, 1) for s in range(4)]) == pytest.approx(0.010 + 4 * 0.005)
    # [3, 2, 2, 2]: two ubatches, the lone third token padded
    three = [Shape(0, 3, 3)] + [Shape(s, 2, 2) for s in range(1, 4)]
    assert c.seconds(three) == pytest.approx(2 * 0.010 + 10 * 0.002 + 9 * 0.003)
    # context: per token per 1000 cells
    assert c.seconds([Shape(0, 2, 2, 2000)]) == pytest.approx(0.010 + 2 * 0.005 + 2 * 2 * 0.001)
    # a single stream is one ubatch whatever the sequences; its odd logit count (9)
    # gets one more padding row with logits (an odd count costs more on this CPU)
    one = DecodeCost(0.010, 0.002, 0.003)
    assert one.seconds(three) == pytest.approx(0.010 + 10 * 0.005)
    assert one.seconds([Shape(0, 8, 8)]) == pytest.approx(0.010 + 8 * 0.005)
    # with several streams only existing padding rows get logits: the rest is priced
    odd = DecodeCost(0.010, 0.002, 0.003, per_odd=0.013, per_seq_streams=True)
    assert odd.seconds([Shape(s, 1, 1) for s in range(3)]) == pytest.approx(0.010 + 0.015 + 0.013)


def test_a_second_logit_row_in_a_ubatch_costs_the_batched_output_kernel():
    c = DecodeCost(0.009, 0.0018, 0.0012, per_multi=0.0085)
    # one token (padded to two rows, one logit row): vec_dot, no sgemm set-up
    assert c.seconds([Shape(0, 1, 1)]) == pytest.approx(0.009 + 2 * 0.0018 + 0.0012)
    # two logit rows: the set-up once; sixteen: still once (one ubatch)
    assert c.seconds([Shape(0, 2, 2)]) == pytest.approx(0.009 + 2 * 0.003 + 0.0085)
    assert c.seconds([Shape(0, 16, 16)]) == pytest.approx(0.009 + 16 * 0.003 + 0.0085)
    assert c.seconds([Shape(0, 16, 1)]) == pytest.approx(0.009 + 16 * 0.0018 + 0.0012)
    # several streams, one token each: one ubatch with several logit rows
    streams = replace(c, per_seq_streams=True)
    assert streams.seconds([Shape(s, 1, 1) for s in range(4)]) == pytest.approx(
        0.009 + 4 * 0.003 + 0.0085)


def test_ragged_logit_counts_are_priced_with_the_contexts_quantum():
    c = DecodeCost(0.009, 0.0018, 0.0012, per_odd=0.015, per_multi=0.0085, logit_quantum=4)
    # 6 logit rows are padded to 8 (two padding rows with logits): one sgemm pass
    assert c.seconds([Shape(0, 6, 6)]) == pytest.approx(0.009 + 8 * 0.003 + 0.0085)
    assert c.seconds([Shape(0, 3, 3)]) == pytest.approx(0.009 + 3 * 0.003 + 0.0085)
    # three streams of 3: 9 logit rows and no padding row to give logits: a second pass
    s = replace(c, per_seq_streams=True)
    assert s.seconds([Shape(i, 3, 3) for i in range(3)]) == pytest.approx(
        0.009 + 9 * 0.003 + 0.0085 + 0.015)


@pytest.mark.parametrize("streams,quantum", [(False, 2), (True, 2), (False, 4), (True, 4)])
def test_fit_recovers_the_coefficients(streams, quantum):
    from ngramspec.speculative.cost import calibration_shapes

    layout = {"per_seq_streams": streams, "logit_quantum": quantum}
    true = DecodeCost(0.012, 0.0025, 0.0031, 0.0008, per_odd=0.004, per_multi=0.0085, **layout)
    samples = [(sh, true.seconds(sh)) for sh in calibration_shapes(streams)]
    got = DecodeCost.fit(samples, **layout)
    if not any(true.features(sh)[4] for sh, _ in samples):  # no ragged shape measured
        true = replace(true, per_odd=0.0)
    assert np.allclose(got.coef, true.coef, rtol=1e-6)


def test_decay_forgets_old_evidence():
    s = AcceptanceStats(decay=0.8)
    for _ in range(30):
        s.update(16, 16)
    high = s.p()[0]
    for _ in range(30):
        s.update(16, 0)
    assert s.p()[0] < 0.3 < 0.8 < high


LAYOUT = {"per_seq_streams": False, "n_ubatch": 512, "pad": True}


def _fake_measure(per_token_s, calls):
    true = DecodeCost(0.012, 0.001, per_token_s)

    def measure(shapes):
        calls.append(tuple(shapes))
        return true.seconds(shapes)
    return measure


def _cache_curve(tmp_path, monkeypatch, cost: DecodeCost) -> None:
    """A cached curve for key "m", as an earlier run would have left it."""
    from ngramspec.speculative.cost import save_curve

    monkeypatch.setenv("NGRAMSPEC_CACHE_DIR", str(tmp_path))
    save_curve("m", cost)


def _cache_bytes(tmp_path) -> bytes:
    return (tmp_path / "decode_cost.json").read_bytes()


def test_first_start_measures_nothing_and_caches_once(tmp_path, monkeypatch):
    """No cached curve: the run starts from the default curve without measuring; nothing
    is written until the run hands its learnt curve to `save`, which writes it once."""
    from ngramspec.speculative.cost import DEFAULT_COEF, load_or_calibrate

    monkeypatch.setenv("NGRAMSPEC_CACHE_DIR", str(tmp_path))
    calls: list = []
    first = load_or_calibrate("m", _fake_measure(0.006, calls), LAYOUT)
    assert first.source == "default" and calls == []
    assert first.cost == DecodeCost(**DEFAULT_COEF, **LAYOUT)
    assert not (tmp_path / "decode_cost.json").exists()
    first.save(first.cost)
    written = _cache_bytes(tmp_path)
    again = load_or_calibrate("m", _fake_measure(0.006, calls), LAYOUT)
    assert again.source == "cache" and again.save is None and calls == []
    first.save(DecodeCost(1.0, 1.0, 1.0))  # another run's late save never replaces it
    assert _cache_bytes(tmp_path) == written


def test_cached_curve_is_reused_without_measuring(tmp_path, monkeypatch):
    from ngramspec.speculative.cost import load_or_calibrate

    true = DecodeCost(0.012, 0.001, 0.006, **LAYOUT)
    _cache_curve(tmp_path, monkeypatch, true)
    calls: list = []
    again = load_or_calibrate("m", _fake_measure(0.006, calls), LAYOUT)
    assert again.source == "cache" and np.allclose(again.cost.coef, true.coef)
    assert calls == [] and again.seconds < 0.1


def test_refresh_measures_in_full_and_rewrites(tmp_path, monkeypatch):
    from ngramspec.speculative.cost import load_or_calibrate

    _cache_curve(tmp_path, monkeypatch, DecodeCost(0.05, 0.004, 0.004, **LAYOUT))
    calls: list = []
    cal = load_or_calibrate("m", _fake_measure(0.006, calls), LAYOUT, refresh=True)
    assert cal.source == "measured" and len(calls) > 4
    assert cal.cost.t(1) == pytest.approx(DecodeCost(0.012, 0.001, 0.006).t(1), rel=0.02)
    assert load_or_calibrate("m", _fake_measure(0.006, []), LAYOUT).source == "cache"


def _run_decodes(tracker, true: DecodeCost, n: int, rng, noise: float = 0.0) -> None:
    """`n` decodes as a 1-slot run makes them (mostly 1 token, some drafts), timed by
    `true` (each up to `noise` slower at random)."""
    from ngramspec.speculative.cost import Shape

    for _ in range(n):
        k = int(rng.choice([1, 1, 1, 1, 2, 8, 17, 33]))
        shapes = [Shape(0, k, k, 300)]
        tracker.observe(shapes, true.seconds(shapes) * (1 + noise * rng.random()))


def test_cached_curve_from_a_busy_machine_is_corrected_within_a_few_decodes(tmp_path,
                                                                           monkeypatch):
    """A curve recorded under heavy load (~3x slow): the run's first decodes correct it
    (the first refits come after CostTracker.FIRST_REFITS decodes); nothing is measured
    at start-up and the cache is not rewritten."""
    from ngramspec.speculative.cost import load_or_calibrate
    from ngramspec.speculative.tracker import CostTracker

    _cache_curve(tmp_path, monkeypatch, DecodeCost(0.05, 0.004, 0.004, **LAYOUT))
    before = _cache_bytes(tmp_path)
    cal = load_or_calibrate("m", _fake_measure(0.006, []), LAYOUT)
    tracker = CostTracker(cal.cost)
    true = DecodeCost(0.012, 0.001, 0.006)
    _run_decodes(tracker, true, max(CostTracker.FIRST_REFITS), np.random.default_rng(0))
    for n in (1, 8, 32):
        assert tracker.current.t(n, 300) == pytest.approx(true.t(n, 300), rel=0.15), n
    assert _cache_bytes(tmp_path) == before


def test_cached_curve_wrong_for_one_token_decodes_is_corrected():
    """A model whose 8- and 32-token predictions are close but whose 1-token decode (the
    most frequent one) is 40% too slow is corrected by the run's first decodes (found in
    a run: a curve calibrated while the machine was busy predicted 21.7 ms for 14.4)."""
    from ngramspec.speculative.tracker import CostTracker

    true = DecodeCost(0.012, 0.001, 0.006)
    stale = DecodeCost(0.012 + 0.009, 0.001, 0.0055, **LAYOUT)  # +40% at 1 token
    assert stale.t(1) / true.t(1) > 1.35
    assert all(0.8 < stale.t(n) / true.t(n) < 1.2 for n in (8, 32))
    tracker = CostTracker(stale)
    _run_decodes(tracker, true, max(CostTracker.FIRST_REFITS), np.random.default_rng(1))
    assert tracker.current.t(1, 300) == pytest.approx(true.t(1, 300), rel=0.1)


def test_noisy_starts_never_measure_or_rewrite(tmp_path, monkeypatch):
    """Ten start-ups on a noisy machine (every decode up to 60% slower at random): none
    measures anything, the cache is never rewritten, and each run's curve still
    follows its decodes."""
    from ngramspec.speculative.cost import load_or_calibrate
    from ngramspec.speculative.tracker import CostTracker

    true = DecodeCost(0.012, 0.001, 0.006, **LAYOUT)
    _cache_curve(tmp_path, monkeypatch, true)
    written = _cache_bytes(tmp_path)
    rng = np.random.default_rng(0)
    calls: list = []
    for _ in range(10):
        cal = load_or_calibrate("m", _fake_measure(0.006, calls), LAYOUT)
        tracker = CostTracker(cal.cost)
        _run_decodes(tracker, true, 32, rng, noise=0.6)
        assert tracker.current.t(1, 300) == pytest.approx(true.t(1, 300) * 1.3, rel=0.3)
    assert calls == [] and _cache_bytes(tmp_path) == written


def test_tracker_picks_up_a_changed_machine_within_a_run():
    """The run's decodes refine the curve: after the machine's per-token cost doubles
    (a neighbour takes a core), the tracker's t(K) follows within 64 decodes, and the
    planner picks shorter drafts for the same acceptance statistics."""
    from ngramspec.speculative.cost import Shape
    from ngramspec.speculative.tracker import CostTracker
    from ngramspec.speculative.planner import plan
    from ngramspec.speculative.speculation import DraftOptions

    before = DecodeCost(0.012, 0.001, 0.006)
    after = DecodeCost(0.012, 0.004, 0.012)
    tr = CostTracker(before)
    rng = np.random.default_rng(1)
    expected = 1.0 + np.cumsum(np.cumprod(np.full(64, 0.8)))  # 80% per position
    opts = [DraftOptions(expected=np.concatenate([[1.0], expected[:32]]))]

    def k_chosen(cost):
        return plan(opts, [Shape(0, 1, 1, 100)], cost, 63, 63)[0]

    k0 = k_chosen(tr.current)
    for _ in range(64):  # the drafts a run makes: mostly short, some long
        n = int(rng.choice([1, 1, 1, 2, 4, 8, 17, 33]))
        shapes = [Shape(0, n, n, 100)]
        tr.observe(shapes, after.seconds(shapes) * (1 + 0.1 * rng.random()))
    for n in (1, 8, 32):
        assert tr.current.t(n, 100) == pytest.approx(after.t(n, 100), rel=0.15), n
    assert k_chosen(tr.current) < k0


def test_tracker_keeps_the_prior_where_the_run_shows_nothing():
    """Only 1-token decodes observed: the per-token cost of long drafts stays the prior's."""
    from ngramspec.speculative.cost import Shape
    from ngramspec.speculative.tracker import CostTracker

    prior = DecodeCost(0.012, 0.001, 0.006)
    tr = CostTracker(prior)
    for _ in range(64):
        tr.observe([Shape(0, 1, 1)], prior.t(1))
    assert tr.current.t(32) == pytest.approx(prior.t(32), rel=0.05)


def test_prior_is_scaled_to_a_faster_backend_from_one_token_decodes():
    """A backend ten times faster than the prior's machine that only ever shows one-token
    decodes: the tracker keeps the prior's shape at a tenth of its price (verifies priced
    at the prior's constants would look ten times too dear, and never be tried)."""
    from ngramspec.speculative.cost import DEFAULT_COEF, Shape
    from ngramspec.speculative.tracker import CostTracker

    prior = DecodeCost(**DEFAULT_COEF, **LAYOUT)
    tr = CostTracker(prior)
    for i in range(40):
        tr.observe([Shape(0, 1, 1, 200 + i)], prior.t(1, 200 + i) / 10)
    assert tr.scale == pytest.approx(0.1, rel=0.02)
    for n in (1, 4, 16):
        assert tr.current.t(n, 300) == pytest.approx(prior.t(n, 300) / 10, rel=0.05), n
    assert not tr.slope_seen()


def test_slope_is_seen_after_enough_verifies_and_forgotten_after_the_window():
    from ngramspec.speculative.cost import Shape
    from ngramspec.speculative.tracker import CostTracker

    true = DecodeCost(0.012, 0.001, 0.006)
    tr = CostTracker(true)
    for _ in range(CostTracker.SLOPE_SAMPLES):
        tr.observe([Shape(0, 4, 4)], true.t(4))
    assert tr.slope_seen()
    for _ in range(CostTracker.WINDOW):
        tr.observe([Shape(0, 1, 1)], true.t(1))
    assert not tr.slope_seen()


def test_refit_follows_a_changed_machine_incrementally():
    """The incremental fit (normal equations, decayed) gives what a fit of the recent
    decodes gives: after 200 decodes on a new machine, t(K) is that machine's."""
    from ngramspec.speculative.tracker import CostTracker

    tr = CostTracker(DecodeCost(0.012, 0.001, 0.006))
    true = DecodeCost(0.004, 0.0002, 0.0009)
    _run_decodes(tr, DecodeCost(0.012, 0.001, 0.006), 64, np.random.default_rng(2))
    _run_decodes(tr, true, 200, np.random.default_rng(3))
    for n in (1, 2, 8, 32):
        assert tr.current.t(n, 300) == pytest.approx(true.t(n, 300), rel=0.1), n
