"""N-gram hashing shared by every drafter: one polynomial hash, three ways to compute it.

The hash of the n tokens t[0..n-1] is llama.cpp ngram-mod's LCG polynomial
    h = (...((t0 * P + t1) * P + t2) ...) * P + t[n-1]   (mod 2**64),  P = 6364136223846793005.

Invariant: `ngram_hashes(a, n)[j] == ngram_hash(a[j:j+n])`, and rolling a hash by one
token, h' = (h - t_out * P**(n-1)) * P + t_in, gives the next window's hash (the hot loops
in pool.put_ngrams and ngram_mod inline that), so bulk (numpy) insertion and per-token
(Python int) lookups agree.
"""
from __future__ import annotations

import functools

import numpy as np

P = 6364136223846793005
MASK64 = (1 << 64) - 1
_P64 = np.uint64(P)


def ngram_hash(tokens) -> int:
    """Hash of one n-gram (any sequence of ints) as a Python int."""
    h = 0
    for t in tokens:
        h = (h * P + int(t)) & MASK64
    return h


def ngram_hashes(tokens: np.ndarray, n: int) -> np.ndarray:
    """Hashes of every n-gram window of `tokens` (length len-n+1, or 0), vectorised.

    numpy's uint64 arithmetic wraps modulo 2**64, exactly like the scalar form;
    the sum of t[j+i] * P**(n-1-i) equals the Horner form.
    """
    count = len(tokens) - n + 1
    if count <= 0:
        return np.zeros(0, dtype=np.uint64)
    t = tokens.astype(np.uint64, copy=False)
    if count * n <= 1 << 15:  # small: one product-sum over a strided view
        windows = np.lib.stride_tricks.sliding_window_view(t, n)
        with np.errstate(over="ignore"):
            return (windows * _powers(n)).sum(axis=1, dtype=np.uint64)
    h = t[:count].copy()
    with np.errstate(over="ignore"):
        for i in range(1, n):
            h *= _P64
            h += t[i:i + count]
    return h


@functools.lru_cache(maxsize=64)
def _powers(n: int) -> np.ndarray:
    """[P**(n-1), ..., P, 1] mod 2**64 as uint64."""
    return np.array([pow(P, n - 1 - i, 1 << 64) for i in range(n)], dtype=np.uint64)


def key_of(hist, last: int, n: int) -> list[int]:
    """The n-gram a draft looks up: the last n - 1 tokens of `hist` + `last` (the token
    just sampled), as Python ints (len(hist) >= n - 1)."""
    key = hist[len(hist) - n + 1:].tolist() if n > 1 else []
    key.append(last)
    return key


def power(n: int) -> int:
    """P**(n-1) mod 2**64: the weight of the oldest token in an n-gram hash."""
    return pow(P, n - 1, 1 << 64)
