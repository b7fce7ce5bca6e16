"""The cost model on synthetic verify-cost curves (no model needed)."""
import numpy as np
import pytest

from ngramspec.cost import AcceptanceStats, VerifyCost, best_length


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
    steep = VerifyCost.linear(0.016, 0.005).table()
    flat = VerifyCost.linear(0.016, 0.00005).table()
    k_steep, _ = best_length(s, steep, 64)
    k_flat, _ = best_length(s, flat, 64)
    assert 1 <= k_steep <= 8
    assert k_flat >= 12 and k_flat > 2 * k_steep


def test_no_draft_when_acceptance_is_poor_and_cost_steep():
    # accepted 5% of the time: plain decoding is faster than any draft
    s = stats_with(0.05)
    k, rate = best_length(s, VerifyCost.linear(0.016, 0.008).table(), 64)
    assert k == 0 and rate == pytest.approx(1 / 0.016)


def test_perfect_acceptance_drafts_as_long_as_allowed_when_cost_is_sublinear():
    s = stats_with(1.0)
    k, _ = best_length(s, VerifyCost.linear(0.016, 0.004).table(), 24)
    assert k == 24


def test_expected_tokens_is_monotone_and_starts_at_one():
    e = stats_with(0.7).expected_tokens()
    assert e[0] == 1.0 and np.all(np.diff(e) > 0)


def test_verify_cost_is_made_monotone_and_extrapolates():
    c = VerifyCost([1, 2, 4, 8], [0.02, 0.019, 0.03, 0.05])
    assert c.t(2) == pytest.approx(0.02)  # the noisy dip is lifted
    assert c.t(16) == pytest.approx(0.05 + (0.05 - 0.03) / 4 * 8)
    assert c.t(3) == pytest.approx(0.025)


def test_decay_forgets_old_evidence():
    s = AcceptanceStats(decay=0.8)
    for _ in range(30):
        s.update(16, 16)
    high = s.p()[0]
    for _ in range(30):
        s.update(16, 0)
    assert s.p()[0] < 0.3 < 0.8 < high


def _fake_measure(per_token_s, calls):
    def measure(n):
        calls.append(n)
        return 0.016 + per_token_s * (n - 1)
    return measure


def test_cached_curve_is_reused_while_a_spot_check_agrees(tmp_path, monkeypatch):
    from ngramspec.cost import PROBE_SIZES, load_or_calibrate

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls: list[int] = []
    first = load_or_calibrate("m", _fake_measure(0.006, calls))
    calls.clear()
    again = load_or_calibrate("m", _fake_measure(0.006, calls))
    assert again.seconds == first.seconds
    assert set(calls) == set(PROBE_SIZES)  # only the probes ran, no full calibration


def test_cached_curve_from_a_busy_machine_is_measured_again(tmp_path, monkeypatch):
    from ngramspec.cost import load_or_calibrate

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    load_or_calibrate("m", lambda n: 2.5 + 0.1 * n)  # recorded under heavy load: absurd
    fixed = load_or_calibrate("m", _fake_measure(0.006, []))
    assert fixed.t(1) == pytest.approx(0.016)
    # and the corrected curve is what the cache holds now
    assert load_or_calibrate("m", _fake_measure(0.006, [])).t(1) == pytest.approx(0.016)
