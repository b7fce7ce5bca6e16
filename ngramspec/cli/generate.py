"""`ngramspec generate`: one prompt, greedy or sampled, speculative and exact."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..console import err_console
from ..settings.typed import typed
from ..errors import ConfigError
from ..settings import click_options

#: engines of one-shot commands, kept until the process ends so that the OS takes their
#: memory back instead of llama.cpp's frees (~0.2 s; backend._at_exit)
_HELD_TILL_EXIT: list = []

def read_prompt(prompt: str | None, file: str | None) -> str:
    if prompt is not None and file is not None:
        raise ConfigError("use either -p/--prompt or -f/--file, not both")
    if file is not None:
        try:
            return Path(file).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"cannot read prompt file {file}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"prompt file {file} is not UTF-8 text") from None
    if prompt is None:
        raise ConfigError("no prompt: pass -p TEXT or -f FILE")
    return prompt


@click.command(context_settings=click_options.CONTEXT_SETTINGS)
@click.option("-p", "--prompt", default=None, help="prompt text")
@click.option("-f", "--file", "prompt_file", default=None, help="read the prompt from a file")
@click_options.options("generate")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of text")
@click.pass_context
def generate(ctx: click.Context, prompt, prompt_file, n_predict, as_json, verbose, **kw) -> None:
    """Generate text with speculative decoding; print llama.cpp's statistics at the end."""
    from ..engine.generate import stream_generate
    from ..engine.runtime import load_engine
    from ..speculative.stats import acceptance_line, calibration_line

    if verbose:
        ctx.obj["verbose"] = True
    text = read_prompt(prompt, prompt_file)
    t = typed(kw, verbose=bool(ctx.obj.get("verbose")))
    sampling, settings, spec = t.sampling, t.engine, t.spec
    with err_console.status("loading model ..."):
        engine = load_engine(settings, notify=lambda line: err_console.print(line))
    _HELD_TILL_EXIT.append(engine)
    if ctx.obj.get("verbose"):
        err_console.print(engine.ctx.kernels.line(), markup=False)
    pieces, last = [], None
    for r in stream_generate(engine, text, sampling, n_predict,
                             speculative=engine.speculates()):
        if as_json:
            pieces.append(r.text)
        else:
            sys.stdout.write(r.text)
            sys.stdout.flush()
        last = r
    stats = engine.stats()
    if as_json:
        click.echo(json.dumps({
            "content": "".join(pieces), "finish_reason": last.finish_reason,
            "timings": last.timings(), "tokens_per_step": last.tokens_per_step,
            "spec_type": ",".join(spec.types) or "none",
            "calibration": calibration_json(engine.calibration),
            "kernels": engine.ctx.kernels.state(), "kv_cells": engine.ctx.kernels.cell_mode,
            "statistics": {k: v.as_dict() for k, v in stats.items()},
            "rested_steps": engine.policy.n_rested}, indent=2))
        return
    sys.stdout.write("\n")
    err = err_console.file
    print(acceptance_line(last.draft_n_accepted, last.draft_n), file=err)
    if engine.calibration is not None:
        print(calibration_line(engine.calibration), file=err)
    for st in stats.values():
        print(st.line(), file=err)
    if engine.policy.n_rested:
        print(f"draft policy: rested {engine.policy.n_rested} steps (proposing had not paid "
              "for its host time)", file=err)
    print(f"prompt: {last.prompt_tokens} tokens in {last.prompt_ms:.1f} ms; generated: "
          f"{last.generation_tokens} tokens in {last.predicted_ms:.1f} ms = "
          f"{last.predicted_per_second:.2f} tok/s; mean acceptance length "
          f"{last.tokens_per_step:.2f} tokens/step", file=err)


def calibration_json(cal) -> dict:
    """`--json`'s calibration: seconds spent at start-up on the cost model, and how."""
    if cal is None:
        return {"seconds": 0.0, "source": "none"}
    return {"seconds": round(cal.seconds, 4), "source": cal.source}
