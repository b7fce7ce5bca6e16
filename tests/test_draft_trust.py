"""DraftTrust and the planner's trust gate on hand-written decodes (no model)."""
from __future__ import annotations

import math

import numpy as np

from ngramspec.speculative.cost import DecodeCost, Shape
from ngramspec.speculative.draft_trust import DECAY, PRIOR, SHRINK_MIN, DraftTrust, bucket
from ngramspec.speculative.planner import plan
from ngramspec.speculative.shadow import Shadows
from ngramspec.speculative.policy import CostPolicy
from ngramspec.speculative.speculation import DraftOptions

CPU8 = DecodeCost(0.010, 0.0013, 0.004, per_seq_streams=True)


def drafted_decode(t: DraftTrust, n_seqs: int, predicted: float, realized: float) -> None:
    """One decode of n_seqs sequences, one of them drafted: predicted rate
    (n + 10) / 0.2 s; the realized rate `realized / predicted` of that."""
    t.decode(n_seqs, 0.2, 0.2 * predicted / realized, drafted=True)
    t.sequence(11.0, 10)  # E = 11 tokens predicted, 10 draft tokens accepted
    for _ in range(n_seqs - 1):
        t.sequence(1.0, 0)


def test_buckets_by_batch_size():
    assert [bucket(n) for n in (1, 2, 3, 4, 7, 8, 15, 16, 64)] == [0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_trust_learns_per_bucket_and_never_exceeds_one():
    t = DraftTrust()
    assert t.factor(8) == 1.0
    for _ in range(30):
        drafted_decode(t, 8, predicted=1.0, realized=0.8)
    assert 0.8 < t.factor(8) < 0.85  # the shortfall, shrunk a little towards 1
    assert t.factor(1) == t.factor(4) == 1.0  # other batch sizes keep their own
    for _ in range(30):
        drafted_decode(t, 1, predicted=1.0, realized=1.5)
    assert t.factor(1) == 1.0  # a draft that beat its prediction does not loosen the gate


def test_undrafted_decodes_return_trust_towards_one():
    t = DraftTrust()
    drafted_decode(t, 8, 1.0, 0.5)
    first = t.factor(8)
    assert math.isclose(first, math.exp(math.log(0.5) / (1 + PRIOR)))
    for _ in range(100):  # drafting stopped: each plain decode decays the evidence
        t.decode(8, 0.07, 0.07, drafted=False)
    assert t.factor(8) > 0.97
    assert math.isclose(math.log(t.factor(8)),
                        math.log(0.5) * DECAY ** 100 / (DECAY ** 100 + PRIOR))


def test_a_preempted_decode_counts_clipped():
    t = DraftTrust()
    drafted_decode(t, 8, 1.0, 1e-6)
    assert t.factor(8) >= math.exp(-math.log(4.0) / (1 + PRIOR)) - 1e-12


def _copy(k: int = 48, p: float = 1.0) -> DraftOptions:
    e = np.concatenate([[1.0], 1.0 + np.cumsum(np.full(k, p) ** np.arange(1, k + 1))])
    return DraftOptions([(None, np.arange(k, dtype=np.int32))], e, np.r_[-1, np.zeros(k, int)])


def test_planner_drafts_only_what_beats_plain_decoding_by_the_trust():
    base = [Shape(i, 1, 1, 700) for i in range(8)]
    opts = [_copy()] + [DraftOptions()] * 7
    ks = plan(opts, base, CPU8, 63, 500)
    assert ks[0] > 0  # the model's prediction: drafting gains

    def rate(k):
        e = 7 + float(opts[0].expected[k])
        return e / CPU8.seconds([Shape(0, 1 + k, 1 + k, 700), *base[1:]])
    gain = rate(ks[0]) / rate(0)
    assert 1.0 < gain < 1.5
    assert plan(opts, base, CPU8, 63, 500, trust=1.01 / gain)[0] == ks[0]
    assert plan(opts, base, CPU8, 63, 500, trust=0.99 / gain) == [0] * 8
    alone = plan([_copy()], [Shape(0, 1, 1, 700)], CPU8, 63, 500, trust=0.99 / gain)
    assert alone[0] > 0  # one sequence gains far more than the same trust costs


def test_cost_policy_scores_its_drafted_decodes():
    pol = CostPolicy(CPU8)
    shapes = [Shape(0, 33, 33, 700), *(Shape(i, 1, 1, 700) for i in range(1, 8))]
    predicted = CPU8.seconds(shapes)

    class Seq:  # the fields CostPolicy.observe reads for the trust
        committed = ("ngram-mod", 32)
        options = DraftOptions([], np.linspace(1.0, 33.0, 33), np.zeros(33, int))
        copying = False
        stats: dict = {}
        seq_id = 0
        budget = None  # no prediction of its own
        shadows = Shadows()  # no declined proposal followed
    for _ in range(20):  # 32 drafted, ~all predicted, 4 accepted, at the predicted speed
        pol.observe_decode(shapes, predicted)
        pol.observe(Seq(), [1] * 5, 4)
    realized = (8 + 4) / (8 + 32)
    assert pol.trust(8) < 0.6 and pol.trust(8) > realized
    assert pol.trust(1) == 1.0


def test_shrink_learns_the_share_of_expected_tokens_accepted_per_bucket():
    """Drafted decodes at 8 slots whose sequences accept 80% of the draft tokens the
    planner expected: shrink(8) falls towards 0.8 (never below SHRINK_MIN, never above
    1), other batch sizes keep 1; a decode reported with its extra tokens already shrunk
    (scale) counts them as they were before the shrink."""
    t = DraftTrust()
    assert t.shrink(8) == 1.0
    for _ in range(200):
        t.decode(8, 0.2, 0.2, drafted=True)
        t.sequence(11.0, 8)  # 10 extra tokens expected, 8 accepted
    assert abs(t.shrink(8) - 0.8) < 0.01
    assert t.shrink(1) == t.shrink(4) == 1.0
    s = DraftTrust()
    for _ in range(200):  # the same decodes, planned on tokens shrunk by 0.8
        s.decode(8, 0.2, 0.2, drafted=True)
        s.sequence(1.0 + 0.8 * 10.0, 8, scale=0.8)
    assert math.isclose(s.shrink(8), t.shrink(8))
    for _ in range(300):  # nothing accepted: the floor
        t.decode(8, 0.2, 0.2, drafted=True)
        t.sequence(11.0, 0)
    assert t.shrink(8) == SHRINK_MIN


class _Drafter:
    name = "d"


def test_the_policy_prices_drafts_on_shrunk_tokens():
    """CostPolicy.options hands the planner E' = 1 + shrink x (E - 1) (its scale with
    it), in the sequence's own buffer: the statistics' own curve is left as it was."""
    from ngramspec.speculative.speculation import Speculation
    pol = CostPolicy(CPU8, compare_all=True)
    sp = Speculation(0, chain=None, policy=pol)
    found = [(_Drafter(), np.arange(8, dtype=np.int32))]
    raw = pol.options(sp, np.zeros(4, np.int32), 0, 8, found=found)
    assert raw.scale == 1.0
    e = pol.stats(sp, found[0][0]).expected_tokens()[:9].copy()
    assert np.array_equal(raw.expected, e)
    for _ in range(100):
        pol.realized.decode(1, 0.01, 0.01, drafted=True)
        pol.realized.sequence(9.0, 4)
    c = pol.realized.shrink(1)
    assert 0.5 <= c < 0.6
    got = pol.options(sp, np.zeros(4, np.int32), 0, 8, found=found)
    assert got.scale == c
    assert np.allclose(got.expected, 1.0 + c * (e - 1.0))
    assert np.array_equal(pol.stats(sp, found[0][0]).expected_tokens()[:9], e)


def test_shrink_returns_towards_one_while_nothing_is_drafted():
    """The expected tokens' sums decay with every decode of the bucket, drafted or not:
    a bucket whose drafts ran high and that then declines every draft does not keep its
    low shrink (which would keep it declining), it returns towards 1."""
    t = DraftTrust()
    for _ in range(100):
        t.decode(1, 0.01, 0.01, drafted=True)
        t.sequence(11.0, 2)
    low = t.shrink(1)
    assert low < 0.6
    for _ in range(200):  # ~6 half-lives of TOKEN_DECAY
        t.decode(1, 0.0, 0.01, drafted=False)
    assert t.shrink(1) > low + 0.15
    assert t.shrink(8) == 1.0
