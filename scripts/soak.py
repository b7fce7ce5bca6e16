#!/usr/bin/env python
"""Soak test of `ngramspec serve`: 4 slots, 8 clients for 2 minutes (loopback only).

    python scripts/soak.py [--seconds 120] [--clients 8] [--threads 2] [--url URL]

Without --url it starts `ngramspec serve -np 4 --metrics --slots` on a free loopback
port. The clients mix, at random (seeded): greedy non-streaming and streaming requests
on the three generation endpoints with speculation on and off (header
X-Ngramspec-Speculative), clients that hang up mid-stream, and hostile bodies (non-finite
numbers, deep nesting, dead or costly grammars, impossible schemas). Checks, printed as
a JSON report (exit 1 if one fails):
- no 5xx and no transport error on any request; every hostile body gets a 4xx;
- every greedy request repeated gives the same text, whatever the endpoint mode, the
  speculation switch, the slot or the neighbours;
- /health 200 throughout; at the end every slot idle, `requests_processing` and
  `requests_deferred` 0, no negative metric;
- resident memory after the run at most 25% above the level after warm-up.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = [
    "Repeat this text exactly:\n" + "The quick brown fox jumps over the lazy dog.\n" * 5,
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n",
    "List the days of the week: Monday, Tuesday,",
    "Once upon a time, in a small village by the sea,",
]
N_PREDICT = 24
HOSTILE = [
    b'{"prompt": "x", "temperature": NaN}',
    b'{"prompt": "x", "repeat_penalty": Infinity}',
    b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    json.dumps({"prompt": "x", "n_predict": 4, "grammar": "root ::= [z-a]"}).encode(),
    json.dumps({"prompt": "x", "n_predict": 4, "grammar": 'root ::= "a" [z-a]'}).encode(),
    json.dumps({"prompt": "x", "grammar": "root ::= " + " | ".join(
        f'"w{i}x"' for i in range(3000))}).encode(),
    json.dumps({"prompt": "x", "json_schema": {"type": "string", "minLength": 5,
                                               "maxLength": 1}}).encode(),
    json.dumps({"prompt": "x", "n_predict": 1 << 40}).encode(),
    b"{oops",
]


class Soak:
    """Shared state of one soak run: counters, failures, the first text of each request."""

    def __init__(self, url: str, seed: int):
        self.url, self.seed = url, seed
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.failures: list[str] = []
        self.texts: dict[tuple, str] = {}
        self.stop = threading.Event()

    def note(self, key: str) -> None:
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1

    def fail(self, msg: str) -> None:
        with self.lock:
            self.failures.append(msg)

    def same_text(self, key: tuple, text: str) -> None:
        """The first greedy text for `key` is the reference; a later one must equal it."""
        with self.lock:
            ref = self.texts.setdefault(key, text)
        if text != ref:
            self.fail(f"greedy text changed for {key}: {ref!r} then {text!r}")
        else:
            self.note("repeat_same")

    # ------------------------------------------------------------ one request of each kind
    def plain(self, c: httpx.Client, rng: random.Random, stream: bool) -> None:
        p = rng.randrange(len(PROMPTS))
        path = rng.choice(["/completion", "/v1/completions", "/v1/chat/completions"])
        spec = rng.choice(["on", "off"])
        body = ({"messages": [{"role": "user", "content": PROMPTS[p]}], "max_tokens": N_PREDICT}
                if "chat" in path else {"prompt": PROMPTS[p], "n_predict": N_PREDICT,
                                        "max_tokens": N_PREDICT})
        body.update(temperature=0, stream=stream)
        headers = {"X-Ngramspec-Speculative": spec}
        if stream:
            with c.stream("POST", path, json=body, headers=headers) as r:
                lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
            text = "".join(_delta(json.loads(ln[6:])) for ln in lines if ln != "data: [DONE]")
        else:
            r = c.post(path, json=body, headers=headers)
            text = _delta(r.json()) if r.status_code == 200 else ""
        if r.status_code != 200:
            self.fail(f"{path} stream={stream} spec={spec}: {r.status_code}")
            return
        self.same_text((path, p), text)
        self.note("stream" if stream else "plain")

    def hangup(self, c: httpx.Client, rng: random.Random) -> None:
        """Stream a long answer and hang up after a random number of chunks."""
        body = {"prompt": rng.choice(PROMPTS), "n_predict": 300, "stream": True}
        after = rng.randrange(1, 20)
        with c.stream("POST", "/completion", json=body) as r:
            if r.status_code != 200:
                self.fail(f"hangup stream got {r.status_code}")
            for i, _ in enumerate(r.iter_lines()):
                if i >= after:
                    break
        self.note("hangup")

    def hostile(self, c: httpx.Client, rng: random.Random) -> None:
        body = rng.choice(HOSTILE)
        r = c.post("/completion", content=body, headers={"Content-Type": "application/json"})
        if not 400 <= r.status_code < 500 or "error" not in r.json():
            self.fail(f"hostile body got {r.status_code}: {r.text[:200]}")
        else:
            self.note("hostile_4xx")

    def client(self, i: int) -> None:
        rng = random.Random(self.seed * 1000 + i)
        with httpx.Client(base_url=self.url, timeout=300) as c:
            while not self.stop.is_set():
                kind = rng.choices(["plain", "stream", "hangup", "hostile"], [3, 3, 2, 2])[0]
                try:
                    if kind == "hangup":
                        self.hangup(c, rng)
                    elif kind == "hostile":
                        self.hostile(c, rng)
                    else:
                        self.plain(c, rng, kind == "stream")
                except Exception as e:  # a transport error is a failure too
                    self.fail(f"client {i} {kind}: {type(e).__name__}: {e}")

    def health(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as c:
            while not self.stop.is_set():
                try:
                    r = c.get("/health")
                    if r.status_code != 200:
                        self.fail(f"/health {r.status_code}")
                except Exception as e:
                    self.fail(f"/health: {type(e).__name__}: {e}")
                self.stop.wait(0.5)


def _delta(obj: dict) -> str:
    """The text of a response or streamed chunk of any of the three endpoints."""
    if "content" in obj:
        return obj["content"] or ""
    ch = (obj.get("choices") or [{}])[0]
    if "text" in ch:
        return ch["text"] or ""
    return (ch.get("message") or ch.get("delta") or {}).get("content") or ""


def _final_state(url: str) -> tuple[list, str]:
    with httpx.Client(base_url=url, timeout=30) as c:
        deadline = time.monotonic() + 15
        while True:
            slots = c.get("/slots").json()
            if not any(s["is_processing"] for s in slots) or time.monotonic() > deadline:
                return slots, c.get("/metrics").text
            time.sleep(0.1)


def soak(url: str, rss_kib, seconds: float = 120, clients: int = 8, seed: int = 0) -> dict:
    """Run the soak against a server at `url` (`rss_kib()` reads its resident memory);
    the report's `failures` is empty when every check passed."""
    s = Soak(url, seed)
    with httpx.Client(base_url=url, timeout=120) as c:  # warm-up: every prompt, both modes
        for _ in range(2):
            for i in range(2 * len(PROMPTS)):
                s.plain(c, random.Random(i), stream=bool(i % 2))
    rss0 = rss_kib()
    threads = [threading.Thread(target=s.client, args=(i,)) for i in range(clients)]
    threads.append(threading.Thread(target=s.health))
    for t in threads:
        t.start()
    s.stop.wait(seconds)
    s.stop.set()
    for t in threads:
        t.join(360)
    if any(t.is_alive() for t in threads):
        s.fail("a client thread hung")
    slots, metrics = _final_state(url)
    rss1 = rss_kib()
    if any(x["is_processing"] for x in slots):
        s.fail(f"slots still busy: {[x['id'] for x in slots if x['is_processing']]}")
    for name in ("requests_processing", "requests_deferred"):
        if f"llamacpp:{name} 0\n" not in metrics:
            s.fail(f"/metrics {name} is not 0 at the end")
    for line in metrics.splitlines():
        if line and not line.startswith("#") and float(line.rsplit(" ", 1)[1]) < 0:
            s.fail(f"negative metric: {line}")
    if rss1 > 1.25 * rss0:
        s.fail(f"resident memory grew {rss0 / 1024:.0f} -> {rss1 / 1024:.0f} MiB (> 25%)")
    return {"seconds": seconds, "clients": clients, "counts": s.counts,
            "distinct_greedy_requests": len(s.texts), "rss_mib": [rss0 / 1024, rss1 / 1024],
            "failures": s.failures[:20], "n_failures": len(s.failures)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--url", help="an already running server (its memory is not checked)")
    a = ap.parse_args()
    if a.url:
        report = soak(a.url, lambda: 1, a.seconds, a.clients, a.seed)
    else:
        from ngramspec.server.launch import start_server

        sp = start_server(["-np", "4", "--temp", "0", "-c", "4096", "-t", str(a.threads),
                           "--metrics", "--slots", "--queue-size", "64"], timeout=300)
        try:
            report = soak(sp.url, sp.rss_kib, a.seconds, a.clients, a.seed)
            report["server_alive"] = sp.proc.poll() is None
        finally:
            sp.stop()
    print(json.dumps(report, indent=1))
    return 1 if report["failures"] or not report.get("server_alive", True) else 0


if __name__ == "__main__":
    sys.exit(main())
