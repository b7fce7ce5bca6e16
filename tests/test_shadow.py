"""Declined proposals followed along the output (speculative/shadow.py): the statistics
move as the output agrees with them, at their own weight; the policy makes one shadow per
drafter and ends it where the drafter's draft is verified."""
from types import SimpleNamespace

import numpy as np

from ngramspec.speculative.acceptance import AcceptanceStats
from ngramspec.speculative.cost import DecodeCost
from ngramspec.speculative.policy import CostPolicy
from ngramspec.speculative.shadow import Shadows
from ngramspec.speculative.speculation import DraftOptions


def _same(a: AcceptanceStats, b: AcceptanceStats) -> None:
    assert np.allclose(a.offered, b.offered) and np.allclose(a.accepted, b.accepted)
    assert np.allclose(a.expected_tokens(), b.expected_tokens())


def test_a_revised_record_equals_the_draft_recorded_so_at_first():
    """update(2, 2), then revise to (10, 6): the counts of update(10, 6) at that weight,
    whatever was recorded after it (its age is its own)."""
    moved, direct = AcceptanceStats(decay=0.9), AcceptanceStats(decay=0.9)
    moved.update(5, 1)
    direct.update(5, 1)
    rec = moved.update(2, 2)
    direct.update(10, 6)
    for s in (moved, direct):
        s.update(3, 3)
    moved.revise(moved.revise(rec, 4, 4), 10, 6)
    _same(moved, direct)


def test_a_record_from_before_a_rescale_stays_as_it_was():
    s = AcceptanceStats(decay=0.5)
    rec = s.update(2, 2)
    for _ in range(400):  # 2**400 > 1e100: the raw counts are folded back
        s.update(1, 1)
    before = s.offered.copy()
    assert s.revise(rec, 8, 8) is None
    assert np.allclose(s.offered, before)


def test_a_shadow_follows_until_a_miss_or_its_end():
    a, b = AcceptanceStats(decay=1.0), AcceptanceStats(decay=1.0)
    shadows = Shadows()
    shadows.add("d", [1, 2, 3, 4, 5, 6], 1, [(a, a.update(1, 1))])
    shadows.follow([2, 3])
    assert "d" in shadows
    shadows.follow([4, 9, 9])  # a miss at position 4
    assert not shadows
    b.update(6, 4)
    _same(a, b)
    shadows.add("e", [7, 8], 1, [(a, a.update(1, 1))])
    shadows.follow([8, 0])  # matched whole: censored at its length
    b.update(2, 2)
    assert not shadows
    _same(a, b)


def _seq(proposals, committed=None):
    sp = SimpleNamespace(seq_id=0, copying=False, stats={}, budget=None, own=(),
                         shadows=Shadows(), committed=committed)
    sp.options = DraftOptions([(SimpleNamespace(name=n), np.asarray(d, np.int32))
                               for n, d in proposals], None)
    return sp


def test_the_policy_follows_a_declined_proposal_across_steps():
    """A declined 6-token proposal that the next steps' tokens confirm counts, in the
    drafter's statistics, as the 6-token draft it would have been, plus the later
    steps' own censored proposals; a verified draft of the drafter ends its shadow."""
    pol = CostPolicy(DecodeCost.linear(0.01, 0.002), compare_all=True)
    sp = _seq([("d", [5, 6, 7, 8, 9, 10])])
    pol.observe(sp, [5], 0)  # declined: matched 1 of 6
    assert "d" in sp.shadows
    sp.options = _seq([("d", [6, 7, 8, 9, 10, 11])]).options
    pol.observe(sp, [6], 0)  # the same copy, one token on: censored, not followed again
    sp.options = DraftOptions()
    for t in (7, 8, 9, 10):  # resting steps: nothing proposed, the shadow still follows
        pol.observe(sp, [t], 0)
    assert not sp.shadows  # matched whole
    want = AcceptanceStats()
    want.update(6, 6)
    want.update(1, 1)
    _same(sp.stats[("d", False)], want)
    sp.options = _seq([("d", [11, 12, 13])]).options
    pol.observe(sp, [11], 0)
    assert "d" in sp.shadows
    sp.options, sp.committed = _seq([("d", [12, 13, 14])]).options, ("d", 2)
    pol.observe(sp, [12, 13, 0], 2)
    assert not sp.shadows
