#!/usr/bin/env python
"""Do 2 MiB pages under the generation weights make decodes faster? (issue 22)

    python experiments/huge_pages.py [--reps 9]

Neither llama.cpp nor llama-server asks for transparent huge pages: the weights sit in
the GGUF file's mapping (4 KiB pages) or, repacked, in anonymous memory that the
kernel's "madvise" THP mode leaves at 4 KiB. A matmul that streams ~250 MB of weights
per token crosses a page every 4 KiB (a TLB miss, a two-level walk in a VM, and the
hardware prefetcher stops at each page boundary). The script loads the embedded model
twice in one process, plain weights as generation uses them: A through the file's
mapping (today), B read into anonymous memory (load mode "none"), then collapses B's
weights into 2 MiB pages (madvise MADV_HUGEPAGE + MADV_COLLAPSE, Linux 6.1+) and
times the engine's batch-invariant decodes on both, alternated (1 x 1, 1 x 4, 1 x 16
and 4 x 1 rows, every row with logits, 600 cells per stream), before and after. It
also tries the collapse on A's file mapping. Page size changes no value. One model
process; nothing else may run.
"""
from __future__ import annotations

import argparse
import ctypes
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ngramspec.llama.context import Context, ContextParams
from ngramspec.llama.model import Model  # noqa: E402

MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25
HUGE = 1 << 21
SHAPES = ((1, 1), (1, 4), (1, 16), (4, 1))
CELLS = 600


def mappings() -> list[tuple[int, int, str]]:
    """(start, end, path) of every mapping of this process."""
    out = []
    for line in open("/proc/self/maps"):
        f = line.split()
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        out.append((lo, hi, f[5] if len(f) > 5 else ""))
    return out


def smaps_kb(regions, field: str) -> int:
    """The sum of smaps' `field` (kB) over the mappings that start inside `regions`."""
    total, cur = 0, None
    for line in open("/proc/self/smaps"):
        m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if m:
            cur = int(m.group(1), 16)
        elif cur is not None and line.startswith(field + ":") and any(
                lo <= cur < hi for lo, hi in regions):
            total += int(line.split()[1])
    return total


def collapse(regions) -> list[str]:
    """madvise the 2 MiB-aligned part of each region for huge pages and collapse it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    out = []
    for lo, hi in regions:
        a, b = (lo + HUGE - 1) & ~(HUGE - 1), hi & ~(HUGE - 1)
        rcs = [libc.madvise(a, b - a, advice) for advice in (MADV_HUGEPAGE, MADV_COLLAPSE)]
        out.append(f"{(hi - lo) >> 20} MiB: madvise rc {rcs}, errno {ctypes.get_errno()}")
    return out


def timed(contexts: dict[str, Context], reps: int, rng) -> dict[str, float]:
    """Median ms per (shape, context), the contexts alternated inside each shape."""
    t: dict[str, list[float]] = {}
    for _ in range(reps):
        for n_seq, per in SHAPES:
            toks = rng.integers(1000, 20000, per).tolist()
            for name, ctx in contexts.items():
                t0 = time.perf_counter()
                ctx.decode([(s, toks, CELLS, True) for s in range(n_seq)])
                t.setdefault(f"{n_seq}x{per} {name}", []).append(time.perf_counter() - t0)
                for s in range(n_seq):
                    ctx.truncate(s, CELLS)
    return {k: round(statistics.median(v) * 1e3, 1) for k, v in t.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=9)
    a = ap.parse_args()
    before = {m[:2] for m in mappings()}
    mapped = Model(use_extra_bufts=False)
    loaded = {m[:2] for m in mappings()}
    anon = Model(use_extra_bufts=False, load_mode=0)
    file_a = [(lo, hi) for lo, hi, p in mappings() if (lo, hi) not in before and p.endswith(".gguf")]
    anon_b = [(lo, hi) for lo, hi, p in mappings()
              if (lo, hi) not in loaded and not p and hi - lo >= 64 << 20]
    params = ContextParams(n_ctx=4096, n_batch=512, n_seq_max=4)
    ctxs = {"A (file mapping)": Context(mapped, params), "B (anonymous)": Context(anon, params)}
    rng = np.random.default_rng(0)
    base = rng.integers(1000, 20000, CELLS).tolist()
    for ctx in ctxs.values():
        for s in range(4):
            for p in range(0, CELLS, 60):
                ctx.decode([(s, base[p:p + 60], p, False)])
    print("4 KiB pages:", timed(ctxs, a.reps, rng))
    print("B collapse:", collapse(anon_b), "AnonHugePages kB", smaps_kb(anon_b, "AnonHugePages"))
    print("B in 2 MiB pages:", timed(ctxs, a.reps, rng))
    print("A collapse:", collapse(file_a), "FilePmdMapped kB", smaps_kb(file_a, "FilePmdMapped"))
    print("after A's collapse:", timed(ctxs, a.reps, rng))
    return 0


if __name__ == "__main__":
    sys.exit(main())
