"""Shared by the tests of ngramspec's kernels (test_own_*.py): `require`, which fails
rather than skips where a kernel should run; a context with a few sequences of a
repeated text in its cache, and the logits of a decode with one kernel switched on or off."""
from __future__ import annotations

import os
import shutil

import pytest

from ngramspec.llama.kernels import build, guard
from ngramspec.llama.context import Context, ContextParams


def require(kernel):
    """The kernel's library (kernels.kernel.Kernel). Where it should run (x86-64 with
    AVX2/FMA/F16C, a C compiler, the verified llama.cpp, not switched off) and does not,
    the test fails with the reason; elsewhere it is skipped with it."""
    import llama_cpp  # noqa: F401  (ggml's libraries, which the guard reads)

    lib, reason = kernel.state()
    if lib is not None:
        return lib
    should = (guard.cpu_reason() is None and shutil.which(build.compiler()) is not None
              and os.environ.get(kernel.env, "1") != "0" and guard.build_reason() is None)
    (pytest.fail if should else pytest.skip)(f"the {kernel.name} kernel is off: {reason}")

TEXT = "def mean(xs):\n    '''The mean of xs.'''\n    return sum(xs) / len(xs)\n" * 40


def filled_context(model, threads: int, n_seq: int, cells: int, shift: int) -> tuple[Context, list[int]]:
    """A batch-invariant context of n_seq sequences, each holding `cells` tokens of TEXT
    (sequence s from token s * shift), in decodes of 63; and TEXT's tokens."""
    c = Context(model, ContextParams(n_ctx=n_seq * 1024, n_seq_max=n_seq, n_threads=threads))
    toks = list(model.tokenize(TEXT))
    for s in range(n_seq):
        for a in range(0, cells, 63):
            c.decode([(s, toks[s * shift + a:s * shift + min(a + 63, cells)], a, False)])
    return c, toks


def logits(ctx: Context, hook, entries, on: bool = True) -> list:
    """The logit rows of decoding `entries` (after truncating each sequence to its first
    position) with the kernel of `hook` (a node_hook.NodeHook) on or off; leaves it on."""
    hook.hook.enabled = int(on)
    try:
        for s, _, p0, _ in entries:
            ctx.truncate(s, p0)
        rows = ctx.decode(entries)
        return [ctx.logits_at(i).copy() for r in rows for i in r]
    finally:
        hook.hook.enabled = 1


def same_top(a, b) -> bool:
    """Whether two approximations of one row of logits pick the same token, allowing a
    tie within their error: the argmaxes agree, or each row's margin between the two
    candidates is within the rows' typical difference (the 99th percentile of |a - b|
    over the row), so neither order is wrong. A margin above that is a disagreement."""
    import numpy as np

    i, j = int(np.argmax(a)), int(np.argmax(b))
    if i == j:
        return True
    tol = float(np.quantile(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)), 0.99))
    return float(a[i]) - float(a[j]) <= tol and float(b[j]) - float(b[i]) <= tol
