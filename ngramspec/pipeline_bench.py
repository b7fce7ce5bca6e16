"""`ngramspec bench --parallel N`: documents through a server with N slots and N
concurrent clients, ngramspec side by side with the C++ llama-server.

Each configuration starts its server on a free loopback port, sends every document
to `/completion` (greedy, `n_predict`, no prompt cache) from N client threads, and
measures wall-clock time from the first request to the last response, so prompt
processing is included. Aggregate tok/s = generated tokens / wall seconds; prompt
tok/s = prompt tokens / summed prompt_ms of the responses, divided by N (the
slots' prompt time overlaps nothing but itself only with one slot).

Servers run one at a time: two llama.cpp processes on the same cores slow each
other down 10-50x.
"""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from .corpus import Document, documents, interleave
from .errors import ConfigError
from .stats import tokens_per_step


@dataclass
class RunResult:
    """One configuration's run over every document."""

    server: str  # "ngramspec" | "llama-server"
    mode: str  # spec type, "off", "auto", ...
    slots: int
    wall_s: float
    outputs: dict[str, list[int]] = field(default_factory=dict)  # doc id -> tokens
    texts: dict[str, str] = field(default_factory=dict)
    generated: int = 0
    prompt_tokens: int = 0
    prompt_ms: float = 0.0
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    peak_rss_mib: float = 0.0  # the server process's peak resident memory after this run
    peak_pss_mib: float = 0.0  # its sampled peak PSS so far: shared file pages counted once

    @property
    def tok_per_s(self) -> float:
        return self.generated / self.wall_s if self.wall_s else 0.0

    @property
    def prompt_tok_per_s(self) -> float:
        return self.prompt_tokens / (self.prompt_ms / 1e3) if self.prompt_ms else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens per verify step of one request (accepted drafts + 1)."""
        return tokens_per_step(self.steps + self.accepted, self.steps)


def load_documents(source: str | None, n: int | None = None) -> list[Document]:
    """Documents from a JSONL file ({"id", "prompt"} per line), a directory (each
    file is one prompt), or None: the held-out standard-library corpus."""
    if source is None:
        docs = interleave(documents(6, 4, 2))
    else:
        p = Path(source)
        if p.is_dir():
            docs = [Document(f.name, "file", f.read_text(encoding="utf-8", errors="replace"))
                    for f in sorted(p.iterdir()) if f.is_file()]
        elif p.is_file():
            docs = []
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines()):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    docs.append(Document(str(rec.get("id", i)), "jsonl", str(rec["prompt"])))
                except (ValueError, KeyError, TypeError):
                    raise ConfigError(f"{p}:{i + 1}: expected a JSON object with a 'prompt'") from None
        else:
            raise ConfigError(f"documents not found: {source}")
    docs = docs[:n] if n else docs
    if not docs:
        raise ConfigError("no documents to run")
    return docs


def send_all(url: str, docs: Sequence[Document], clients: int, n_predict: int,
             body: dict | None = None, per_doc: dict[str, dict] | None = None
             ) -> tuple[float, list[dict]]:
    """POST every document to url/completion from `clients` threads; (wall s, responses).
    `body` is added to every request, `per_doc[doc.id]` to that document's."""
    import httpx

    def one(client: httpx.Client, doc: Document) -> dict:
        r = client.post("/completion", json={
            "prompt": doc.prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1,
            "cache_prompt": False, "return_tokens": True, "seed": 0, **(body or {}),
            **(per_doc or {}).get(doc.id, {})})
        r.raise_for_status()
        return r.json()

    with httpx.Client(base_url=url, timeout=1800) as client:
        one(client, Document("warm-up", "open", "Hello"))
        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as ex:
            outs = list(ex.map(lambda d: one(client, d), docs))
        return time.perf_counter() - t0, outs


def collect(server: str, mode: str, slots: int, docs: Sequence[Document], wall: float,
            outs: list[dict], peak_rss_mib: float = 0.0, peak_pss_mib: float = 0.0) -> RunResult:
    r = RunResult(server, mode, slots, wall, peak_rss_mib=peak_rss_mib, peak_pss_mib=peak_pss_mib)
    for d, o in zip(docs, outs):
        t = o.get("timings", {})
        r.outputs[d.id] = list(o.get("tokens") or [])
        r.texts[d.id] = o.get("content", "")
        r.generated += int(t.get("predicted_n", 0))
        r.prompt_tokens += int(t.get("prompt_n", 0))
        r.prompt_ms += float(t.get("prompt_ms", 0.0))
        r.drafted += int(t.get("draft_n", 0))
        r.accepted += int(t.get("draft_n_accepted", 0))
        # every verify step emits its accepted draft tokens + 1; the first token is the prompt's
        r.steps += max(int(t.get("predicted_n", 1)) - 1 - int(t.get("draft_n_accepted", 0)), 0)
    return r


def mode_body(mode: str) -> dict:
    """The request fields of one ngramspec mode: the server's default ("auto"), "off",
    "oracle" (a prediction of the exact output, nothing else drafts) or a spec type."""
    if mode == "auto":
        return {}
    if mode in ("off", "oracle"):
        return {"speculative": {"type": "none"}}
    return {"speculative": {"type": mode}}


def run_ngramspec(docs: Sequence[Document], slots: int, modes: Sequence[str], n_predict: int,
                  threads: int, slot_ctx: int, model: str | None,
                  progress: Callable[[str], None] = lambda s: None,
                  extra_checks: Callable[[str], dict] | None = None, clients: int | None = None,
                  server_args: Sequence[str] = ()) -> tuple[list[RunResult], dict]:
    """One `ngramspec serve -np slots` process (`server_args`: the user's load, -md and
    spec flags); each mode is a per-request setting, sent by `clients` concurrent
    clients (default: one per slot). "oracle" needs "off" earlier in `modes` (its
    outputs are the predictions). `extra_checks(url)` runs on the same server after the
    modes. A run's peak RSS is the process's so far: the first mode's is its own."""
    from .server.launch import PeakPss, start_server, status_kib

    args = ["-np", str(slots), "-c", str(slot_ctx * slots), "-t", str(threads), "--temp", "0",
            *server_args]
    if model:
        args += ["-m", model]
    sp = start_server(args, timeout=900)
    try:
        results: list[RunResult] = []
        for mode in modes:
            progress(f"ngramspec -np {slots}: {mode}")
            per_doc = None
            if mode == "oracle":
                off = next(r for r in results if r.mode == "off")
                per_doc = {d: {"prediction": {"type": "content", "content": t}}
                           for d, t in off.outputs.items()}
            with PeakPss(sp.pid) as pss:
                wall, outs = send_all(sp.url, docs, clients or slots, n_predict, mode_body(mode),
                                      per_doc)
            pss_so_far = max([pss.mib] + [r.peak_pss_mib for r in results])
            results.append(collect("ngramspec", mode, slots, docs, wall, outs,
                                   status_kib(sp.pid, "VmHWM") / 1024, pss_so_far))
        checks = extra_checks(sp.url) if extra_checks else {}
        return results, checks
    finally:
        sp.stop()


def run_llama_server(binary: str, model_path: str, docs: Sequence[Document], slots: int,
                     spec_type: str, n_predict: int, threads: int, slot_ctx: int,
                     extra: Sequence[str] = (),
                     extra_checks: Callable[[str], dict] | None = None) -> tuple[RunResult, dict]:
    from .peer import LlamaServerPeer
    from .server.launch import PeakPss, status_kib

    peer = LlamaServerPeer(binary, model_path, spec_type, n_ctx=slot_ctx * slots, threads=threads,
                           extra=list(extra), n_parallel=slots)
    with peer:
        with PeakPss(peer.proc.pid) as pss:
            wall, outs = send_all(peer.url, docs, slots, n_predict)
        peak = status_kib(peer.proc.pid, "VmHWM") / 1024
        checks = extra_checks(peer.url) if extra_checks else {}
    return collect("llama-server", "off" if spec_type == "none" else spec_type, slots, docs,
                   wall, outs, peak, pss.mib), checks


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


def prompt_checks(url: str, n_chars: int = 8000) -> dict:
    """Prompt speed on one ~2,000-token prompt (best of 2, no cache), and the prompt
    cache: a ~1,550-token prefix with a new ~50-token suffix after a first request."""
    import httpx

    def post(client, prompt, cache):
        r = client.post("/completion", json={"prompt": prompt, "n_predict": 1, "temperature": 0,
                                             "cache_prompt": cache})
        r.raise_for_status()
        return r.json()["timings"]

    text = long_text(n_chars)
    with httpx.Client(base_url=url, timeout=600) as c:
        speed = max((post(c, text, False) for _ in range(2)), key=lambda t: t["prompt_per_second"])
        prefix = long_text(6200, "argparse")  # ~1,550 tokens no slot holds yet
        first = post(c, prefix + "\n# first question: what does this module do?\n", True)
        second = post(c, prefix + SECOND_QUESTION, True)  # a new ~50-token suffix
    return {"prompt_n": speed["prompt_n"], "prompt_per_second": speed["prompt_per_second"],
            "cache_first_prompt_ms": first["prompt_ms"], "cache_first_prompt_n": first["prompt_n"],
            "cache_second_prompt_ms": second["prompt_ms"], "cache_second_prompt_n": second["prompt_n"],
            "cache_n": second.get("cache_n", 0)}


@dataclass
class PipelineReport:
    """Everything one `bench --parallel` run measured."""

    runs: list[RunResult] = field(default_factory=list)
    checks: dict[str, dict] = field(default_factory=dict)  # "ngramspec"/"llama-server" -> prompt_checks

    def get(self, server: str, mode: str, slots: int) -> RunResult | None:
        return next((r for r in self.runs if (r.server, r.mode, r.slots) == (server, mode, slots)), None)

    def best_peer(self, slots: int) -> RunResult | None:
        peers = [r for r in self.runs if r.server == "llama-server" and r.slots == slots
                 and r.mode != "off"]
        return max(peers, key=lambda r: r.tok_per_s) if peers else None

    def best_own_fixed(self, slots: int) -> RunResult | None:
        """ngramspec's fastest fixed spec type at this slot count (not off/auto/oracle)."""
        own = [r for r in self.runs if r.server == "ngramspec" and r.slots == slots
               and r.mode not in ("off", "auto", "oracle")]
        return max(own, key=lambda r: r.tok_per_s) if own else None

    def identical(self, a: RunResult, b: RunResult) -> int:
        return sum(a.outputs.get(d) == b.outputs.get(d) for d in a.outputs)


def run(docs: Sequence[Document], parallel: Sequence[int], n_predict: int, threads: int,
        slot_ctx: int, model: str | None, llama_server: str | None, peer_types: Sequence[str],
        progress: Callable[[str], None] = lambda s: None, own_types: Sequence[str] = (),
        server_args: Sequence[str] = (), peer_args: Sequence[str] = ()) -> PipelineReport:
    """ngramspec (off, auto, each of `own_types` as a fixed type, and the oracle: what
    perfect drafts give at that slot count) and llama-server (none + each of
    `peer_types`) at every slot count, one server at a time; `server_args` and
    `peer_args` go on their command lines (the user's load, -md and spec flags)."""
    from .model import default_model_path

    rep = PipelineReport()
    for n in parallel:
        modes = ["off", "auto", *own_types, "oracle"]
        checks = prompt_checks if n == 1 else None
        res, chk = run_ngramspec(docs, n, modes, n_predict, threads, slot_ctx, model, progress,
                                 checks, server_args=server_args)
        rep.runs += res
        if chk:
            rep.checks["ngramspec"] = chk
        if llama_server:
            path = model or default_model_path()
            for t in ["none", *peer_types]:
                progress(f"llama-server -np {n}: {t}")
                r, chk = run_llama_server(llama_server, path, docs, n, t, n_predict, threads,
                                          slot_ctx, peer_args,
                                          extra_checks=checks if t == "none" else None)
                rep.runs.append(r)
                if chk:
                    rep.checks["llama-server"] = chk
    return rep
