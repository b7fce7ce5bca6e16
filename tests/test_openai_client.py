"""The official `openai` client against a live `ngramspec serve`: chat, completions,
streaming, `logit_bias` (exact with speculation), per-token probabilities (`logprobs`,
`top_logprobs`, native `n_probs`) and `n` choices."""
from __future__ import annotations

import json
import os

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


def test_chat_logprobs_are_the_same_with_and_without_speculation(oai):
    def ask(headers):
        return oai.chat.completions.create(model="m", messages=MSGS, max_tokens=N, temperature=0,
                                           logprobs=True, top_logprobs=3, extra_headers=headers,
                                           extra_body=EAGER)

    on, off = ask({}), ask(OFF)
    content = on.choices[0].logprobs.content
    assert "".join(t.token for t in content) == on.choices[0].message.content
    assert len(content) == on.usage.completion_tokens
    for t in content:
        assert t.logprob <= 0.0 and t.bytes == list(t.token.encode())
        assert len(t.top_logprobs) == 3
        assert all(a.logprob >= b.logprob for a, b in zip(t.top_logprobs, t.top_logprobs[1:]))
        assert t.top_logprobs[0].logprob == t.logprob  # greedy: the most likely token
    assert on.model_extra["timings"].get("draft_n_accepted", 0) > 0, on.choices[0].message.content
    assert off.choices[0].message.content == on.choices[0].message.content
    assert [t.model_dump() for t in off.choices[0].logprobs.content] == \
        [t.model_dump() for t in content]


def test_streamed_chat_logprobs_one_token_per_chunk(oai):
    full = oai.chat.completions.create(model="m", messages=MSGS, max_tokens=N, temperature=0,
                                       logprobs=True, top_logprobs=3)
    chunks = list(oai.chat.completions.create(model="m", messages=MSGS, max_tokens=N,
                                              temperature=0, logprobs=True, top_logprobs=3,
                                              stream=True, extra_body=EAGER))
    with_probs = [c for c in chunks if c.choices and c.choices[0].logprobs]
    assert all(len(c.choices[0].logprobs.content) == 1 for c in with_probs)
    assert all(c.choices[0].delta.content == c.choices[0].logprobs.content[0].token
               for c in with_probs)
    got = [c.choices[0].logprobs.content[0] for c in with_probs]
    assert [t.model_dump() for t in got] == \
        [t.model_dump() for t in full.choices[0].logprobs.content]


def test_completions_logprobs_legacy_and_llama_server_forms(oai):
    r = oai.completions.create(model="m", prompt=PROMPT, max_tokens=N, temperature=0, logprobs=3)
    lp, text = r.choices[0].logprobs, r.choices[0].text
    assert len(lp.tokens) == N and "".join(lp.tokens) == text
    assert all(x <= 0.0 for x in lp.token_logprobs) and all(len(d) <= 3 for d in lp.top_logprobs)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:k]) for k in range(N)]
    content = lp.model_extra["content"]  # llama-server's form as well
    assert [c["token"] for c in content] == lp.tokens
    assert [c["logprob"] for c in content] == lp.token_logprobs
    echo = oai.completions.create(model="m", prompt=PROMPT, max_tokens=4, temperature=0,
                                  logprobs=1, echo=True)
    assert echo.choices[0].logprobs.text_offset[0] == len(PROMPT)


def test_n_two_choices_equal_the_greedy_one(oai):
    chat = oai.chat.completions.create(model="m", messages=MSGS, max_tokens=N, temperature=0, n=2)
    one = oai.chat.completions.create(model="m", messages=MSGS, max_tokens=N, temperature=0)
    assert [c.index for c in chat.choices] == [0, 1]
    assert [c.message.content for c in chat.choices] == [one.choices[0].message.content] * 2
    assert chat.usage.prompt_tokens == one.usage.prompt_tokens
    assert chat.usage.completion_tokens == 2 * one.usage.completion_tokens
    stream = oai.chat.completions.create(model="m", messages=MSGS, max_tokens=N, temperature=0,
                                         n=2, stream=True,
                                         stream_options={"include_usage": True})
    texts, finished = ["", ""], [None, None]
    chunks = list(stream)
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            finished[ch.index] = ch.finish_reason or finished[ch.index]
    assert texts == [one.choices[0].message.content] * 2 and finished == ["length"] * 2
    assert chunks[-1].usage.completion_tokens == 2 * N


def test_n_choices_of_a_batch_of_prompts(oai):
    r = oai.completions.create(model="m", prompt=[PROMPT, "Say hi."], max_tokens=4,
                               temperature=0, n=2)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text and r.choices[2].text == r.choices[3].text
    single = oai.completions.create(model="m", prompt=[PROMPT, "Say hi."], max_tokens=4,
                                    temperature=0)
    assert r.usage.prompt_tokens == single.usage.prompt_tokens
    assert r.usage.completion_tokens == 2 * single.usage.completion_tokens


def test_native_n_probs_and_stream(http):
    body = {"prompt": PROMPT, "n_predict": 8, "n_probs": 4, "temperature": 0, **EAGER}
    r = http.post("/completion", json=body).json()
    probs = r["completion_probabilities"]
    assert len(probs) == 8 and "".join(p["token"] for p in probs) == r["content"]
    for p in probs:
        assert set(p) == {"id", "token", "bytes", "logprob", "top_logprobs"}
        assert len(p["top_logprobs"]) == 4
        assert set(p["top_logprobs"][0]) == {"id", "token", "bytes", "logprob"}
    with http.stream("POST", "/completion", json={**body, "stream": True}) as s:
        events = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: ")]
    partial = [e for e in events if not e["stop"]]
    assert all(len(e["completion_probabilities"]) == 1 for e in partial)
    assert [e["completion_probabilities"][0] for e in partial] == probs
    assert [e["tokens_predicted"] for e in partial] == list(range(1, 9))
    assert events[-1]["stop"] and events[-1]["content"] == ""


def test_native_post_sampling_probs_and_n_cmpl(http):
    r = http.post("/completion", json={"prompt": PROMPT, "n_predict": 4, "n_probs": 3,
                                       "post_sampling_probs": True, "temperature": 0.8,
                                       "seed": 1}).json()
    for p in r["completion_probabilities"]:
        assert 0.0 < p["prob"] <= 1.0 and 1 <= len(p["top_probs"]) <= 3
        assert all(0.0 < q["prob"] <= 1.0 for q in p["top_probs"])
    two = http.post("/completion", json={"prompt": PROMPT, "n_predict": 4, "n_cmpl": 2}).json()
    assert [x["index"] for x in two] == [0, 1] and two[0]["content"] == two[1]["content"]


@pytest.mark.parametrize("path,extra", [
    ("/v1/chat/completions", {"top_logprobs": 2}),  # without logprobs: true
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}),
    ("/v1/chat/completions", {"n": 0}),
    ("/v1/chat/completions", {"n": 3}),  # more choices than slots (-np 2)
    ("/v1/completions", {"logprobs": -1}),
    ("/v1/completions", {"n": 1000}),
    ("/completion", {"n_probs": -1}),
    ("/completion", {"n_probs": 10 ** 9}),
    ("/completion", {"n_cmpl": 3}),
])
def test_bad_probability_and_choice_counts_are_400(http, path, extra):
    body = {"messages": MSGS} if "chat" in path else {"prompt": PROMPT}
    r = http.post(path, json={**body, "max_tokens": 2, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
