"""Bounded load test of `ngramspec serve` (loopback only, ~2 minutes; run with -m slow).

8 concurrent clients for NGRAMSPEC_LOAD_SECONDS (default 120): valid non-streaming
and streaming requests, clients that hang up mid-stream, and bad input. Checks:
no valid request fails, 4xx for every bad one, /health ok throughout, no slot
leaks (all idle, nothing deferred at the end), RSS stable.
"""
from __future__ import annotations

import json
import os
import threading
import time

import httpx
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.model]

CLIENTS = 8
SECONDS = float(os.environ.get("NGRAMSPEC_LOAD_SECONDS", "120"))
PROMPTS = [
    "Repeat this text exactly:\n" + "The quick brown fox jumps over the lazy dog.\n" * 5,
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n",
    "List the days of the week: Monday, Tuesday,",
    "Once upon a time, in a small village by the sea,",
]
BAD = [b"{oops", json.dumps({"prompt": 7}).encode(), json.dumps({"prompt": "x", "top_p": 3}).encode(),
       json.dumps({"prompt": "x", "speculative": {"type": "nope"}}).encode(),
       json.dumps({"prompt": "x", "grammar": "root ::= ("}).encode(),
       json.dumps({"prompt": "w " * 1200}).encode()]


@pytest.fixture(scope="module")
def server():
    from ngramspec.server.launch import start_server

    threads = os.environ.get("NGRAMSPEC_TEST_THREADS", "2")
    sp = start_server(["-np", "4", "--temp", "0", "-c", "4096", "-t", threads, "--metrics",
                       "--queue-size", "32", "--spec-type", "ngram-mod"], timeout=180)
    yield sp
    sp.stop()


def test_load(server):
    url = server.url
    stats = {"ok": 0, "bad_4xx": 0, "hangups": 0, "streams": 0}
    failures: list[str] = []
    health_bad: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def note(key):
        with lock:
            stats[key] += 1

    def fail(msg):
        with lock:
            failures.append(msg)

    with httpx.Client(base_url=url, timeout=60) as c:  # warm up, then the baseline RSS
        for p in PROMPTS:
            assert c.post("/completion", json={"prompt": p, "n_predict": 16}).status_code == 200
    rss0 = server.rss_kib()

    def client(i: int):
        k = 0
        with httpx.Client(base_url=url, timeout=300) as c:
            while not stop.is_set():
                k += 1
                p = PROMPTS[(i + k) % len(PROMPTS)]
                kind = (i + k) % 4
                try:
                    if kind == 0:  # valid, non-streaming
                        r = c.post("/completion", json={"prompt": p, "n_predict": 16})
                        if r.status_code != 200 or r.json()["tokens_predicted"] < 1:
                            fail(f"completion {r.status_code}: {r.text[:200]}")
                        else:
                            note("ok")
                    elif kind == 1:  # valid, streaming chat to the end
                        with c.stream("POST", "/v1/chat/completions", json={
                                "messages": [{"role": "user", "content": p}], "max_tokens": 16,
                                "stream": True}) as r:
                            lines = [ln for ln in r.iter_lines() if ln]
                        if r.status_code != 200 or lines[-1] != "data: [DONE]":
                            fail(f"stream {r.status_code}: {lines[-3:]}")
                        else:
                            note("streams")
                    elif kind == 2:  # hang up after the first chunk
                        with c.stream("POST", "/completion", json={"prompt": p, "n_predict": 200,
                                                                   "stream": True}) as r:
                            if r.status_code != 200:
                                fail(f"hangup stream {r.status_code}")
                            for ln in r.iter_lines():
                                if ln.startswith("data: "):
                                    break
                        note("hangups")
                    else:  # bad input
                        body = BAD[(i + k) % len(BAD)]
                        r = c.post("/completion", content=body,
                                   headers={"Content-Type": "application/json"})
                        if not 400 <= r.status_code < 500 or "error" not in r.json():
                            fail(f"bad input got {r.status_code}: {r.text[:200]}")
                        else:
                            note("bad_4xx")
                except Exception as e:  # a transport error is a failure too
                    fail(f"client {i} kind {kind}: {type(e).__name__}: {e}")

    def health():
        with httpx.Client(base_url=url, timeout=10) as c:
            while not stop.is_set():
                try:
                    r = c.get("/health")
                    if r.status_code != 200:
                        health_bad.append(f"{r.status_code} {r.text}")
                except Exception as e:
                    health_bad.append(f"{type(e).__name__}: {e}")
                stop.wait(0.5)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    threads.append(threading.Thread(target=health))
    for t in threads:
        t.start()
    stop.wait(SECONDS)
    stop.set()
    for t in threads:
        t.join(360)
    assert not any(t.is_alive() for t in threads), "a client thread hung"

    with httpx.Client(base_url=url, timeout=30) as c:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            slots = c.get("/slots").json()
            if not any(s["is_processing"] for s in slots):
                break
            time.sleep(0.1)
        metrics = c.get("/metrics").text
        assert c.get("/health").json() == {"status": "ok"}
    rss1 = server.rss_kib()
    print(f"\nload: {stats}; RSS {rss0 / 1024:.0f} -> {rss1 / 1024:.0f} MiB")
    assert not failures, failures[:10]
    assert not health_bad, health_bad[:10]
    assert not any(s["is_processing"] for s in slots), slots
    assert "llamacpp:requests_processing 0\n" in metrics
    assert "llamacpp:requests_deferred 0\n" in metrics
    assert stats["ok"] > 0 and stats["streams"] > 0 and stats["hangups"] > 0 and stats["bad_4xx"] > 0
    assert rss1 - rss0 < 150 * 1024, f"RSS grew {rss0} -> {rss1} KiB"
    assert server.proc.poll() is None
