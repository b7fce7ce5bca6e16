#!/usr/bin/env python
"""ngramspec's graph-node kernels (ngramspec/llama/kernels/attention.py, matmul.py): what one costs
against llama.cpp's own, and whether a row's values stay independent of its batch.

    .venv/bin/python scripts/own_kernel_cost.py [--kernel attention|matmul|kquant] [gen] [prompt]
    NGRAMSPEC_KERNEL_VARIANT=avx2 .venv/bin/python scripts/own_kernel_cost.py --kernel matmul gen

The engine's kernels (`ngramspec/llama/kernels/native/attention.c`, `matmul.c`, installed into every
batch-invariant context) turn every node they support into a GGML_OP_CUSTOM node before
ggml computes the graph, or leave it to llama.cpp while their hook's `enabled` is 0, so
one kernel is alternated with llama.cpp's on the same context and the same KV cells
(the other kernel stays on; `kquant`: the matmul kernel's Q4_K / Q6_K nodes alone, its
Q5_0 nodes ours either way):
- gen: a batch-invariant context as the engine's main one (not repacked, reference
  attention path, our output layer off), 1 and 8 streams of 1,500 cells; a row's
  logits alone, among 16 rows and beside other streams (bit-identical?), ours against
  llama.cpp's (max difference, argmax), and decode times by shape, alternated, the
  median of 3 rounds of medians of 7;
- prompt: the prefill twin's context (repacked weights, one stream, full-size SWA
  cache): the 2,196-token bench prompt in 512-token chunks, cells identical for chunks
  of 512 / 200 / 96 (ours), and the time, alternated four times.
Diagnostic only; run alone on a quiet machine (one model process).
"""
from __future__ import annotations

import argparse
import ctypes as C
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from ngramspec.llama import seq_cells  # noqa: E402
from ngramspec.llama.model import Model  # noqa: E402
from ngramspec.bench.prompt_checks import long_text  # noqa: E402
from ngramspec.llama.backend import _llama  # noqa: E402
from ngramspec.llama.context import Context, ContextParams  # noqa: E402


KERNEL = "attention"  # the kernel measured (--kernel): attention, matmul or kquant



def make_context(model: Model, n_seq: int, cb=None, invariant: bool = False, user=None,
                 **fields) -> Context:
    """A context of n_seq streams (batch-invariant as the engine's, or plain), with `cb`
    as cb_eval (and `user`, a ctypes pointer, as its user data); `fields`: other
    ContextParams fields (they win over the defaults here)."""
    lc = _llama()
    orig = lc.llama_context_default_params

    def params():
        p = orig()
        if cb is not None:
            p.cb_eval = cb
        if user is not None:
            p.cb_eval_user_data = C.cast(user, C.c_void_p)
        return p
    lc.llama_context_default_params = params
    try:
        return Context(model, ContextParams(**{
            "n_ctx": 2048 * n_seq, "n_batch": 512, "n_seq_max": n_seq,
            "batch_invariant": invariant, "own_head": False, **fields}))
    finally:
        lc.llama_context_default_params = orig


def median_ms(fn, reps: int = 15) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def kernel_hook(ctx) -> C.Structure:
    """The context's hook of the kernel measured (`set_on` toggles it); exits where this
    machine cannot run the kernel."""
    attr = "matmul" if KERNEL == "kquant" else KERNEL
    hook = ctx.kernels.get(attr)
    if hook is None:
        sys.exit(f"the {attr} kernel is not available here (`ngramspec doctor` says why)")
    from ngramspec.llama.kernels import variant_of

    print(f"# {KERNEL}: the {variant_of(hook.lib)} variant "
          f"(NGRAMSPEC_KERNEL_VARIANT picks one)", flush=True)
    return hook.hook


def set_on(hook: C.Structure, on: int) -> None:
    """The measured kernel on (1) or llama.cpp's (0); the C hooks read it live."""
    if KERNEL == "kquant":
        from ngramspec.llama.kernels.matmul import GGML_TYPE_Q4_K, GGML_TYPE_Q6_K

        hook.type_q4_k, hook.type_q6_k = (GGML_TYPE_Q4_K, GGML_TYPE_Q6_K) if on else (-1, -1)
    else:
        hook.enabled = on


def gen(model: Model, n_seq: int, shapes, cells: int = 1500) -> tuple[int, int]:
    ctx = make_context(model, n_seq, None, True)
    hook = kernel_hook(ctx)
    toks = list(model.tokenize(long_text(12000)))
    for s in range(n_seq):
        for a in range(0, cells, 63):
            ctx.decode([(s, toks[s * 30 + a:s * 30 + min(a + 63, cells)], a, False)])

    def logits(entries, on):
        set_on(hook, on)
        for s, _, p0, _ in entries:
            ctx.truncate(s, p0)
        rows = ctx.decode(entries)
        return [ctx.logits_at(i).copy() for r in rows for i in r]
    if n_seq > 2:
        draft, others = toks[cells:cells + 16], [(1, toks[cells + 50:cells + 53], cells, True),
                                                 (2, toks[cells + 90:cells + 91], cells, True)]
        for on in (1, 0):
            alone = logits([(0, draft[:1], cells, True)], on)
            among = logits([(0, draft, cells, True)], on)
            crowd = logits([(0, draft, cells, True)] + others, on)
            same = all((a == b).all() for a, b in zip(among, crowd))
            print(f"{'ours' if on else 'llama.cpp'}: a row alone == among 16: "
                  f"{(alone[0] == among[0]).all()}; 16 rows == beside 2 more streams: {same}")
        ours, theirs = logits([(0, draft, cells, True)], 1), logits([(0, draft, cells, True)], 0)
        diff = max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs))
        agree = sum(int(np.argmax(a) == np.argmax(b)) for a, b in zip(ours, theirs))
        print(f"ours vs llama.cpp's, 16 rows: max |logit difference| {diff:.3f}, "
              f"argmax the same in {agree}/16")
    for shape in shapes:
        entries = [(s, toks[cells + 10 * s:cells + 10 * s + n], cells, True) for s, n in shape]
        res: dict[int, list[float]] = {1: [], 0: []}
        for _ in range(3):
            for on in (1, 0):
                logits(entries, on)
                res[on].append(median_ms(lambda: logits(entries, on), 7))
        a, b = statistics.median(res[1]), statistics.median(res[0])
        print(f"decode {len(shape)} x {shape[0][1]} at {cells} cells: ours {a:.1f} ms, "
              f"llama.cpp {b:.1f} ms ({a / b:.2f})", flush=True)
    set_on(hook, 1)
    ctx.close()
    return hook.n_done, hook.n_declined


def prompt(path: str) -> tuple[int, int]:
    twin = Model(path, use_extra_bufts=True)
    toks = list(twin.tokenize(long_text(8000)))
    ctx = make_context(twin, 1, None, True, n_ctx=4096, reference_attention=False,
                       swa_full=True)
    hook = kernel_hook(ctx)

    def prefill(chunk: int, on: int) -> bytes:
        set_on(hook, on)
        ctx.truncate(0, 0)
        for a in range(0, len(toks), chunk):
            part = toks[a:a + chunk]
            rows = max(64, len(part))
            ctx.run_rows([(0, part, a, None)], {0: rows + (-rows) % 4 - len(part)})
        return bytes(seq_cells.read(ctx, 0))
    print("ours: prompt cells identical for chunks of 512 / 200 / 96:",
          prefill(512, 1) == prefill(200, 1) == prefill(96, 1))
    res: dict[int, list[float]] = {1: [], 0: []}
    for _ in range(4):
        for on in (1, 0):
            t0 = time.perf_counter()
            prefill(512, on)
            res[on].append(time.perf_counter() - t0)
    a, b = statistics.median(res[1]), statistics.median(res[0])
    print(f"prompt of {len(toks)} tokens: ours {len(toks) / a:.0f} tok/s, llama.cpp "
          f"{len(toks) / b:.0f} tok/s ({b / a:.2f}x; seconds ours {res[1]}, llama.cpp {res[0]})")
    set_on(hook, 1)
    ctx.close()
    return hook.n_done, hook.n_declined


def main() -> None:
    global KERNEL
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", choices=("attention", "matmul", "kquant"), default="attention")
    ap.add_argument("what", nargs="*", choices=("gen", "prompt"))
    args = ap.parse_args()
    KERNEL, what = args.kernel, set(args.what) or {"gen", "prompt"}
    model = Model()
    counts = []
    if "gen" in what:
        counts.append(gen(model, 1, [[(0, 1)], [(0, 4)], [(0, 16)], [(0, 32)]]))
        counts.append(gen(model, 8, [[(s, 1) for s in range(4)], [(s, 4) for s in range(4)],
                                     [(s, 1) for s in range(8)], [(s, 2) for s in range(8)]]))
    if "prompt" in what:
        counts.append(prompt(model.path))
    print(f"{KERNEL} nodes taken {sum(c[0] for c in counts)}, left to llama.cpp "
          f"{sum(c[1] for c in counts)}")


if __name__ == "__main__":
    main()
