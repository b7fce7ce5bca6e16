"""Drafter unit tests on hand-written token arrays; one comment per case.

Conventions: `h(...)` builds an int32 history; `sampled` is the token the target
just produced (not part of the history), as in llama.cpp.
"""
import numpy as np
import pytest

from ngramspec import HashPool, NgramMapParams, NgramModParams, SpecConfig
from ngramspec.speculative.drafters import (DrafterChain, NgramMapK, NgramMapK4V, NgramMod, NgramSimple,
                                dominant, value_counts)


def h(*tokens):
    return np.asarray(tokens, dtype=np.int32)


def seq(start, stop):
    return list(range(start, stop))


SMALL = NgramMapParams(size_n=2, size_m=3, min_hits=1)


# ----------------------------------------------------------------- ngram-simple


def test_simple_drafts_what_followed_the_earlier_occurrence():
    # key (5, 6) appeared at 4..5 followed by 7 8 9; history long enough (> n+m+1)
    d = NgramSimple(SMALL, HashPool(1 << 16))
    hist = h(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 5)
    d.begin(0, hist)
    assert d.draft(0, hist, 6, 16).tolist() == [7, 8, 9]


def test_simple_no_match_gives_empty():
    # key (11, 42) never occurred
    d = NgramSimple(SMALL, HashPool(1 << 16))
    hist = h(*seq(1, 12))
    d.begin(0, hist)
    assert len(d.draft(0, hist, 42, 16)) == 0


def test_simple_short_history_gives_empty():
    # llama.cpp needs len(history) > n + m + 1 = 6; here it is 6
    d = NgramSimple(SMALL, HashPool(1 << 16))
    hist = h(5, 6, 7, 8, 9, 5)
    d.begin(0, hist)
    assert len(d.draft(0, hist, 6, 16)) == 0


def test_simple_continuation_shorter_than_n_gives_empty():
    # key (8, 9) occurred at 7..8, but only one token (8) follows it: < n=2
    d = NgramSimple(SMALL, HashPool(1 << 16))
    hist = h(1, 2, 3, 4, 5, 6, 7, 8, 9, 8)
    d.begin(0, hist)
    assert len(d.draft(0, hist, 9, 16)) == 0


def test_simple_uses_most_recent_occurrence_and_caps_length():
    # key (1, 2) occurs twice: followed by 3 4 5 first, then by 7 8 9; the recent one wins;
    # max_len=2 cuts the m=3 draft
    d = NgramSimple(SMALL, HashPool(1 << 16))
    hist = h(1, 2, 3, 4, 5, 1, 2, 7, 8, 9, 0, 0, 1)
    d.begin(0, hist)
    assert d.draft(0, hist, 2, 16).tolist() == [7, 8, 9]
    assert d.draft(0, hist, 2, 2).tolist() == [7, 8]


def test_simple_sees_tokens_appended_after_begin():
    # the occurrence is only in tokens generated after begin(): the index catches up
    d = NgramSimple(SMALL, HashPool(1 << 16))
    prompt = h(*seq(100, 110))
    d.begin(0, prompt)
    hist = np.concatenate([prompt, h(1, 2, 3, 4, 5, 6, 1)])
    assert d.draft(0, hist, 2, 16).tolist() == [3, 4, 5]


# ----------------------------------------------------------------- ngram-map-k


def test_map_k_drafts_m_tokens_after_the_key():
    # needs len >= 2n+m = 7; key (5, 6) at 4..5 is followed by a full m-gram 7 8 9
    d = NgramMapK(SMALL, HashPool(1 << 16))
    hist = h(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 5)
    d.begin(0, hist)
    assert d.draft(0, hist, 6, 16).tolist() == [7, 8, 9]


def test_map_k_needs_a_full_m_gram_after_the_match():
    # key (8, 9) at 7..8 is followed by only 2 tokens (10, 8) < m=3: no draft
    d = NgramMapK(SMALL, HashPool(1 << 16))
    hist = h(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 8)
    d.begin(0, hist)
    assert len(d.draft(0, hist, 9, 16)) == 0


def test_map_k_min_hits_delays_the_first_draft():
    # min_hits=2: the first time the key is found it only counts a hit
    d = NgramMapK(NgramMapParams(2, 3, min_hits=2), HashPool(1 << 16))
    hist = h(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 5)
    d.begin(0, hist)
    assert len(d.draft(0, hist, 6, 16)) == 0
    assert d.draft(0, hist, 6, 16).tolist() == [7, 8, 9]


def test_map_k_remembers_accepted_length_per_key():
    # after 1 of 3 tokens was accepted, the same key drafts at most 1 token
    d = NgramMapK(SMALL, HashPool(1 << 16))
    hist = h(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 5)
    d.begin(0, hist)
    assert len(d.draft(0, hist, 6, 16)) == 3
    d.accept(0, 1)
    assert d.draft(0, hist, 6, 16).tolist() == [7]


def test_map_k_fully_rejected_key_drafts_nothing_again():
    # llama.cpp: n_accepted = 0 makes the key's draft length 0
    d = NgramMapK(SMALL, HashPool(1 << 16))
    hist = h(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 5)
    d.begin(0, hist)
    d.draft(0, hist, 6, 16)
    d.accept(0, 0)
    assert len(d.draft(0, hist, 6, 16)) == 0


def test_map_k_statistics_do_not_leak_into_the_next_request():
    # a new begin() starts with fresh per-key statistics (the key drafts m tokens again)
    d = NgramMapK(SMALL, HashPool(1 << 16))
    hist = h(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 5)
    d.begin(0, hist)
    d.draft(0, hist, 6, 16)
    d.accept(0, 0)
    d.end(0)
    d.begin(0, hist)
    assert d.draft(0, hist, 6, 16).tolist() == [7, 8, 9]


# ----------------------------------------------------------------- ngram-map-k4v


def test_value_counts_counts_distinct_continuations_in_order():
    # key (1, 2) followed by A=(3,) three times and B=(4,) once; n=2, m=1
    hist = h(1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2, 3, 0)
    assert value_counts(hist, [1, 2], 2, 1) == [(2, 3), (5, 1)]


def test_value_counts_keeps_only_four_distinct_values():
    # five different continuations: the fifth is ignored, as in llama.cpp
    hist = h(1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2, 6, 1, 2, 7, 0)
    assert [c for _, c in value_counts(hist, [1, 2], 2, 1)] == [1, 1, 1, 1]
    assert len(value_counts(hist, [1, 2], 2, 1)) == 4


def test_value_counts_ignores_occurrences_without_full_continuation():
    # the last (1, 2) has no token after it
    hist = h(1, 2, 3, 1, 2)
    assert value_counts(hist, [1, 2], 2, 1) == [(2, 1)]


@pytest.mark.parametrize("counts,expected", [
    ([(0, 3), (9, 1)], 0),          # 3 >= 2*1: the most frequent value dominates
    ([(0, 2), (9, 1)], 0),          # 2 >= 2*1: exactly twice still dominates
    ([(0, 2), (9, 2)], -1),         # a tie: nothing drafts
    ([(0, 3), (9, 1), (5, 1)], -1),  # 3 < 2*(1+1): not dominant enough
    ([(0, 1)], 0),                  # the only value drafts
    ([], -1),                       # no value at all
])
def test_dominance_rule(counts, expected):
    assert dominant(counts) == expected


def test_k4v_drafts_the_dominant_value():
    # key (1, 2) -> (3, 9) twice and (4, 9) once: (3, 9) dominates 2 >= 2*1
    d = NgramMapK4V(NgramMapParams(2, 2, 1), HashPool(1 << 16))
    hist = h(1, 2, 3, 9, 1, 2, 4, 9, 1, 2, 3, 9, 0, 1)
    d.begin(0, hist)
    assert d.draft(0, hist, 2, 16).tolist() == [3, 9]


def test_k4v_without_dominant_value_does_not_draft():
    # key (1, 2) -> (3, 9) twice and (4, 9) twice: no value dominates
    d = NgramMapK4V(NgramMapParams(2, 2, 1), HashPool(1 << 16))
    hist = h(1, 2, 3, 9, 1, 2, 4, 9, 1, 2, 3, 9, 1, 2, 4, 9, 0, 1)
    d.begin(0, hist)
    assert len(d.draft(0, hist, 2, 16)) == 0


def test_k4v_min_hits():
    # min_hits=3: two lookups only count hits, the third drafts
    d = NgramMapK4V(NgramMapParams(2, 2, 3), HashPool(1 << 16))
    hist = h(1, 2, 3, 9, 5, 5, 5, 5, 0, 1)
    d.begin(0, hist)
    assert [len(d.draft(0, hist, 2, 16)) for _ in range(3)] == [0, 0, 2]


# ----------------------------------------------------------------- ngram-mod

MOD = NgramModParams(n_match=2, n_min=2, n_max=4)


def test_mod_rolls_through_the_table():
    # prompt teaches 1 2 -> 3, 2 3 -> 4, 3 4 -> 5, 4 5 -> 6; draft from (.., 1) + sampled 2
    d = NgramMod(MOD, HashPool(1 << 16))
    prompt = h(1, 2, 3, 4, 5, 6, 0, 1)
    d.begin(0, prompt)
    assert d.draft(0, prompt, 2, 16).tolist() == [3, 4, 5, 6]


def test_mod_stops_at_n_max_and_the_callers_cap():
    # n_max=4 bounds the roll; a caller cap of 3 truncates after the n_min check
    d = NgramMod(MOD, HashPool(1 << 16))
    prompt = h(*seq(1, 12), 0, 1)
    d.begin(0, prompt)
    assert d.draft(0, prompt, 2, 16).tolist() == [3, 4, 5, 6]
    assert d.draft(0, prompt, 2, 3).tolist() == [3, 4, 5]


def test_mod_discards_drafts_shorter_than_n_min():
    # the prompt teaches only (1, 2) -> 3, so the chain breaks after 1 token; n_min=2
    d = NgramMod(MOD, HashPool(1 << 16))
    d.begin(0, h(1, 2, 3))
    assert len(d.draft(0, h(7, 1), 2, 16)) == 0


def test_mod_n_min_is_checked_before_the_cap():
    # a cap of 1 still needs n_min=2 tokens to exist: a 1-token chain drafts nothing,
    # a 2-token chain (1 2 -> 3, 2 3 -> 4) drafts and is then cut to 1
    short, long_ = NgramMod(MOD, HashPool(1 << 16)), NgramMod(MOD, HashPool(1 << 16))
    short.begin(0, h(1, 2, 3))
    long_.begin(0, h(1, 2, 3, 4))
    assert len(short.draft(0, h(7, 1), 2, 1)) == 0
    assert long_.draft(0, h(7, 1), 2, 1).tolist() == [3]


def test_mod_table_is_shared_across_sequences():
    # sequence 1 drafts from n-grams that only sequence 0's prompt contained
    pool = HashPool(1 << 16)
    d = NgramMod(MOD, pool)
    d.begin(0, h(1, 2, 3, 4, 5, 6))
    d.begin(1, h(9, 9, 1))
    assert d.draft(1, h(9, 9, 1), 2, 16).tolist() == [3, 4, 5, 6]


def test_mod_occupancy_reset_at_request_start():
    # a pool more than 25% full is cleared when a request begins
    pool = HashPool(1 << 13)  # 1024 slots
    d = NgramMod(MOD, pool)
    d.begin(0, np.arange(1000, dtype=np.int32))
    assert pool.occupancy > 0.25
    d.begin(1, h(1, 2, 3, 4))
    assert pool.resets == 1 and pool.used == 2


def test_mod_low_acceptance_streak_resets_the_table_when_alone():
    # 5 drafts accepted below 25% -> the table is emptied (as llama.cpp)
    d = NgramMod(MOD, HashPool(1 << 16))
    prompt = h(1, 2, 3, 4, 5, 6, 0, 1)
    d.begin(0, prompt)
    for _ in range(5):
        assert len(d.draft(0, prompt, 2, 16)) == 4
        d.accept(0, 0)
    assert d.n_resets == 1
    assert len(d.draft(0, prompt, 2, 16)) == 0


def test_mod_low_acceptance_streak_of_one_slot_keeps_the_others_table():
    # two active sequences: slot 0's streak must not wipe what slot 1 drafts from
    d = NgramMod(MOD, HashPool(1 << 16))
    p0, p1 = h(1, 2, 3, 4, 5, 6, 0, 1), h(7, 8, 9, 10, 11, 0, 7)
    d.begin(0, p0)
    d.begin(1, p1)
    for _ in range(5):
        d.draft(0, p0, 2, 16)
        d.accept(0, 0)
    assert d.n_resets == 0 and d.n_refreshes == 1
    assert d.draft(1, p1, 8, 16).tolist() == [9, 10, 11, 0]


# ----------------------------------------------------------------- collisions


def _colliding_keys(pool, salt, want_same_tag):
    """Two hashes in the same slot, with equal or different tags (found by search)."""
    seen = {}
    for k in range(1, 200000):
        i, tag = pool.locate(k, salt)
        if i in seen and (seen[i][1] == tag) == want_same_tag:
            return seen[i][0], k
        seen.setdefault(i, (k, tag))
    raise AssertionError("no collision found among 200,000 keys: the search is broken")


def test_pool_tag_rejects_another_key_in_the_same_slot():
    # same slot, different tag: the second key misses instead of reading the first's value
    pool = HashPool(1 << 13)
    a, b = _colliding_keys(pool, 7, want_same_tag=False)
    pool.put(a, 7, 42)
    assert pool.get(a, 7) == 42 and pool.get(b, 7) == -1


def test_index_collision_is_verified_before_drafting():
    # a tiny pool makes n-gram positions collide; every draft must still be the
    # real continuation of a real earlier occurrence of the key
    rng = np.random.default_rng(0)
    base = rng.integers(0, 50, 400).astype(np.int32)
    hist = np.concatenate([base, base[:200]])
    for cls in (NgramSimple, NgramMapK):
        d = cls(NgramMapParams(3, 4, 1), HashPool(1 << 13))
        d.begin(0, hist[:300])
        for L in range(300, 599):
            out = d.draft(0, hist[:L], int(hist[L]), 8)
            if len(out):
                key = hist[L - 2:L + 1]
                starts = [j for j in range(L - 3) if (hist[j:j + 3] == key).all()
                          and hist[j + 3:j + 3 + len(out)].tolist() == out.tolist()]
                assert starts, (cls.name, L)


def test_mod_in_a_saturated_pool_only_proposes():
    # 1024 slots, thousands of n-grams: drafts may be wrong but the replay stays exact
    from ngramspec.bench.replay import replay
    rng = np.random.default_rng(1)
    toks = rng.integers(0, 30, 3000).astype(np.int32)
    cfg = SpecConfig(types=("ngram-mod",), pool_bytes=1 << 13,
                     ngram_mod=NgramModParams(n_match=3, n_min=1, n_max=8))
    r = replay(DrafterChain(cfg), toks[:2000], toks[2000:])
    assert r.steps + r.accepted == len(toks) - 2000 - 1
    assert r.accepted <= r.drafted


# ----------------------------------------------------------------- chain


def test_chain_first_non_empty_draft_wins_and_gets_the_accept():
    # ngram-mod (first) has nothing for this key, so ngram-simple drafts and is credited
    cfg = SpecConfig(types=("ngram-mod", "ngram-simple"), ngram_simple=SMALL)
    chain = DrafterChain(cfg)
    hist = h(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 5)
    chain.begin(0, hist)
    assert chain.draft(0, hist, 6, 16).tolist() == [7, 8, 9]
    chain.accept(0, 2)
    assert chain.stats["ngram-simple"].n_acc_tokens == 2
    assert chain.stats["ngram-mod"].n_call_accept == 0


def test_chains_count_once_and_keep_counts_past_eviction(monkeypatch):
    """Every chain of an engine counts into one dict per drafter name; an evicted
    chain's counts stay, and the accepted-per-position histogram spans the
    positions offered."""
    from ngramspec.speculative.drafters import chains as chains_mod
    from ngramspec.speculative.stats import total

    monkeypatch.setattr(chains_mod, "MAX_CONFIGS", 1)
    cs = chains_mod.Chains(HashPool(1 << 16))
    hist = h(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 5)
    for draft_max in (3, 2):  # the second config evicts the first chain
        chain = cs.get(SpecConfig(types=("ngram-simple",), ngram_simple=SMALL,
                                  draft_max=draft_max))
        chain.begin(0, hist)
        assert len(chain.draft(0, hist, 6, 16)) == draft_max
        chain.accept(0, 1)
    st = cs.stats()["ngram-simple"]
    assert (st.n_gen_drafts, st.n_gen_tokens, st.n_acc_tokens) == (2, 5, 2)
    assert st.acc_per_pos == [2, 0, 0]
    t = total(cs.stats())
    assert (t.n_gen_tokens, t.acc_per_pos) == (5, [2, 0, 0])


def test_chain_applies_draft_max_and_draft_min():
    # draft_max=2 truncates; draft_min=3 then drops the 2-token draft
    hist = h(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 5)
    capped = DrafterChain(SpecConfig(types=("ngram-simple",), ngram_simple=SMALL, draft_max=2))
    capped.begin(0, hist)
    assert capped.draft(0, hist, 6, 16).tolist() == [7, 8]
    dropped = DrafterChain(SpecConfig(types=("ngram-simple",), ngram_simple=SMALL,
                                      draft_min=3, draft_max=3))
    dropped.begin(0, hist)
    assert dropped.draft(0, hist, 6, 2).tolist() == []


def test_stats_lines_have_llama_cpp_shape():
    s = DrafterChain(SpecConfig(types=("ngram-mod",))).stats["ngram-mod"]
    s.n_gen_tokens, s.n_acc_tokens = 297, 171
    from ngramspec.speculative.stats import acceptance_line
    assert acceptance_line(171, 297) == \
        "draft acceptance rate = 0.57576 (  171 accepted /   297 generated)"
    assert s.line().startswith("statistics ngram_mod: #calls(b,g,a) = 0 0 0, #gen drafts = 0")


def test_timings_host_time_is_per_verify_step_not_per_token():
    """`host_per_step_us` divides the host time by the decodes (verify steps) that
    emitted the tokens, not by the tokens: 100 tokens in 20 steps, 4 ms of host time."""
    from ngramspec.speculative.stats import timings

    t = timings(10, 5.0, 100, 200.0, host_ms=4.0, verify_steps=20)
    assert t["host_ms"] == 4.0 and t["host_per_step_us"] == 200.0
    assert t["predicted_per_second"] == 99 / 0.2  # llama.cpp's rate still counts tokens
    assert "host_ms" not in timings(10, 5.0, 100, 200.0)


def test_statistics_line_counts_declined_proposals():
    from ngramspec.speculative.stats import DrafterStats

    s = DrafterStats("ngram-mod", n_prop_drafts=7, n_gen_drafts=3)
    assert s.n_declined == 4 and s.as_dict()["n_declined"] == 4
    assert s.line().endswith("#prop drafts = 7, #declined = 4")
