"""`ngramspec bench --parallel N`: documents through a server with N slots and N
concurrent clients, ngramspec side by side with the C++ llama-server.

Each configuration (a row: ngramspec in one mode, or llama-server with one spec type)
sends every document to `/completion` (greedy, `n_predict`, no prompt cache) from N
client threads and measures wall-clock time from the first request to the last
response, so prompt processing is included. Aggregate tok/s = generated tokens / wall
seconds. Generation only: a "prefill" row sends the same documents with n_predict 1
(prompts and first tokens only), and generation tok/s = the other tokens / (wall -
the prefill row's wall), each server against its own prefill row. Prompt tok/s =
prompt tokens / summed prompt_ms (one slot: nothing overlaps); the prompt checks (one
~2,000-token prompt) alternate the servers request by request.

Only one server runs at a time: two llama.cpp processes on the same cores slow each
other down 10-50x. With `rounds` > 1 every row runs that many times, interleaved
(forward, backward, forward, ...: ours and llama-server's rows alternate, so a drift of
the host's speed meets both alike); every server stays loaded and all but the one being
timed are stopped (SIGSTOP), and the report shows each row's median round. Every row that
drafts from n-gram pools runs in a process of its own, started for that row and round: a
server's pools outlive its requests (llama-server's ngram-mod, ours), and the rows send
the same documents, so a shared process would draft from an earlier row's outputs.
"""
from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from itertools import zip_longest
from pathlib import Path
from typing import Callable, Sequence

from .command import split_mode
from .corpus import Document, documents, interleave
from .prompt_checks import prompt_checks
from .servers import Row, Servers, Started, start_llama_server, start_ngramspec
from ..errors import ConfigError
from ..speculative.stats import tokens_per_step


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
    predicted_ms: float = 0.0  # summed over the responses (slots overlap)
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    peak_rss_mib: float = 0.0  # the server process's peak resident memory after this run
    peak_pss_mib: float = 0.0  # its sampled peak PSS so far: shared file pages counted once
    round: int = 0  # which of the interleaved rounds
    # ngramspec: drafter -> [drafts, draft tokens, accepted tokens] of this run
    sources: dict[str, list[int]] = field(default_factory=dict)

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
        r.predicted_ms += float(t.get("predicted_ms", 0.0))
        r.drafted += int(t.get("draft_n", 0))
        r.accepted += int(t.get("draft_n_accepted", 0))
        # every verify step emits its accepted draft tokens + 1; the first token is the prompt's
        r.steps += max(int(t.get("predicted_n", 1)) - 1 - int(t.get("draft_n_accepted", 0)), 0)
    return r


def mode_body(mode: str) -> dict:
    """The request fields of one ngramspec mode: the server's default ("auto"), "off",
    "oracle" (a prediction of the exact output, nothing else drafts) or a spec type
    (`TYPE:POLICY`: the policy is its server's flag, `server_of`)."""
    if mode == "auto":
        return {}
    if mode in ("off", "oracle", "prefill"):
        return {"speculative": {"type": "none"}}
    return {"speculative": {"type": split_mode(mode)[0]}}


def server_of(mode: str) -> str:
    """The starter of an own mode's server: "ngramspec", or "ngramspec:POLICY" for a
    `TYPE:POLICY` mode (a server started with `policy_args`)."""
    policy = split_mode(mode)[1]
    return f"ngramspec:{policy}" if policy else "ngramspec"


def policy_args(server_args: Sequence[str], policy: str) -> list[str]:
    """The flags of a `TYPE:POLICY` mode's server: the user's, --draft-policy POLICY, and
    no spec type of its own (--spec-type none; each request names its type): the default
    type, auto, always takes the cost policy (`config.spec_config_from_options`), so a
    server left on it would run `ngram-mod:fixed` with the cost policy."""
    return [*server_args, "--spec-type", "none", "--draft-policy", policy]


def schedule(own_modes: Sequence[str], peer_types: Sequence[str] | None, prompt_checks: bool,
             rounds: int) -> list[list[Row]]:
    """Every round's rows in order. Round 0: our modes and llama-server's types
    alternate ("off" beside "none" first, then both "prefill" rows: the same documents,
    n_predict 1), then the oracle (it needs round 0's "off"), then the prompt checks;
    later rounds run the same rows backward, forward, ... `peer_types` None: no
    llama-server."""
    def one_round(i: int) -> list[Row]:
        modes = [*own_modes[:1], "prefill", *own_modes[1:]]
        ours = [Row("ngramspec", m, "ngramspec" if m in ("off", "prefill")
                    else f"{server_of(m)}#{m}@{i}") for m in modes]
        peers = [Row("llama-server", "off" if t == "none" else t,
                     "llama-server:none" if t == "none" else f"llama-server:{t}@{i}")
                 for t in (["none", *peer_types] if peer_types is not None else [])]
        if peers:
            peers.insert(1, Row("llama-server", "prefill", "llama-server:none"))
        order = [r for pair in zip_longest(ours, peers) for r in pair if r is not None]
        order.append(Row("ngramspec", "oracle", "ngramspec"))
        if prompt_checks:
            order.append(Row("ngramspec", "prompt", "ngramspec"))
            if peers:
                order.append(Row("llama-server", "prompt", "llama-server:none"))
        return order if i % 2 == 0 else order[::-1]
    return [one_round(i) for i in range(rounds)]


def time_row(row: Row, srv: Started, docs: Sequence[Document], slots: int, n_predict: int,
             clients: int, earlier: Sequence[RunResult], off: RunResult | None) -> RunResult:
    """Every document through `srv` as `row` says; peak RSS is the process's so far
    (VmHWM), peak PSS the largest sampled over this row and `earlier` ones of the same
    process. The oracle's predictions are `off`'s outputs."""
    from ..server.launch import PeakPss, status_kib

    per_doc = None
    if row.mode == "oracle":
        per_doc = {d: {"prediction": {"type": "content", "content": t}}
                   for d, t in off.outputs.items()}
    ours = row.server == "ngramspec"
    before = drafter_counts(srv.url) if ours else {}
    with PeakPss(srv.pid) as pss:
        wall, outs = send_all(srv.url, docs, clients, 1 if row.mode == "prefill" else n_predict,
                              mode_body(row.mode) if ours else None, per_doc)
    pss_so_far = max([pss.mib] + [r.peak_pss_mib for r in earlier])
    res = collect(row.server, row.mode, slots, docs, wall, outs,
                  status_kib(srv.pid, "VmHWM") / 1024, pss_so_far)
    if ours:
        after = drafter_counts(srv.url)
        res.sources = {d: [a - b for a, b in zip(v, before.get(d, [0, 0, 0]))]
                       for d, v in after.items()}
        res.sources = {d: v for d, v in res.sources.items() if v[0]}
    return res


def drafter_counts(url: str, headers: dict | None = None) -> dict[str, list[int]]:
    """ngramspec's per-drafter counters from its /metrics: drafter -> [drafts, draft
    tokens, accepted tokens] ({} where the server answers no metrics)."""
    import httpx

    from ..server.metrics import DRAFTER_COUNTERS, PREFIX

    r = httpx.get(url + "/metrics", timeout=30, headers=headers)
    if r.status_code != 200:
        return {}
    want = ("n_gen_drafts", "n_gen_tokens", "n_acc_tokens")
    index = {PREFIX + name: want.index(key) for name, _, key in DRAFTER_COUNTERS if key in want}
    out: dict[str, list[int]] = {}
    for line in r.text.splitlines():
        name, _, rest = line.partition('{drafter="')
        if name in index:
            drafter, _, value = rest.partition('"} ')
            out.setdefault(drafter, [0, 0, 0])[index[name]] = int(float(value))
    return out


def run_ngramspec(docs: Sequence[Document], slots: int, modes: Sequence[str], n_predict: int,
                  threads: int, slot_ctx: int, model: str | None,
                  clients: int | None = None, server_args: Sequence[str] = ()) -> list[RunResult]:
    """Every mode in turn on one `ngramspec serve -np slots` process, sent by `clients`
    concurrent clients (default: one per slot). "oracle" needs "off" earlier in `modes`."""
    srv = start_ngramspec(slots, threads, slot_ctx, model, server_args)
    try:
        results: list[RunResult] = []
        for mode in modes:
            off = next((r for r in results if r.mode == "off"), None)
            results.append(time_row(Row("ngramspec", mode, "ngramspec"), srv, docs, slots,
                                    n_predict, clients or slots, results, off))
        return results
    finally:
        srv.close()


NOT_TYPES = ("off", "auto", "oracle", "prefill")  # rows that are not a fixed spec type


@dataclass
class PipelineReport:
    """Everything one `bench --parallel` run measured: `runs` has each row's median
    round, `rounds` every round's run of every row (empty: `runs` is all there is)."""

    runs: list[RunResult] = field(default_factory=list)
    checks: dict[str, dict] = field(default_factory=dict)  # "ngramspec"/"llama-server" -> prompt_checks
    rounds: list[RunResult] = field(default_factory=list)
    check_rounds: dict[str, list[float]] = field(default_factory=dict)  # prompt tok/s per round

    def get(self, server: str, mode: str, slots: int,
            runs: Sequence[RunResult] | None = None) -> RunResult | None:
        """server's run of mode at slots in `runs` (default: the medians)."""
        return next((r for r in (self.runs if runs is None else runs)
                     if (r.server, r.mode, r.slots) == (server, mode, slots)), None)

    def best_peer(self, slots: int, runs: Sequence[RunResult] | None = None) -> RunResult | None:
        peers = [r for r in (self.runs if runs is None else runs)
                 if r.server == "llama-server" and r.slots == slots and r.mode not in NOT_TYPES]
        return max(peers, key=lambda r: r.tok_per_s) if peers else None

    def best_own_type(self, slots: int, runs: Sequence[RunResult] | None = None) -> RunResult | None:
        """ngramspec's fastest single spec type at this slot count (not off/auto/oracle):
        a `TYPE` row (the cost policy on that one type) or a `TYPE:fixed` one (llama.cpp's)."""
        own = [r for r in (self.runs if runs is None else runs)
               if r.server == "ngramspec" and r.slots == slots
               and r.mode not in NOT_TYPES]
        return max(own, key=lambda r: r.tok_per_s) if own else None

    def gen_tok_per_s(self, r: RunResult, runs: Sequence[RunResult] | None = None) -> float | None:
        """Generation only: r's tokens after each document's first, per second of r's wall
        time less its server's prefill row's in `runs` (default: the medians; None: no
        prefill row)."""
        pre = self.get(r.server, "prefill", r.slots, runs)
        if pre is None or r.wall_s <= pre.wall_s:
            return None
        return (r.generated - pre.generated) / (r.wall_s - pre.wall_s)

    def runs_of(self, r: RunResult) -> list[RunResult]:
        """Every round's run of r's row (just r when no rounds were kept)."""
        same = [x for x in self.rounds if (x.server, x.mode, x.slots) == (r.server, r.mode, r.slots)]
        return same or [r]

    def identical(self, a: RunResult, b: RunResult) -> int:
        """Documents whose output in every round of a's row equals b's."""
        return sum(all(x.outputs.get(d) == b.outputs.get(d) for x in self.runs_of(a))
                   for d in a.outputs)

    def per_round(self, slots: int, ratio: Callable[[Sequence[RunResult]], float | None]
                  ) -> list[float]:
        """`ratio` of each round's runs at this slot count (None: left out)."""
        n = max((r.round for r in self.rounds), default=-1) + 1
        out = [ratio([r for r in self.rounds if r.round == i and r.slots == slots])
               for i in range(n)]
        return [x for x in out if x is not None]


def median_run(runs: Sequence[RunResult]) -> RunResult:
    """The round whose wall time is the median (the lower one of an even count), with
    round 0's peak memory: the first round's peaks are each mode's own (spec-off runs
    first in its process)."""
    pick = sorted(runs, key=lambda r: r.wall_s)[(len(runs) - 1) // 2]
    return replace(pick, peak_rss_mib=runs[0].peak_rss_mib, peak_pss_mib=runs[0].peak_pss_mib)


def run_plan(plan: list[list[Row]], starters: dict[str, Callable[[], Started]],
             docs: Sequence[Document], slots: int, n_predict: int, rep: PipelineReport,
             progress: Callable[[str], None] = lambda s: None) -> None:
    """Time every row of every round at `slots`, one process runnable at a time; each
    run goes to `rep.rounds`, each prompt check to `rep.checks` (round 0) and
    `rep.check_rounds`."""
    index, by_process = 0, {}  # process -> its runs so far (peak PSS is per process)
    with Servers(starters, plan) as servers:
        for i, rows in enumerate(plan):
            checks = [r for r in rows if r.mode == "prompt"]
            for row in rows:
                progress(f"-np {slots}, round {i + 1}/{len(plan)}: {row.server} {row.mode}")
                if row.mode == "prompt":
                    if row is checks[0]:  # every prompt check of the round, alternated
                        found = prompt_checks(servers, [r.process for r in checks], cache=i == 0)
                        for r, chk in zip(checks, found):
                            rep.checks.setdefault(r.server, chk)
                            rep.check_rounds.setdefault(r.server, []).append(chk["prompt_per_second"])
                else:
                    srv = servers.resume(row.process)
                    mine = by_process.setdefault(row.process, [])
                    off = next((r for r in by_process.get("ngramspec", [])
                                if (r.round, r.mode) == (0, "off")), None)
                    res = replace(time_row(row, srv, docs, slots, n_predict, slots, mine, off),
                                  round=i)
                    mine.append(res)
                    rep.rounds.append(res)
                servers.pause(row.process, index)
                index += 1


def run(docs: Sequence[Document], parallel: Sequence[int], n_predict: int, threads: int,
        slot_ctx: int, model: str | None, llama_server: str | None, peer_types: Sequence[str],
        progress: Callable[[str], None] = lambda s: None, own_types: Sequence[str] = (),
        server_args: Sequence[str] = (), peer_args: Sequence[str] = (),
        rounds: int = 1) -> PipelineReport:
    """ngramspec (off, auto, each of `own_types`: TYPE, the cost policy on that one type, or
    TYPE:fixed, llama.cpp's lengths; and the oracle: what perfect drafts give at that slot
    count) and llama-server (none + each of `peer_types`) at every slot count, `rounds`
    interleaved rounds (`schedule`), one server runnable at a time; `server_args` and
    `peer_args` go on their command lines (the user's load, -md and spec flags)."""
    from ..llama.model import default_model_path

    if rounds < 1:
        raise ConfigError(f"--rounds must be >= 1, got {rounds}")
    rep = PipelineReport()
    path = model or default_model_path()
    for n in parallel:
        starters = {"ngramspec": lambda n=n: start_ngramspec(n, threads, slot_ctx, model, server_args)}
        for policy in {split_mode(m)[1] for m in own_types} - {None}:
            starters[f"ngramspec:{policy}"] = lambda n=n, p=policy: start_ngramspec(
                n, threads, slot_ctx, model, policy_args(server_args, p))
        for t in ["none", *peer_types] if llama_server else []:
            starters[f"llama-server:{t}"] = lambda t=t, n=n: start_llama_server(
                llama_server, path, t, n, threads, slot_ctx, peer_args)
        plan = schedule(["off", "auto", *own_types], peer_types if llama_server else None,
                        n == 1, rounds)
        run_plan(plan, starters, docs, n, n_predict, rep, progress)
    keys = sorted(dict.fromkeys((r.server, r.mode, r.slots) for r in rep.rounds),
                  key=lambda k: (k[2], k[0] != "ngramspec"))  # ours first, in run order
    rep.runs = [median_run([r for r in rep.rounds if (r.server, r.mode, r.slots) == k])
                for k in keys]
    for server, speeds in rep.check_rounds.items():
        rep.checks[server]["prompt_per_second"] = statistics.median(speeds)
    return rep
