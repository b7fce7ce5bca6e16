"""Rest (speculative/rest.py): a policy whose proposals do not pay for their host time stops
proposing, samples an active step now and then, and comes back when drafting pays."""
from __future__ import annotations

import pytest

from ngramspec.speculative.rest import Rest

PLAIN = 0.002  # seconds of a plain decode


def _step(rest: Rest, host: float, drafted: bool = False, accepted: int = 0,
          drafted_len: int = 0, measured: float = PLAIN) -> bool:
    """One step: the policy's host time, the decode, its sequence's verdict; returns
    whether the step was active."""
    was = rest.active
    rest.spent(host)
    rest.decode(PLAIN, measured, 1, drafted)
    if drafted:
        rest.accepted(accepted, drafted_len)
    return was


def test_proposals_that_never_pay_rest_within_one_percent():
    rest = Rest()
    active = [_step(rest, host=0.0004) for _ in range(400)]
    assert all(active[:Rest.WARMUP])  # a run starts active
    late = active[200:]
    assert 0 < sum(late) <= len(late) / 10  # a few sampled active steps
    # the sampled steps' host time is within SHARE of the decode time
    assert sum(late) * 0.0004 <= 2 * Rest.SHARE * PLAIN * len(late)
    assert rest.n_rested > 300


def test_drafts_that_pay_keep_the_policy_active():
    rest = Rest()
    active = [_step(rest, host=0.0004, drafted=True, accepted=4, drafted_len=5,
                    measured=PLAIN * 1.3) for _ in range(300)]
    assert all(active)
    assert rest.saved > rest.host


def test_a_copy_found_while_resting_starts_a_trial_and_stays_if_it_pays():
    rest = Rest()
    for _ in range(100):
        _step(rest, host=0.0004)
    assert not rest.active or rest.n_rested > 0
    # the copy begins: every active step now has its draft accepted whole
    active = [_step(rest, host=0.0004, drafted=rest.active, accepted=8, drafted_len=8,
                    measured=PLAIN * 1.5) for _ in range(120)]
    first = active.index(True)
    assert first <= Rest.MAX_PERIOD
    assert all(active[first + 2 * Rest.TRIAL:])  # the trial paid: active from then on


def test_a_trial_that_does_not_pay_waits_longer_before_the_next():
    rest = Rest()
    for _ in range(100):
        _step(rest, host=0.001)
    trials = []
    for i in range(600):  # whole but tiny drafts that cost more than they save
        a = _step(rest, host=0.001, drafted=rest.active, accepted=1, drafted_len=1,
                  measured=PLAIN * 1.6)
        trials.append(a)
    assert sum(trials[300:]) < sum(trials[:300])  # the gap grew
    assert sum(trials[300:]) <= 300 / 4
    # while the wait after a failed trial lasts, a resting step does not watch for a copy
    # (a woken step would only start the trial that failed); it watches again after it
    assert rest._gap > 0
    watching = []
    for _ in range(2 * rest._gap + 2):
        watching.append(rest.watching)
        _step(rest, host=0.001)
    assert not all(watching) and any(watching)


def test_declined_wakes_make_the_watch_wait_and_a_drafted_one_resets_it():
    """A wake the planner declines doubles the steps before the watch looks again (up to
    MAX_WAKE_GAP); a wake whose draft was verified lets it look at every step again."""
    rest = Rest()
    for _ in range(200):
        _step(rest, host=0.001)
    assert not rest.active and rest.watching
    looks = 0
    for _ in range(200):  # the watch matches whenever it looks; the planner declines
        if not rest.active and rest.watching:
            looks += 1
            rest.wake()
        _step(rest, host=0.001)
    assert rest._wake_gap == Rest.MAX_WAKE_GAP
    assert looks <= 1 + 6 + 200 // Rest.MAX_WAKE_GAP  # 1, 2, 4, ... then every MAX_WAKE_GAP
    while not rest.watching:
        _step(rest, host=0.001)
    rest.wake()
    _step(rest, host=0.001, drafted=True, accepted=2, drafted_len=3, measured=PLAIN * 1.2)
    assert rest._wake_gap == 0 and rest.watching


def test_declined_proposals_rest_a_sequence_whose_drafts_paid_for_a_doubling_gap():
    """Where a sequence's drafts paid (saved > host) but the planner now declines its
    proposals (a decode of several sequences where a draft costs more than it saves), it
    rests 1, 2, 4, ... steps (up to MAX_DECLINE_GAP, or its period) after each declined
    active step instead of paying its proposals at every step; a drafted one makes it
    active at every step again."""
    rest = Rest()
    for _ in range(40):  # drafts that pay
        rest.proposed()
        _step(rest, host=0.0004, drafted=True, accepted=4, drafted_len=5, measured=PLAIN * 1.3)
    assert rest.active and rest.saved > rest.host
    active = []
    for _ in range(60):  # the planner declines every proposal from now on
        if rest.active:
            rest.proposed()
        active.append(_step(rest, host=0.0004 if rest.active else 0.0))
    assert rest.saved > rest.host  # by its sums it still pays
    steps = [i for i, a in enumerate(active) if a]
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    assert gaps[:5] == [2, 3, 5, 9, 17]  # rests of 1, 2, 4, 8, 16 steps
    assert max(gaps) <= Rest.MAX_DECLINE_GAP + 1 and sum(active) <= 7
    while not rest.active:
        _step(rest, host=0.0)
    rest.proposed()
    _step(rest, host=0.0004, drafted=True, accepted=4, drafted_len=5, measured=PLAIN * 1.3)
    assert rest.active and rest._decline_gap == 0


def test_declined_period_steps_among_other_sequences_wait_for_the_doubling_gap():
    """A resting sequence's period steps (its sampled active steps) whose proposals the
    planner declines, in decodes that hold other sequences too, wait max(period, the
    doubling gap) before the next: at 4 slots of the 4-block model (a lone draft costs an
    ubatch) they were most of auto's proposals, nearly all declined (83-92 of ~120-130
    plans in 8 documents; 36-45 with the wait). Alone in its decodes a sequence keeps its
    period; a verified draft ends the wait."""
    def period_steps(declined: bool, crowded: bool) -> list[int]:
        rest = Rest()
        steps = []
        for i in range(600):  # proposals that never pay: the policy rests
            if rest.active and i >= Rest.WARMUP:
                steps.append(i)
                if declined:
                    rest.proposed()
            rest.spent(0.0004 if rest.active else 0.0)
            rest.decode(PLAIN, PLAIN, 1, False, crowded)
        return steps

    plain = period_steps(False, True)
    period = max(b - a for a, b in zip(plain[-5:], plain[-4:]))
    crowded = period_steps(True, True)
    gaps = [b - a for a, b in zip(crowded, crowded[1:])]
    assert max(gaps) == Rest.MAX_DECLINE_GAP + 1 > period  # rests of up to the gap
    assert len(crowded) < len(plain) == len(period_steps(True, False))
    rest = Rest()
    for _ in range(300):
        if rest.active:
            rest.proposed()
        rest.decode(PLAIN, PLAIN, 1, False, True)
    gap = rest._decline_gap
    while not rest.active:
        rest.decode(PLAIN, PLAIN, 1, False, True)
    rest.proposed()
    rest.decode(PLAIN, PLAIN * 1.2, 1, True, True)
    assert gap > 0 and rest._decline_gap == 0


def test_the_policies_count_rested_steps():
    from ngramspec.speculative.cost import DecodeCost, Shape
    from ngramspec.speculative.policy import CostPolicy, FixedPolicy

    assert FixedPolicy().n_rested == 0 and FixedPolicy().rest_of(0) is None
    pol = CostPolicy(DecodeCost.linear(PLAIN, 0.0005), compare_all=True)
    for _ in range(100):
        pol.rests.spent(0, 0.0004)
        pol.rests.decode([Shape(0, 1, 1), Shape(1, 1, 1)], 0.0, PLAIN)
    assert pol.n_rested == pol.rest_of(0).n_rested + pol.rest_of(1).n_rested
    assert pol.rest_of(0).n_rested > 50 and pol.rest_of(1).n_rested == 0  # 1 spent nothing


def test_a_decode_is_shared_out_between_its_sequences():
    """Each sequence's Rest gets the plain decode's share; the verify's extra seconds go
    to the sequences that drafted, by draft length; a step's shared host time to those
    that worked in it."""
    from ngramspec.speculative.cost import Shape
    from ngramspec.speculative.rest import Rests

    rests = Rests()
    rests.spent(0, 0.0001)
    rests.spent(None, 0.0004)
    rests.decode([Shape(0, 4, 4), Shape(1, 1, 1), Shape(2, 2, 2)], 0.003, 0.007)
    r0, r1, r2 = (rests.of(i) for i in range(3))
    assert abs(r0.host - 0.0005) < 1e-12 and r1.host == r2.host == 0.0
    assert r0._open == (0.001, 0.001 + 0.004 * 3 / 4, 1) and r1._open is None
    assert r2._open == (0.001, 0.002, 1)
    assert abs(r1.decode_s - 0.001) < 1e-12


class _Resting(Rest):
    """A Rest that always rests (its `active` is False whatever it measures)."""

    active = property(lambda self: False, lambda self, value: None)


def test_an_idle_policy_asks_only_a_prediction_for_proposals(auto_engine, monkeypatch):
    """While the policy rests a sequence (`rest_of`) and no chain's watch fires, a step
    asks no sequence for proposals (spec-off's host path) but one with a prediction of its
    own; the output is spec-off's."""
    import numpy as np

    from ngramspec.speculative.drafters.chain import DrafterChain
    from ngramspec.speculative.policy import CostPolicy
    from ngramspec.speculative.speculation import Speculation
    from test_own_budget import _run

    eng = auto_engine
    prompt = eng.model.tokenize("one two three four five six seven eight " * 4)
    plain, _ = _run(eng, prompt, 48, speculative=False)
    resting = _Resting()
    monkeypatch.setattr(CostPolicy, "rest_of", lambda self, seq_id: resting)
    monkeypatch.setattr(DrafterChain, "watch", lambda *a: [])
    monkeypatch.setattr(Speculation, "copying", property(lambda self: False,  # no copy followed
                                                         lambda self, value: None), raising=False)
    asked = []
    real = CostPolicy.options
    monkeypatch.setattr(CostPolicy, "options",
                        lambda pol, sp, *a: asked.append(sp.own) or real(pol, sp, *a))
    out, _ = _run(eng, prompt, 48)
    assert out == plain and asked == []
    out, (drafted, accepted) = _run(eng, prompt, 48, prediction=np.asarray(plain, dtype=np.int32))
    assert out == plain and asked and all(asked) and accepted > 0


def test_a_resting_policy_watches_for_a_copy(auto_engine, monkeypatch):
    """While the policy rests a sequence, each step still asks the chain's watcher (auto:
    the drafter keyed on the most tokens, ngram-mod-n16) for one lookup; where it matches,
    that sequence proposes and the step counts as an active one (`Rest.wake`), and it goes
    on proposing while it follows the copy (`Speculation.copying`). A chain without a
    drafter whose draft leaves no state (map-k only) does not watch. Output: spec-off's."""
    from ngramspec.settings.config import AUTO, SpecConfig
    from ngramspec.speculative.drafters.chain import DrafterChain, watcher
    from ngramspec.speculative.policy import CostPolicy
    from ngramspec.speculative.rest import Rest
    from test_own_budget import _run

    assert watcher(DrafterChain(SpecConfig().with_types(AUTO)).drafters).name == "ngram-mod-n16"
    assert watcher(DrafterChain(SpecConfig().with_types(("ngram-map-k",))).drafters) is None
    eng = auto_engine
    prompt = eng.model.tokenize("one two three four five six seven eight " * 8)
    plain, _ = _run(eng, prompt, 48, speculative=False)
    resting = _Resting()
    monkeypatch.setattr(CostPolicy, "rest_of", lambda self, seq_id: resting)
    woken = []
    real = Rest.wake
    monkeypatch.setattr(Rest, "wake", lambda r: woken.append(1) or real(r))
    out, _ = _run(eng, prompt, 48)
    accepted = sum(s.n_acc_tokens for s in eng.stats().values())
    assert out == plain and woken and accepted > 0


@pytest.fixture
def auto_engine(fast_model_path, threads):
    """An engine with --spec-type auto on the fast model, closed after the test."""
    from ngramspec.engine.runtime import load_engine
    from ngramspec.settings.engine import EngineSettings
    from ngramspec.settings.config import AUTO, SpecConfig

    eng = load_engine(EngineSettings(model=fast_model_path, n_ctx=1024, threads=threads,
                                     spec=SpecConfig().with_types(AUTO)))
    yield eng
    eng.ctx.close()
    eng.model.close()
