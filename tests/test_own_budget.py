"""A request's prediction drafts within its record's credit (speculative/own_budget.py):
a prediction that the output leaves at once spends about START of the record's plain
time and then stops; a right one earns long drafts within a few steps; where extra rows
cost nothing (a fixed-shape context) nothing is capped."""
from __future__ import annotations

from ngramspec.speculative.cost import MAX_DRAFT, DecodeCost
from ngramspec.speculative.own_budget import START, OwnBudget

T1, ROW = 0.010, 0.0025  # a plain step, and each extra verify row (a CPU: 4 rows ~ a step)
COST = DecodeCost.linear(T1, ROW)


def test_a_wrong_prediction_spends_its_start_credit_and_stops():
    b = OwnBudget(n_pred=160)
    spent = 0.0
    for _ in range(50):
        k = b.cap(COST)
        if k == 0:
            break
        b.settle(COST, k, 0)  # rejected at its first token
        spent += k * ROW
    assert b.cap(COST) == 0
    assert spent <= START * T1 * 160 + ROW + 1e-12  # the start credit and one probe at most


def test_a_right_prediction_earns_long_drafts_within_a_few_steps():
    b = OwnBudget(n_pred=160)
    caps = []
    for _ in range(4):
        k = b.cap(COST)
        caps.append(k)
        b.settle(COST, k, k)  # accepted whole
    assert caps[0] >= 1 and caps == sorted(caps) and caps[-1] == MAX_DRAFT


def test_a_prediction_another_drafter_verified_earns_too():
    b = OwnBudget(n_pred=48)
    k0 = b.cap(COST)
    b.settle(COST, 0, 12)  # its proposal matched 12 emitted tokens of an n-gram draft
    assert b.cap(COST) > k0


def test_free_rows_are_never_capped():
    fixed = DecodeCost(per_ubatch=T1, per_token=0.0, per_logit=1e-4, fixed_rows=MAX_DRAFT + 1)
    b = OwnBudget(n_pred=10)
    b.settle(fixed, MAX_DRAFT, 0)
    assert b.cap(fixed) == MAX_DRAFT


def _run(engine, prompt, n, prediction=None, speculative=True):
    """Greedy tokens of one sequence, and its prediction's (drafted, accepted) tokens."""
    from together import run_alone

    out, st = run_alone(engine, prompt, n, prediction=prediction, speculative=speculative)
    return out, st.prediction


def test_a_spec_off_engine_prices_a_requests_prediction(fast_model_path, threads):
    """No spec type, the default --draft-policy cost: a request's prediction drafts within
    its record's credit (a prediction that agrees for 24 tokens, then leaves the output for
    good, is soon not drafted), where --draft-policy fixed drafts it at llama.cpp's lengths
    at every re-sync; the output is spec-off's either way. Steps of sequences that do not
    speculate teach the curve nothing (their host time is spec-off's)."""
    import numpy as np

    from ngramspec.engine.runtime import load_engine
    from ngramspec.settings.engine import EngineSettings
    from ngramspec.settings.config import SpecConfig
    from ngramspec.speculative.policy import CostPolicy, FixedPolicy

    n, rejected = 160, {}
    for policy in ("cost", "fixed"):
        eng = load_engine(EngineSettings(model=fast_model_path, n_ctx=1024, threads=threads,
                                         spec=SpecConfig(types=(), policy=policy)))
        try:
            assert isinstance(eng.policy, CostPolicy if policy == "cost" else FixedPolicy)
            prompt = eng.model.tokenize("Once upon a time, in a small village by the sea,")
            plain, _ = _run(eng, prompt, n, speculative=False)
            if policy == "cost":
                assert eng.policy.tracker.n_observed == 0  # nothing speculated: nothing learnt
            junk = np.asarray(plain[::-1], dtype=np.int32) % 5000 + 100  # never the output
            pred = np.concatenate([np.asarray(plain[:24], dtype=np.int32), junk, junk])
            out, (drafted, accepted) = _run(eng, prompt, n, prediction=pred)
            assert out == plain
            rejected[policy] = drafted - accepted
        finally:
            eng.ctx.close()
            eng.model.close()
    # measured: 37 against 970 (the credit: START of a 344-token prediction's plain time)
    assert rejected["cost"] * 10 <= rejected["fixed"], rejected
