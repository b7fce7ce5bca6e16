"""Bounded exploration (speculative/probe.py): a planner whose prior prices verifies too dear
cannot lock itself out, and where drafts never pay exploring costs at most ~2%.
Synthetic backends priced by DecodeCost, no model."""
from __future__ import annotations

import numpy as np

from ngramspec.speculative.acceptance import AcceptanceStats
from ngramspec.speculative.cost import DEFAULT_COEF, DecodeCost, Shape
from ngramspec.speculative.policy import CostPolicy
from ngramspec.speculative.probe import SHARE
from ngramspec.speculative.speculation import DraftOptions

LAYOUT = dict(per_seq_streams=False, n_ubatch=512, pad=True, logit_quantum=1, lone_ok=True)


def _options(p: float, k: int = 32) -> DraftOptions:
    s = AcceptanceStats(decay=1.0)
    rng = np.random.default_rng(0)
    for _ in range(300):
        s.update(64, int(np.argmax(rng.random(64) > p)))
    e = s.expected_tokens()[:k + 1]
    return DraftOptions([(None, np.arange(k, dtype=np.int32))], e, np.r_[-1, np.zeros(k, int)])


def _run(policy: CostPolicy, true: DecodeCost, opts: DraftOptions, steps: int) -> list[int]:
    """`steps` one-slot steps planned by `policy`, each timed by `true`; the lengths."""
    out = []
    for i in range(steps):
        ks = policy.plan([opts], [Shape(0, 1, 1, 200 + i)], 63, 63)
        shapes = [Shape(0, 1 + ks[0], 1 + ks[0], 200 + i)]
        policy.observe_decode(shapes, true.seconds(shapes))
        out.append(ks[0])
    return out


def test_a_flat_backend_is_learnt_and_then_drafted_on():
    """A GPU-like backend (a verify of 8 rows costs about one row) under the 2-core
    prior: the scaled prior declines drafts accepted half the time, the probes show the
    slope, and from then on the planner drafts by itself."""
    true = DecodeCost(0.0016, 0.00002, 0.00002, **LAYOUT)
    prior = DecodeCost(**DEFAULT_COEF, **LAYOUT)
    pol = CostPolicy(prior, compare_all=True)
    opts = _options(0.5)
    assert pol.plan([opts], [Shape(0, 1, 1, 200)], 63, 63) == [0] or pol.probe.n_probes == 0
    ks = _run(pol, true, opts, 400)
    assert pol.tracker.slope_seen()
    late = ks[-100:]
    assert sum(k > 0 for k in late) >= 95  # the planner's own drafts now
    assert pol.probe.n_probes < 40


def test_where_drafts_never_pay_probes_cost_at_most_their_share():
    """Every verified token costs a whole decode and drafts are rarely accepted: the
    planner never drafts, and the probes' net cost stays within SHARE of the run's
    decode time (the budget is checked before each probe)."""
    true = DecodeCost(0.0016, 0.0016, 0.0, pad=False)
    pol = CostPolicy(DecodeCost(**DEFAULT_COEF, **LAYOUT), compare_all=True)
    ks = _run(pol, true, _options(0.02), 3000)
    probes = sum(k > 0 for k in ks)
    assert 0 < probes == pol.probe.n_probes
    assert pol.probe.spent_s <= SHARE * pol.probe.decode_s
    plain = 3000 * true.t(1)
    assert pol.probe.decode_s <= plain / (1 - SHARE) + 1e-9  # probes: at most SHARE of the run


def test_no_probe_without_a_proposal_or_budget():
    pol = CostPolicy(DecodeCost(**DEFAULT_COEF, **LAYOUT), compare_all=True)
    assert pol.plan([DraftOptions()], [Shape(0, 1, 1)], 63, 63) == [0]
    assert pol.plan([_options(0.3)], [Shape(0, 1, 1)], 63, 63) == [0]  # no decode time yet
    assert pol.probe.n_probes == 0
