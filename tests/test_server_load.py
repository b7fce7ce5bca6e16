"""Soak test of `ngramspec serve` (loopback only, ~2.5 minutes; run with -m slow).

4 slots, 8 clients for NGRAMSPEC_LOAD_SECONDS (default 120), through scripts/soak.py
(also runnable on its own): greedy requests on every generation endpoint, streaming and
not, speculation on and off, hang-ups mid-stream and hostile bodies. Checks: no 5xx or
transport error, 4xx for every hostile body, every repeated greedy request the same
text, /health ok throughout, slots idle and /metrics consistent at the end, resident
memory within 25% of its level after warm-up.
"""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.model]

SECONDS = float(os.environ.get("NGRAMSPEC_LOAD_SECONDS", "120"))
_SPEC = importlib.util.spec_from_file_location(
    "soak", Path(__file__).resolve().parents[1] / "scripts" / "soak.py")
soak = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(soak)


@pytest.fixture(scope="module")
def server():
    from ngramspec.server.launch import start_server

    threads = os.environ.get("NGRAMSPEC_TEST_THREADS", "2")
    sp = start_server(["-np", "4", "--temp", "0", "-c", "4096", "-t", threads, "--metrics",
                       "--slots", "--queue-size", "64"], timeout=180)
    yield sp
    sp.stop()


def test_soak(server):
    report = soak.soak(server.url, server.rss_kib, SECONDS, clients=8)
    print("\n" + json.dumps(report))
    assert not report["failures"], report
    c = report["counts"]
    assert all(c.get(k, 0) > 0 for k in ("plain", "stream", "hangup", "hostile_4xx")), c
    assert c.get("repeat_same", 0) > report["distinct_greedy_requests"], c
    assert server.proc.poll() is None
