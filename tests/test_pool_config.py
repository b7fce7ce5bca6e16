"""The shared pool's constant memory, hashing agreement, and configuration errors."""
import tracemalloc

import numpy as np
import pytest

from ngramspec import SPEC_TYPES, ConfigError, HashPool, SpecConfig, TokenError, parse_spec_types
from ngramspec.settings.config import spec_config_from_options
from ngramspec.speculative.drafters import DrafterChain, as_tokens
from ngramspec.speculative.hashing import ngram_hash, ngram_hashes

ALL = SpecConfig(types=SPEC_TYPES)


def _ingest(n_tokens: int, n_seqs: int) -> tuple[DrafterChain, int]:
    """Run every drafter over n_seqs sequences of n_tokens; return the chain and the
    bytes still allocated by it (tracemalloc), inputs excluded."""
    rng = np.random.default_rng(n_tokens)
    hists = []
    for _ in range(n_seqs):  # fresh text, whose last 600 tokens repeat an earlier span
        body = rng.integers(0, 262144, n_tokens - 600).astype(np.int32)
        hists.append(np.concatenate([body, body[100:700]]))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    chain = DrafterChain(ALL)
    for s, hist in enumerate(hists):
        chain.begin(s, hist[:n_tokens - 64])
        for L in range(n_tokens - 64, n_tokens - 1, 8):  # some generation steps too
            chain.draft(s, hist[:L], int(hist[L]), 16)
            chain.accept(s, 1)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return chain, held


def test_pool_bytes_do_not_grow_with_context_or_sequences():
    # same pool size and the same drafter footprint for 2k vs 64k tokens, 1 vs 8 sequences
    _ingest(2048, 2)  # warm-up: lazy imports and caches are not the drafters' state
    small, held_small = _ingest(2048, 1)
    long_, held_long = _ingest(65536, 1)
    many, held_many = _ingest(2048, 8)
    assert small.pool.nbytes == long_.pool.nbytes == many.pool.nbytes == 16 << 20
    assert long_.pool.used > small.pool.used  # the long context really was ingested
    # drafter state beyond the pool: a few KiB per sequence, never per token
    assert abs(held_long - held_small) < 64 << 10
    assert held_many - held_small < 8 * (16 << 10)


def test_pool_reports_occupancy_and_resets():
    pool = HashPool(1 << 16)
    pool.put_many(np.arange(1, 101, dtype=np.uint64), 3, np.arange(100))
    assert pool.used == int(np.count_nonzero(pool.table)) and 0 < pool.occupancy < 1
    pool.clear()
    assert pool.used == 0 and pool.resets == 1 and not pool.table.any()


def test_bulk_and_scalar_paths_agree():
    # numpy bulk insert, the scalar rolling insert and single gets see the same keys
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 262144, 3000).astype(np.int32)
    for n in (1, 3, 12, 24):
        hs = ngram_hashes(toks, n)
        assert int(hs[17]) == ngram_hash(toks[17:17 + n].tolist())
        a, b = HashPool(1 << 20), HashPool(1 << 20)
        a.put_many(hs, 5, np.arange(len(hs)))
        b.put_ngrams(toks.tolist(), n, 5, range(len(hs)))
        assert np.array_equal(a.table, b.table) and a.used == b.used


def test_put_many_keep_first_keeps_the_earliest():
    pool = HashPool(1 << 16)
    keys = np.array([7, 7, 9], dtype=np.uint64)
    pool.put_many(keys, 1, np.array([1, 2, 3]), keep="first")
    pool.put_many(keys[:1], 1, np.array([4]), keep="first")
    assert pool.get(7, 1) == 1 and pool.get(9, 1) == 3


@pytest.mark.parametrize("value,match", [
    ("ngram-foo", "valid values: ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, auto, none"),
    ("", "empty"),
    ("none,ngram-mod", "cannot be combined"),
])
def test_bad_spec_type_names_the_valid_values(value, match):
    with pytest.raises(ConfigError, match=match):
        parse_spec_types(value)


def test_spec_type_list_parses_in_order():
    assert parse_spec_types("ngram-mod, ngram-map-k4v") == ("ngram-mod", "ngram-map-k4v")
    assert parse_spec_types("none") == ()


@pytest.mark.parametrize("options,match", [
    ({"spec_ngram_size_n": 0}, r"size-n \(n\) must be between 1 and 1024"),
    ({"spec_ngram_simple_size_m": 0}, r"size-m \(m\) must be between 1 and 1024"),
    ({"spec_ngram_mod_n_match": 2000}, "between 1 and 1024"),
    ({"draft_min": 8, "draft_max": 4}, r"--draft-min \(8\) must not exceed --draft-max \(4\)"),
    ({"draft_max": -1}, "--draft-max must be >= 0"),
    ({"spec_ngram_mod_n_min": 50, "spec_ngram_mod_n_max": 10}, "n-min"),
])
def test_bad_numbers_are_config_errors(options, match):
    with pytest.raises(ConfigError, match=match):
        spec_config_from_options(**options)


def test_generic_flags_apply_to_every_type_and_per_type_flags_override():
    cfg = spec_config_from_options(spec_ngram_size_n=8, spec_ngram_map_k_size_n=4,
                                   spec_ngram_size_m=16)
    assert cfg.ngram_simple.size_n == 8 and cfg.ngram_map_k.size_n == 4
    assert cfg.ngram_mod.n_match == 8 and cfg.ngram_mod.n_max == 16
    assert cfg.ngram_mod.n_min == 16  # lowered with n_max rather than refused


@pytest.mark.parametrize("tokens", [[1, "a", 3], [1.5], [-1], [True]])
def test_non_integer_tokens_are_rejected(tokens):
    with pytest.raises(TokenError, match="non-negative"):
        as_tokens(tokens)
