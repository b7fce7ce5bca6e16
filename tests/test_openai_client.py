"""The official `openai` client against a live `ngramspec serve`: chat, completions,
streaming and `logit_bias` (exact with speculation)."""
from __future__ import annotations

import os

import httpx
import pytest

pytestmark = pytest.mark.model

N = 16
OFF = {"X-Ngramspec-Speculative": "off"}
MSGS = [{"role": "user", "content": "Copy this text:\nThe quick brown fox jumps over the lazy "
         "dog.\nThe quick brown fox jumps over the lazy dog."}]
# drafts on short repeats too
EAGER = {"speculative": {"type": "ngram-simple", "ngram_size_n": 3, "ngram_size_m": 8}}
PROMPT = "Repeat this text exactly:\n" + "The quick brown fox jumps over the lazy dog.\n" * 4


@pytest.fixture(scope="module")
def server():
    from ngramspec.server.launch import start_server

    threads = os.environ.get("NGRAMSPEC_TEST_THREADS", "2")
    sp = start_server(["-np", "2", "--temp", "0", "-c", "2048", "-t", threads,
                       "--spec-type", "ngram-mod"], timeout=180)
    yield sp
    sp.stop()


@pytest.fixture(scope="module")
def oai(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="none", timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def test_chat_and_completions(oai):
    chat = oai.chat.completions.create(model="m", messages=MSGS, max_tokens=N, temperature=0)
    assert chat.choices[0].message.content and chat.choices[0].logprobs is None
    cmpl = oai.completions.create(model="m", prompt=PROMPT, max_tokens=N, temperature=0)
    assert cmpl.choices[0].text and cmpl.usage.completion_tokens == N


def test_streaming_chat_and_completions(oai):
    full = oai.chat.completions.create(model="m", messages=MSGS, max_tokens=N, temperature=0)
    chunks = list(oai.chat.completions.create(model="m", messages=MSGS, max_tokens=N,
                                              temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == \
        full.choices[0].message.content
    parts = oai.completions.create(model="m", prompt=PROMPT, max_tokens=N, temperature=0,
                                   stream=True)
    text = "".join(c.choices[0].text for c in parts)
    assert text == oai.completions.create(model="m", prompt=PROMPT, max_tokens=N,
                                          temperature=0).choices[0].text


def test_logit_bias_object_form_keeps_speculation_exact(oai):
    plain = oai.completions.create(model="m", prompt=PROMPT, max_tokens=N, temperature=0)
    bias = {"37423": -100}  # " fox"
    on = oai.completions.create(model="m", prompt=PROMPT, max_tokens=N, temperature=0,
                                logit_bias=bias, extra_body=EAGER)
    off = oai.completions.create(model="m", prompt=PROMPT, max_tokens=N, temperature=0,
                                 logit_bias=bias, extra_headers=OFF)
    assert " fox" in plain.choices[0].text and " fox" not in on.choices[0].text
    assert on.choices[0].text == off.choices[0].text
    assert on.model_extra["timings"]["draft_n_accepted"] > 0


def test_native_logit_bias_ban_and_ignore_eos(http):
    plain = http.post("/completion", json={"prompt": PROMPT, "n_predict": N}).json()
    assert " fox" in plain["content"]
    body = {"prompt": PROMPT, "n_predict": N, "logit_bias": [[" fox", False]], **EAGER}
    on = http.post("/completion", json=body).json()
    off = http.post("/completion", json=body, headers=OFF).json()
    assert " fox" not in on["content"] and on["content"] == off["content"]
    r = http.post("/completion", json={"prompt": "Say hi.", "n_predict": 24,
                                       "ignore_eos": True}).json()
    assert r["tokens_predicted"] == 24
