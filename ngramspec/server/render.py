"""Pure response rendering: llama-server's JSON shapes from a finished or partial job.

No I/O and no server state here: every function takes what it shows. Shapes follow
llama-server (server-task.cpp): the native /completion final and partial objects,
OpenAI's completion and chat objects and chunks, `usage`, `generation_settings`,
`prompt_progress`, `system_fingerprint` (llama.cpp's `b<build>-<commit>` form).
"""
from __future__ import annotations

import hashlib
import math
from functools import lru_cache
from typing import Any

from ..settings.config import SpecConfig
from ..engine.generate import GenerationResponse
from ..jobs.samplers import NUMBER_FIELDS
from ..settings.sampling import SamplingParams
from ..speculative.stats import timings
from .prepare import SPEC_HEADER


@lru_cache(maxsize=1)
def system_fingerprint() -> str:
    """`b<build>-<commit>` as llama-server; the bundled llama.cpp exposes no build number
    or commit, so a stable b0-<hash of the ngramspec version>."""
    from .. import __version__

    return "b0-" + hashlib.sha1(f"ngramspec {__version__}".encode()).hexdigest()[:8]


def logit_bias_json(biases) -> list[dict]:
    """llama-server's `logit_bias` list: {"bias", "token"} per (token, bias), a
    non-finite bias (-inf: `false` or ignore_eos) as null, as nlohmann's JSON writes it."""
    return [{"bias": b if math.isfinite(b) else None, "token": t} for t, b in biases]


def params_json(sampling: SamplingParams, n_predict: int, stop: list[str], spec: SpecConfig,
                speculative: bool, stream: bool = False, timings_per_token: bool = False,
                model=None) -> dict:
    """llama-server's `generation_settings` / slot `params` object. `logit_bias` is the
    chain's (`SamplingParams.biases`: with ignore_eos every EOG token at -inf), which
    needs the `model`; without it only the request's own biases are listed."""
    biases = sampling.biases(model) if model is not None else sampling.logit_bias
    key_len, draft_len = spec.sizes()
    return {"n_predict": n_predict, "seed": sampling.seed, "temperature": sampling.temperature,
            "top_k": sampling.top_k, "top_p": sampling.top_p, "min_p": sampling.min_p,
            "repeat_last_n": sampling.repeat_last_n, "repeat_penalty": sampling.repeat_penalty,
            "frequency_penalty": sampling.frequency_penalty,
            "presence_penalty": sampling.presence_penalty,
            "stop": stop, "max_tokens": n_predict, "stream": stream,
            "ignore_eos": sampling.ignore_eos, "logit_bias": logit_bias_json(biases),
            "grammar": sampling.grammar or "", "samplers": list(sampling.samplers),
            **{k: getattr(sampling, k) for k in NUMBER_FIELDS},
            "dry_sequence_breakers": list(sampling.dry_sequence_breakers),
            "speculative": speculative,
            "speculative.types": ",".join(spec.types) or "none",
            "speculative.n_max": spec.max_draft(), "speculative.n_min": spec.draft_min,
            "speculative.ngram_size_n": key_len, "speculative.ngram_size_m": draft_len,
            "timings_per_token": timings_per_token}


def pick_fields(paths: list[str], obj: dict) -> dict:
    """llama-server's `response_fields`: only these fields, a nested one named by its
    '/'-separated path (the key is the path itself); missing paths are left out."""
    out = {}
    for path in paths:
        cur: Any = obj
        for k in path.split("/"):
            if not (isinstance(cur, dict) and k in cur):
                break
            cur = cur[k]
        else:
            out[path] = cur
    return out


def progress_timings(p: dict) -> dict:
    """`timings` of a prompt-progress chunk: the prompt so far, nothing predicted yet."""
    return timings(p["processed"] - p["cache"], p["time_ms"], 0, 0.0, cache_n=p["cache"])


def usage(results: list[GenerationResponse], n: int = 1) -> dict:
    """OpenAI usage of a request's choices (`n` per prompt, a prompt's choices in a row):
    each prompt counted once (its first choice), completion tokens summed."""
    firsts = results[::n]
    prompt = sum(r.prompt_tokens for r in firsts)
    completion = sum(r.generation_tokens for r in results)
    out = {"completion_tokens": completion, "prompt_tokens": prompt,
           "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": sum(r.cache_n for r in firsts)}}
    preds = [r for r in results if r.prediction is not None]
    if preds:  # OpenAI's predicted outputs: the prediction's tokens accepted as drafts, and
        # those that do not appear in the completion (drafted or not: OpenAI's meaning)
        out["completion_tokens_details"] = {
            "accepted_prediction_tokens": sum(r.prediction[1] for r in preds),
            "rejected_prediction_tokens": sum(
                r.prediction_unused if r.prediction_unused is not None
                else r.prediction[0] - r.prediction[1] for r in preds)}
    return out


def native_partial(index: int, r: GenerationResponse, n_prompt: int, slot_id: int,
                   with_timings: bool) -> dict:
    """A streamed /completion chunk (llama-server's partial result)."""
    out = {"index": index, "content": r.text, "tokens": r.tokens, "stop": False,
           "id_slot": slot_id, "tokens_predicted": r.generation_tokens,
           "tokens_evaluated": n_prompt}
    if with_timings:
        out["timings"] = r.timings()
    return out


def native_progress(index: int, progress: dict, n_prompt: int, slot_id: int,
                    with_timings: bool) -> dict:
    out = {"index": index, "content": "", "tokens": [], "stop": False, "id_slot": slot_id,
           "tokens_predicted": 0, "tokens_evaluated": n_prompt, "prompt_progress": progress}
    if with_timings:
        out["timings"] = progress_timings(progress)
    return out


def native_final(index: int, content: str, tokens: list[int], r: GenerationResponse,
                 model: str, settings: dict, prompt: str) -> dict:
    """/completion's final object (all of it; `pick_fields` trims it)."""
    return {"index": index, "content": content, "tokens": tokens, "id_slot": r.slot_id,
            "stop": True, "model": model, "tokens_predicted": r.generation_tokens,
            "tokens_evaluated": r.prompt_tokens, "generation_settings": settings,
            "prompt": prompt, "has_new_line": "\n" in content, "truncated": r.truncated,
            "stop_type": r.stop_type, "stopping_word": r.stopping_word,
            "tokens_cached": r.cache_n, "timings": r.timings()}


def oai_base(cid: str, created: int, model: str) -> dict:
    return {"id": cid, "created": created, "model": model,
            "system_fingerprint": system_fingerprint()}


def oai_choice(chat: bool, index: int, text: str, finish: str | None) -> dict:
    """A non-streamed choice: chat `message` or completion `text`."""
    if chat:
        return {"index": index, "message": {"role": "assistant", "content": text},
                "logprobs": None, "finish_reason": finish}
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish}


def oai_chunk(base: dict, chat: bool, index: int, finish: str | None = None,
              text: str | None = None, role: bool = False) -> dict:
    """One streamed chunk. Chat: the first has delta {role: assistant, content: null},
    text deltas {content}, the last {} with its finish_reason (as llama-server)."""
    if chat:
        delta: dict = {"role": "assistant", "content": None} if role else {}
        if text is not None:
            delta["content"] = text
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**base, "object": "chat.completion.chunk", "choices": [choice]}
    choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}
    return {**base, "object": "text_completion", "choices": [choice]}


def oai_usage_chunk(base: dict, chat: bool, results: list[GenerationResponse],
                    n: int = 1) -> dict:
    return {**base, "object": "chat.completion.chunk" if chat else "text_completion",
            "choices": [], "usage": usage(results, n)}


def spec_headers(speculative: bool, result: GenerationResponse | None = None) -> dict[str, str]:
    """Our X-Ngramspec-* headers: speculation on/off, and with a finished result its
    acceptance rate and tokens per verify step."""
    h = {SPEC_HEADER: "enabled" if speculative else "disabled"}
    if result is not None:
        h["X-Ngramspec-Acceptance-Rate"] = f"{result.acceptance_rate:.4f}"
        h["X-Ngramspec-Effective-Speedup"] = f"{result.tokens_per_step:.3f}"
    return h


def prompt_text(model, tokens) -> str:
    """Tokens as llama-server shows them (a prompt, /detokenize): every token's piece,
    special ones included."""
    return b"".join(model.piece(t, special=True) for t in tokens.tolist()).decode("utf-8",
                                                                                  "replace")


def slot_json(slot, n_ctx_slot: int, idle_params: dict, default_spec: SpecConfig,
              model=None) -> dict:
    """One /slots entry as llama-server's (plus our draft counters). A busy slot shows
    its job (id_task, params, next_token); an idle one the last job it ran, with the
    budget reset (n_remain -1, n_decoded 0, as llama-server's slot reset); a slot that
    never ran one has only id, n_ctx, speculative (from `idle_params`), is_processing."""
    job, st = slot.job, slot.st
    processing = job is not None
    shown = job if processing else slot.prev_job
    out = {"id": slot.id, "n_ctx": n_ctx_slot, "speculative": idle_params["speculative"],
           "is_processing": processing}
    if shown is not None:
        params = params_json(shown.sampling, shown.n_predict, shown.stop,
                             shown.spec or default_spec, shown.speculative, model=model)
        n_decoded = st.n_generated if st is not None else 0
        n_remain = shown.n_predict - n_decoded if processing and shown.n_predict >= 0 else -1
        out.update({"speculative": params["speculative"], "id_task": shown.id,
                    "n_prompt_tokens": len(shown.prompt), "params": params,
                    "next_token": [{"has_next_token": processing,
                                    "has_new_line": processing and slot.has_new_line,
                                    "n_remain": n_remain, "n_decoded": n_decoded}]})
    out.update({"draft_n": st.draft_n if st is not None else 0,
                "draft_n_accepted": st.draft_n_accepted if st is not None else 0})
    return out
