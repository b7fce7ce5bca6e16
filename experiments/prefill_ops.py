#!/usr/bin/env python
"""Where a prompt's time goes: the prefill twin's chunks timed graph node by graph node.

    .venv/bin/python experiments/prefill_ops.py [--chars 8000] [--chunk 512]

Loads the embedded model as the prefill twin does (repacked weights, `use_extra_bufts`;
ngramspec's process settings, so `GGML_CPU_TILED_MM=0`), evaluates the bench's
~2,200-token prompt in chunks as the server does, once with llama.cpp's graph whole and
once with an eval callback that asks for every node (ggml's scheduler then computes the
graph one node at a time and calls back after each: the time between two calls is that
node's), and prints the seconds by operation and, for matmuls, by weight type and whether
the weight is repacked. Diagnostic only; run alone on a quiet machine (one model process).
"""
from __future__ import annotations

import argparse
import ctypes as C
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ngramspec.llama.host import loaded  # noqa: E402
from ngramspec.llama.context import Context
from ngramspec.llama.model import Model  # noqa: E402
from ngramspec.llama.kernels.ggml import tensor_offsets  # noqa: E402
from ngramspec.bench.prompt_checks import long_text  # noqa: E402
from output_layer_cost import make_context  # noqa: E402

TYPES = {0: "f32", 1: "f16", 2: "q4_0", 6: "q5_0", 8: "q8_0", 12: "q4_K", 14: "q6_K"}
EXTRA_OFF = 320  # struct ggml_tensor: `extra` follows name[64] at 256


class NodeTimer:
    """cb_eval that asks for every node and charges the time since the last call to it."""

    def __init__(self) -> None:
        base = loaded("ggml-base")
        base.ggml_op_name.restype, base.ggml_op_name.argtypes = C.c_char_p, [C.c_int]
        self.op_name = {i: base.ggml_op_name(i).decode() for i in range(100)}
        self.off = tensor_offsets()
        self.seconds: dict[str, float] = defaultdict(float)
        self.on, self.t = False, 0.0

        def cb(t, ask, _user):
            if ask:
                return self.on
            now = time.perf_counter()
            self.seconds[self.key(t)] += now - self.t
            self.t = now
            return True
        import llama_cpp

        self.cb = llama_cpp.ggml_backend_sched_eval_callback(cb)

    def key(self, t: int) -> str:
        op = self.op_name.get(C.c_int.from_address(t + self.off["op"]).value, "?")
        if op != "MUL_MAT":
            return op
        w = C.c_void_p.from_address(t + self.off["src"]).value
        wtype = TYPES.get(C.c_int.from_address(w + self.off["type"]).value, "?")
        repacked = C.c_void_p.from_address(w + EXTRA_OFF).value is not None  # ggml_tensor.extra
        name = C.string_at(w + self.off["name"]).decode()
        part = name.split(".")[2] if name.startswith("blk.") else name
        return f"MUL_MAT {wtype}{' repacked' if repacked else ''} ({part})"


def prefill(ctx: Context, toks: list[int], chunk: int) -> float:
    """Evaluate toks in chunks as the twin does (no logits, padded to a multiple of 4)."""
    ctx.truncate(0, 0)
    t0 = time.perf_counter()
    for a in range(0, len(toks), chunk):
        part = toks[a:a + chunk]
        ctx.run_rows([(0, part, a, None)], {0: (-len(part)) % 4})
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chars", type=int, default=8000)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--swa-window", action="store_true",
                    help="a window-size sliding-window cache (llama-server's), not the twin's full one")
    args = ap.parse_args()
    model = Model(use_extra_bufts=True)
    timer = NodeTimer()
    # the twin's context: one stream, every SWA cell (or a window's), no output layer of ours
    ctx = make_context(model, 1, timer.cb, invariant=True, n_ctx=4096,
                       swa_full=not args.swa_window, reference_attention=False)
    toks = list(model.tokenize(long_text(args.chars)))
    prefill(ctx, toks, args.chunk)  # warm
    whole = min(prefill(ctx, toks, args.chunk) for _ in range(3))
    timer.on = True
    best = None
    for _ in range(3):
        timer.seconds.clear()
        timer.t = time.perf_counter()
        s = prefill(ctx, toks, args.chunk)
        if best is None or s < best[0]:
            best = (s, dict(timer.seconds))
    s, by = best
    cache = "window-size" if args.swa_window else "full-size"
    print(f"{cache} SWA cache; {len(toks)} prompt tokens in chunks of {args.chunk}: {whole:.2f} s whole graphs "
          f"({len(toks) / whole:.0f} tok/s), {s:.2f} s node by node")
    for k, v in sorted(by.items(), key=lambda kv: -kv[1]):
        if v / s >= 0.002:
            print(f"  {k:45s} {v:6.3f} s  {v / s:6.1%}")


if __name__ == "__main__":
    main()
