"""Context shift (`--context-shift`, llama-server's rule) and its exactness.

A shifted run's output is defined by llama-server's shift (docs/exactness.md,
"Context shift"): speculation must not change it, so spec-on equals spec-off
token for token and logit row for logit row, through several shifts.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from ngramspec.settings.config import SpecConfig, parse_spec_types
from ngramspec.settings.sampling import SamplingParams
from ngramspec.settings.server import ServerSettings
from together import run_alone

pytestmark = pytest.mark.model

REPEAT = "Repeat this text exactly:\n" + "The quick brown fox jumps over the lazy dog.\n" * 6
CODE = ("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
        "def mul(a, b):\n    return a * b\n\ndef div(a, b):\n    return a / b\n\ndef ")
LONG = REPEAT * 3  # 217 tokens: fits a 256-token slot, leaves ~40 to generate
LONG_CODE = CODE * 4  # 233 tokens


def run(engine, prompt, speculative, shift, n_predict=80, seq_id=0):
    return run_alone(engine, prompt, n_predict, seq_id, speculative=speculative,
                     context_shift=shift)


@pytest.mark.parametrize("text,shift,n_shifts", [(LONG, (0, 0), 1), (LONG, (-1, 0), 2),
                                                  (LONG_CODE, (8, 20), 3)])
def test_shifted_run_spec_on_equals_spec_off(make_engine, model, logit_log, text, shift, n_shifts):
    """A 256-token slot nearly full of prompt, 80 tokens out: one shift of half the
    slot, or several small ones (n_keep = the whole prompt; n_discard 20); ngram-mod
    drafts are partly rejected after a shift (rollbacks into the freed cells)."""
    prompt = model.tokenize(text)
    spec = SpecConfig(types=parse_spec_types("ngram-mod"))
    eng = make_engine(spec, n_seq=2, n_ctx=512)
    assert eng.ctx.n_ctx_seq == 256
    off, st_off = run(eng, prompt, False, shift)
    ref = logit_log.pop(id(st_off.sampler))
    on, st_on = run(eng, prompt, True, shift, seq_id=1)
    assert st_on.n_shifted == st_off.n_shifted
    assert st_off.n_shifted >= n_shifts * (20 if shift[1] else 10)
    assert st_on.steps < st_off.steps  # speculation did verify drafts
    assert on == off and logit_log[id(st_on.sampler)] == ref
    assert len(off) == 80 and st_off.finish_reason == "length"


def test_shift_keeps_n_keep_and_drops_half_the_rest(make_engine, model):
    """llama-server's numbers: n_keep (+1 for BOS), n_discard = (n_past - n_keep) / 2."""
    eng = make_engine(SpecConfig(types=()), n_seq=2, n_ctx=512)
    prompt = model.tokenize(LONG_CODE)
    _, st = run(eng, prompt, False, (10, 0), n_predict=256 - len(prompt) + 4)
    n_keep = 10 + int(model.add_bos)
    assert st.n_keep == n_keep and st.n_shifted == (255 - n_keep) // 2  # exactly one shift
    kept = st.tokens[:n_keep]
    assert np.array_equal(kept, prompt[:n_keep])
    lo, hi = eng.ctx.positions(0)
    assert (lo, hi) == (0, st.n_hist - 1)  # positions are contiguous again
    assert eng.cache[0].reusable == n_keep  # only the unshifted prefix is prompt cache


def client(shift: bool, n_ctx: int = 512):
    from fastapi.testclient import TestClient

    from ngramspec.server.app import create_app

    threads = int(os.environ.get("NGRAMSPEC_TEST_THREADS", "2"))
    s = ServerSettings(n_ctx=n_ctx, n_parallel=2, threads=threads, context_shift=shift,
                       sampling=SamplingParams(temperature=0.0),
                       spec=SpecConfig(types=parse_spec_types("ngram-mod")))
    return TestClient(create_app(s, load_async=False))



def test_server_shift_on():
    """llama.cpp's test_ctx_shift_enabled: generation goes past the slot's context."""
    with client(True) as c:
        r = c.post("/completion", json={"prompt": LONG, "n_predict": 64, "return_tokens": True})
        assert r.status_code == 200, r.text
        b = r.json()
        assert b["timings"]["predicted_n"] == 64 and b["truncated"] is True
        assert b["timings"]["prompt_n"] + 64 > 256 and b["stop_type"] == "limit"
        off = c.post("/completion", json={"prompt": LONG, "n_predict": 64, "return_tokens": True},
                     headers={"X-Ngramspec-Speculative": "off"}).json()
        assert off["tokens"] == b["tokens"]
        # the shifted KV is not reused as prompt cache beyond n_keep (BOS): same output again
        again = c.post("/completion", json={"prompt": LONG, "n_predict": 64, "id_slot": b["id_slot"],
                                            "return_tokens": True}).json()
        assert again["timings"]["cache_n"] <= 1 and again["tokens"] == b["tokens"]
        r = c.post("/v1/completions", json={"prompt": LONG, "max_tokens": 40})
        assert r.json()["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("n_predict,truncated", [(8, False), (-1, True)])
def test_server_shift_off(n_predict, truncated):
    """llama.cpp's test_ctx_shift_disabled_short_prompt: stop when the slot is full."""
    with client(False) as c:
        r = c.post("/completion", json={"prompt": LONG, "n_predict": n_predict}).json()
        n = r["timings"]["prompt_n"]
        assert r["timings"]["predicted_n"] == (8 if n_predict == 8 else 256 - n)
        assert r["truncated"] is truncated


@pytest.mark.parametrize("shift", [False, True])
def test_server_prompt_longer_than_slot_is_refused(shift):
    """llama.cpp's test_ctx_shift_disabled_long_prompt; llama-server refuses it with the
    shift on too (a prompt is never truncated)."""
    with client(shift) as c:
        r = c.post("/completion", json={"prompt": LONG * 2, "n_predict": 4})
        assert r.status_code == 400
        assert "exceeds the available context size" in r.json()["error"]["message"]


@pytest.mark.parametrize("shift", [False, True])
def test_server_prompt_filling_the_slot_generates_to_its_end(shift):
    """llama.cpp's test_slot_ctx_not_exceeded / test_with_ctx_shift: a prompt that fits
    (with llama.cpp's per-request `speculative.p_min`) leaves room until the slot is
    full; with the shift on, generation goes on past it."""
    body = {"prompt": "Hello " * 248, "temperature": 0.0, "top_k": 1,
            "speculative.p_min": 0.0, "return_tokens": True}
    with client(shift) as c:
        if shift:
            body["n_predict"] = 256
        r = c.post("/completion", json=body)
        assert r.status_code == 200, r.text
        b = r.json()
        n_prompt = b["timings"]["prompt_n"] + b["timings"]["cache_n"]
        assert 240 < n_prompt < 256 and b["truncated"] is True
        assert b["tokens_predicted"] == (256 if shift else 256 - n_prompt)
        off = c.post("/completion", json=body, headers={"X-Ngramspec-Speculative": "off"}).json()
        assert off["tokens"] == b["tokens"]
        bad = c.post("/completion", json={**body, "speculative.p_min": 1.5})
        assert bad.status_code == 400
