"""omp.on_passing_thread and load_engine: the decodes of loading run on a thread
that has ended when load_engine returns (no OpenMP pool left on the caller's thread)."""
from __future__ import annotations

import threading

import pytest

from ngramspec.errors import ConfigError
from ngramspec.omp import on_passing_thread


def test_passing_thread_returns_result_and_has_ended():
    seen = []

    @on_passing_thread
    def work(a, b=0):
        seen.append(threading.current_thread())
        return a + b

    assert work(2, b=3) == 5
    assert work.__name__ == "work"
    [t] = seen
    assert t is not threading.current_thread() and not t.is_alive()


def test_passing_thread_raises_in_the_caller():
    @on_passing_thread
    def fail():
        raise ConfigError("bad flag")

    with pytest.raises(ConfigError, match="bad flag"):
        fail()


def test_load_engine_decodes_off_the_callers_thread(monkeypatch, threads):
    from ngramspec.config import SpecConfig
    from ngramspec.model import Context
    from ngramspec.runtime import load_engine

    decoders = set()
    orig = Context._run

    def run(self, *a, **kw):
        decoders.add(threading.current_thread())
        return orig(self, *a, **kw)

    monkeypatch.setattr(Context, "_run", run)
    engine = load_engine(None, None, 1024, threads, SpecConfig(policy="cost"), n_seq=2)
    try:
        assert decoders, "loading a cost-policy engine decodes (warm-up, calibration)"
        assert threading.current_thread() not in decoders
        assert not any(t.is_alive() for t in decoders)
    finally:
        engine.ctx.close()
        engine.model.close()
    with pytest.raises(ConfigError, match="ctx-size"):
        load_engine(None, None, 8, threads, SpecConfig())
