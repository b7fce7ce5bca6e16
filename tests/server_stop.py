"""Stopping a server process the way a user does (SIGTERM) and timing it."""
from __future__ import annotations

import time


def sigterm_seconds(proc, clients) -> float:
    """Send SIGTERM to `proc` and return the seconds until it exited (at most ~10 s);
    then wait for the client threads `clients` to finish."""
    t0 = time.monotonic()
    proc.terminate()
    proc.wait(10)
    took = time.monotonic() - t0
    for t in clients:
        t.join(10)
    return took
