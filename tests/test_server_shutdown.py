"""`ngramspec serve` stops at once with requests in flight: they get 503 "shutting down"
(non-streaming) or an error event (streaming), and the process exits cleanly."""
from __future__ import annotations

import os
import threading
import time

import httpx
import pytest
from server_stop import sigterm_seconds

pytestmark = pytest.mark.model


def test_shutdown_with_requests_in_flight_is_quick():
    from ngramspec.server.launch import start_server

    threads = os.environ.get("NGRAMSPEC_TEST_THREADS", "2")
    sp = start_server(["-np", "1", "-c", "2048", "-t", threads, "--spec-type", "none"],
                      timeout=180)
    results: dict = {}

    def plain():  # runs in the slot
        r = httpx.post(sp.url + "/completion", timeout=60,
                       json={"prompt": "Once upon a time", "n_predict": 1500})
        results["plain"] = (r.status_code, r.json())

    def streamed():  # queued behind it
        with httpx.stream("POST", sp.url + "/completion", timeout=60,
                          json={"prompt": "Hello", "n_predict": 1500, "stream": True}) as r:
            results["stream"] = (r.status_code, [ln for ln in r.iter_lines() if ln])

    try:
        ts = [threading.Thread(target=plain), threading.Thread(target=streamed)]
        for t in ts:
            t.start()
            time.sleep(0.3)
        took = sigterm_seconds(sp.proc, ts)
    finally:
        sp.stop()
    assert took < 1.0, f"shutdown took {took:.2f} s"
    assert sp.proc.returncode in (0, -15)  # uvicorn re-raises the signal it caught
    assert results["plain"][0] == 503
    assert results["plain"][1]["error"]["type"] == "unavailable_error"
    assert "Traceback" not in sp.log() and "CancelledError" not in sp.log()
    status, lines = results["stream"]
    assert status in (200, 503) and "shutting down" in lines[-1]
