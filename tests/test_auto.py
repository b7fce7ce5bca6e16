"""Auto mode without a model: the cost policy on synthetic streams, and the memory plan."""
from types import SimpleNamespace

import numpy as np

from ngramspec import NgramMapParams, SpecConfig
from ngramspec.cost import VerifyCost
from ngramspec.drafters import DrafterChain, NgramSimple
from ngramspec.memory import plan_auto
from ngramspec.policy import CostPolicy
from ngramspec.pool import HashPool


def run_policy(policy, chain, tokens, n_prompt):
    """Verify loop over a known token stream (the 'model' emits tokens[i]); returns,
    per step, (position, drafted length, accepted)."""
    st = SimpleNamespace(seq_id=0, chain=chain, tokens=tokens, n_hist=n_prompt,
                         sampled=int(tokens[n_prompt]))
    chain.begin(0, tokens[:n_prompt])
    log = []
    while st.n_hist + 2 < len(tokens):
        draft = policy.plan(st, room=len(tokens) - st.n_hist - 2, base=0)
        truth = tokens[st.n_hist + 1:st.n_hist + 1 + len(draft)]
        neq = np.flatnonzero(draft != truth)
        acc = int(neq[0]) if len(neq) else len(draft)
        emitted = tokens[st.n_hist + 1:st.n_hist + 2 + acc].tolist()
        if len(draft):
            chain.accept(0, acc)
        policy.observe(st, emitted, acc)
        log.append((st.n_hist, len(draft), acc))
        st.n_hist += 1 + acc
        st.sampled = int(tokens[st.n_hist])
    return log


def test_auto_turns_drafting_off_without_repeats_and_on_when_they_return():
    # 600 random tokens where short keys match by chance (drafts fail), then a long
    # verbatim repeat of an earlier span; CPU-like steep verify cost
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 8, 600).astype(np.int32)  # tiny alphabet: spurious 3-gram matches
    body = rng.integers(100, 5000, 300).astype(np.int32)
    tokens = np.concatenate([body, noise, body[:250], [1, 2]]).astype(np.int32)
    d = NgramSimple(NgramMapParams(size_n=3, size_m=32), HashPool(1 << 20))
    chain = DrafterChain(SpecConfig(types=("ngram-simple",)), drafters=[d])
    policy = CostPolicy(VerifyCost.linear(0.016, 0.006), compare_all=True)
    log = run_policy(policy, chain, tokens, n_prompt=300)
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
