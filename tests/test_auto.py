"""Auto mode without a model: the cost policy on synthetic streams, and the memory plan."""
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ngramspec import NgramMapParams, SpecConfig
from ngramspec.settings.config import SPEC_TYPES
from ngramspec.speculative.cost import DecodeCost, Shape
from ngramspec.speculative.drafters import DrafterChain, NgramSimple
from ngramspec.speculative.memory import plan_auto
from ngramspec.speculative.policy import CostPolicy, FixedPolicy, majority
from ngramspec.speculative.pool import HashPool
from ngramspec.bench.replay import load_stream, replay_policy


def test_auto_turns_drafting_off_without_repeats_and_on_when_they_return():
    # 600 random tokens where short keys match by chance (drafts fail), then a long
    # verbatim repeat of an earlier span; CPU-like steep verify cost
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 8, 600).astype(np.int32)  # tiny alphabet: spurious 3-gram matches
    body = rng.integers(100, 5000, 300).astype(np.int32)
    tokens = np.concatenate([body, noise, body[:250], [1, 2]]).astype(np.int32)
    d = NgramSimple(NgramMapParams(size_n=3, size_m=32), HashPool(1 << 20))
    chain = DrafterChain(SpecConfig(types=("ngram-simple",)), drafters=[d])
    policy = CostPolicy(DecodeCost.linear(0.016, 0.006), compare_all=True)
    log = []
    replay_policy(chain, policy, policy.cost, tokens[:300], tokens[300:],
                  on_step=lambda pos, k, a: log.append((pos, k, a)))
    late_noise = [k for pos, k, _ in log if 650 <= pos < 900]
    repeat = [(k, a) for pos, k, a in log if 950 <= pos < 1130]
    assert sum(k > 0 for k in late_noise) <= 0.1 * len(late_noise)  # backed off
    assert sum(k > 0 for k, _ in repeat) >= 0.5 * len(repeat)  # drafting again
    assert sum(a for _, a in repeat) > 100  # and it pays: most of the repeat accepted


def test_memory_plan():
    spec = SpecConfig(types=("auto",), policy="cost")
    assert plan_auto(spec, None, 8 << 30).spec.enabled
    very_low = plan_auto(spec, None, 100 << 20)
    assert not very_low.spec.enabled and "speculation off" in very_low.note
    assert plan_auto(spec, None, None).note is None  # unknown memory: no limit
    named = SpecConfig(types=("ngram-mod",))
    assert plan_auto(named, None, 1 << 20).spec == named  # only auto adapts


def test_memory_plan_skips_a_draft_model_that_does_not_fit(tmp_path):
    f = tmp_path / "d.gguf"
    f.write_bytes(b"GGUF" + b"\0" * 1000)
    spec = SpecConfig(types=("auto",), policy="cost")
    low = plan_auto(spec, str(f), 600 << 20)
    assert low.spec.enabled and not low.use_draft_model and "draft model not loaded" in low.note
    assert plan_auto(spec, str(f), 8 << 30).use_draft_model


def _p(name, *tokens):
    return (SimpleNamespace(name=name), np.asarray(tokens, dtype=np.int32))


def test_majority_drops_a_lone_dissenter():
    # three drafters found the same copy, a short key found another occurrence
    props = [_p("a", 5, 6, 7), _p("b", 5, 6), _p("n5", 9, 9), _p("c", 5, 6, 7, 8)]
    assert [d.name for d, _ in majority(props)] == ["a", "b", "c"]
    # a tie (2 vs 2) is no majority: every proposal stays
    tie = [_p("a", 5), _p("b", 5), _p("c", 9), _p("d", 9)]
    assert majority(tie) == tie
    # with fewer than three proposals there is nothing to vote on
    two = [_p("a", 5), _p("b", 9)]
    assert majority(two) == two


# Verify cost measured through llama-cpp-python on a 2-core CPU (../shared/REFERENCE.md).
CPU_CURVE = DecodeCost.fit([([Shape(0, n, n)], t) for n, t in zip(
    [1, 2, 4, 8, 16, 32, 64], [.016, .027, .036, .055, .093, .176, .334])])
STREAMS = Path(__file__).resolve().parent.parent / "ngramspec" / "bench" / "fixtures" / "streams"


def _modelled(stream, types, policy):
    chain = DrafterChain(SpecConfig(types=()).with_types(types))
    return replay_policy(chain, policy, CPU_CURVE, stream.prompt, stream.generated[:256])


def test_auto_on_recorded_copy_reaches_long_drafts_and_beats_every_fixed_type():
    # refactor: the model copies a class; auto must reach drafts of tens of tokens
    # within a few steps instead of settling at the knee of the cost curve
    s = load_stream(STREAMS / "refactor.json")
    auto = _modelled(s, "auto", CostPolicy(CPU_CURVE, compare_all=True))
    assert auto.steps + auto.accepted == len(s.generated[:256]) - 1
    # a decode verifies at most 62 draft tokens per sequence (U2); the knee is ~15
    assert auto.tokens_per_step >= 25
    fixed = [_modelled(s, t, FixedPolicy()).modelled_speedup for t in SPEC_TYPES]
    assert auto.modelled_speedup >= 0.97 * max(fixed)


def test_auto_on_recorded_summary_beats_every_fixed_type():
    # summarize: quotes with skips in between; short keys resume the copy sooner
    s = load_stream(STREAMS / "summarize.json")
    auto = _modelled(s, "auto", CostPolicy(CPU_CURVE, compare_all=True))
    fixed = [_modelled(s, t, FixedPolicy()).modelled_speedup for t in SPEC_TYPES]
    assert auto.modelled_speedup > max(fixed)


def _observe(policy, sp, drafter, n_draft, n_acc, copying):
    """One verify step of `sp` in the given run state: a committed draft of n_draft
    tokens of which n_acc were accepted."""
    from ngramspec.speculative.speculation import DraftOptions

    sp.copying = copying
    draft = np.arange(n_draft, dtype=np.int32)
    sp.options = DraftOptions(proposals=[(drafter, draft)])
    sp.committed = (drafter.name, n_draft)
    emitted = [*draft[:n_acc].tolist(), -1]
    policy.observe(sp, emitted, n_acc)


def test_cost_policy_keeps_copy_and_fresh_statistics_apart():
    """Drafts that follow a copy (the previous draft accepted whole) and drafts found
    afresh are scored separately: the same drafter drafts long while copying and
    short after novel text, where its matches break early."""
    from ngramspec.speculative.speculation import Speculation

    d = NgramSimple(NgramMapParams(size_n=3, size_m=32), HashPool(1 << 20))
    policy = CostPolicy(CPU_CURVE, compare_all=True)
    sp = Speculation(0, DrafterChain(SpecConfig(types=("ngram-simple",)), drafters=[d]), policy)
    for _ in range(40):
        _observe(policy, sp, d, 30, 30, copying=True)   # a copy goes on
        _observe(policy, sp, d, 30, 1, copying=False)   # a fresh match breaks at 1
    sp.copying = True
    e_copy = policy.stats(sp, d).expected_tokens()
    sp.copying = False
    e_fresh = policy.stats(sp, d).expected_tokens()
    assert e_copy[30] > 25 and e_fresh[30] < 3
    table = CPU_CURVE.table(30)
    k_copy, k_fresh = np.argmax(e_copy[:31] / table), np.argmax(e_fresh[:31] / table)
    assert k_copy >= 20 and k_fresh <= 2
    # the run state follows the steps: all accepted -> copying, else fresh
    _observe(policy, sp, d, 5, 5, copying=False)
    assert sp.copying
    _observe(policy, sp, d, 5, 4, copying=True)
    assert not sp.copying


def test_first_copy_state_starts_from_what_the_sequence_learnt_fresh():
    """On a cold server (no global statistics) the copy state does not start from the
    bare prior: it takes the sequence's fresh statistics, so the first copy ramps up
    as fast as with one set of statistics."""
    from ngramspec.speculative.speculation import Speculation

    d = NgramSimple(NgramMapParams(size_n=3, size_m=32), HashPool(1 << 20))
    policy = CostPolicy(CPU_CURVE, compare_all=True)
    sp = Speculation(0, DrafterChain(SpecConfig(types=("ngram-simple",)), drafters=[d]), policy)
    for _ in range(3):
        _observe(policy, sp, d, 20, 20, copying=False)
    sp.copying = False
    fresh = policy.stats(sp, d).expected_tokens()
    sp.copying = True
    assert np.allclose(policy.stats(sp, d).expected_tokens(), fresh)
