"""`bench --parallel`'s prompt checks: prompt tok/s on one long prompt, and the prompt
cache's second request, on real text nobody on the project wrote (a standard-library
module's source)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .servers import Servers


def long_text(n_chars: int, module: str = "difflib") -> str:
    """Real text nobody here wrote (a standard-library module's source), n_chars long."""
    import importlib
    import inspect

    src = inspect.getsource(importlib.import_module(module))
    return (src * (n_chars // len(src) + 1))[:n_chars]


SECOND_QUESTION = ("\n# The second request asks a longer question about the same module: "
                   "which classes does it define, which of them does a user of the command-line "
                   "parser meet first, and why are the help formatters separate classes from "
                   "the parser itself? Answer in three short paragraphs.\n")


def _post_prompt(client, prompt: str, cache: bool) -> dict:
    r = client.post("/completion", json={"prompt": prompt, "n_predict": 1, "temperature": 0,
                                         "cache_prompt": cache})
    r.raise_for_status()
    return r.json()["timings"]


def prompt_speed(url: str, n_chars: int = 8000) -> dict:
    """One request's prompt speed on a ~2,000-token prompt (no prompt cache): its
    timings' prompt_n and prompt_per_second."""
    import httpx

    with httpx.Client(base_url=url, timeout=600) as c:
        t = _post_prompt(c, long_text(n_chars), False)
    return {"prompt_n": t["prompt_n"], "prompt_per_second": t["prompt_per_second"]}


def cache_check(url: str) -> dict:
    """The prompt cache: a ~1,550-token prefix with a new ~50-token suffix after a
    first request (once per server: later the prefix is a hit in both requests)."""
    import httpx

    prefix = long_text(6200, "argparse")  # ~1,550 tokens no slot holds yet
    with httpx.Client(base_url=url, timeout=600) as c:
        first = _post_prompt(c, prefix + "\n# first question: what does this module do?\n", True)
        second = _post_prompt(c, prefix + SECOND_QUESTION, True)  # a new ~50-token suffix
    return {"cache_first_prompt_ms": first["prompt_ms"], "cache_first_prompt_n": first["prompt_n"],
            "cache_second_prompt_ms": second["prompt_ms"], "cache_second_prompt_n": second["prompt_n"],
            "cache_n": second.get("cache_n", 0)}


#: requests per server in one round's prompt check (its best counts)
PROMPT_REQUESTS = 3


def prompt_checks(servers: "Servers", processes: Sequence[str], cache: bool,
                  n: int = PROMPT_REQUESTS) -> list[dict]:
    """Prompt speed of each process (best of n requests), their requests alternated
    one by one (A B A B ...) so that a drift of the host's speed meets them alike,
    each process stopped while another's request runs; then (`cache`) each one's
    prompt-cache check. Returns one dict per process, in order."""
    best: list[dict | None] = [None] * len(processes)
    for _ in range(n):
        for k, name in enumerate(processes):
            t = prompt_speed(servers.resume(name).url)
            if best[k] is None or t["prompt_per_second"] > best[k]["prompt_per_second"]:
                best[k] = t
            servers.stop(name)
    out = [dict(b) for b in best]
    if cache:
        for d, name in zip(out, processes):
            d.update(cache_check(servers.resume(name).url))
            servers.stop(name)
    return out
