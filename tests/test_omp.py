"""omp.on_passing_thread and load_engine: the decodes of loading run on a thread
that has ended when load_engine returns (no OpenMP pool left on the caller's thread)."""
from __future__ import annotations

import threading

import pytest

from ngramspec.errors import ConfigError
from ngramspec.llama.omp import on_passing_thread


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


def test_load_engine_loads_off_the_callers_thread(monkeypatch, threads):
    """Whatever loading runs in llama.cpp (model loads, context creation, any decode)
    runs on threads that have ended when load_engine returns."""
    from ngramspec.settings.config import SpecConfig
    from ngramspec.llama.context import Context
    from ngramspec.llama.model import Model
    from ngramspec.engine.runtime import load_engine
    from ngramspec.settings.engine import EngineSettings

    loaders = set()

    def recorded(fn):
        def call(self, *a, **kw):
            loaders.add(threading.current_thread())
            return fn(self, *a, **kw)
        return call

    for cls, name in ((Model, "__init__"), (Context, "__init__"), (Context, "run_rows")):
        monkeypatch.setattr(cls, name, recorded(getattr(cls, name)))
    engine = load_engine(EngineSettings(n_ctx=1024, threads=threads, n_seq=2,
                                        spec=SpecConfig(policy="cost")))
    try:
        assert loaders and threading.current_thread() not in loaders
        assert not any(t.is_alive() for t in loaders)
    finally:
        engine.ctx.close()
        engine.model.close()
    with pytest.raises(ConfigError, match="ctx-size"):
        load_engine(EngineSettings(n_ctx=8, threads=threads))
