"""llama-server's API details on a live `ngramspec serve` with ONE slot: cancellation
of a disconnected client, bad input, /tokenize & co., response shapes, /metrics."""
from __future__ import annotations

import json
import os
import re
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.model

LONG = "Once upon a time, in a small village by the sea, there lived"


@pytest.fixture(scope="module")
def server():
    from ngramspec.server.launch import start_server

    threads = os.environ.get("NGRAMSPEC_TEST_THREADS", "2")
    sp = start_server(["-np", "1", "--temp", "0", "-c", "2048", "-t", threads, "--metrics",
                       "--spec-type", "ngram-mod", "--verbose"], timeout=180)
    yield sp
    sp.stop()


def slot_idle(http) -> bool:
    return not any(s["is_processing"] for s in http.get("/slots").json())


def wait_idle(http, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if slot_idle(http):
            return time.monotonic() - t0
        time.sleep(0.02)
    raise AssertionError(f"the slot is still busy after {timeout} s")


# ------------------------------------------------------------------ cancellation


@pytest.mark.parametrize("stream", [False, True])
def test_disconnected_client_frees_the_slot(server, http, stream):
    """1 slot: a long request whose client hangs up after 0.5 s must not keep the slot;
    the next request is served at once."""
    def doomed():  # hang up after 0.5 s, whatever has arrived by then
        body = {"prompt": LONG, "n_predict": 1500, "stream": stream,
                "speculative": {"type": "none"}}
        t0 = time.monotonic()
        with httpx.Client(base_url=server.url, timeout=0.5) as c:
            try:
                with c.stream("POST", "/completion", json=body) as r:
                    for _ in r.iter_raw():
                        if time.monotonic() - t0 > 0.5:
                            break
            except httpx.TimeoutException:
                pass

    t = threading.Thread(target=doomed)
    t.start()
    time.sleep(0.25)
    assert not slot_idle(http)  # it is generating
    t.join()
    assert wait_idle(http, timeout=2.0) < 1.0
    t0 = time.monotonic()
    r = http.post("/completion", json={"prompt": "Hello", "n_predict": 4})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 4
    assert time.monotonic() - t0 < 3.0
    wait_idle(http, timeout=0.5)


# ------------------------------------------------------------------ bad input


def test_lone_surrogate_is_a_client_error(http):
    raw = b'{"prompt": "abc \\ud800 def", "n_predict": 2}'
    r = http.post("/completion", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "surrogate" in r.json()["error"]["message"]
    raw = b'{"messages": [{"role": "user", "content": "x\\udfff"}], "max_tokens": 2}'
    r = http.post("/v1/chat/completions", content=raw,
                  headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    raw = b'{"prompt": "\\ud83e\\udd17", "n_predict": 1}'  # a proper pair is text
    assert http.post("/completion", content=raw,
                     headers={"Content-Type": "application/json"}).status_code == 200


def test_two_trailing_assistant_messages_are_400(http):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"},
            {"role": "assistant", "content": "b"}]
    r = http.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 2})
    assert r.status_code == 400 and "assistant" in r.json()["error"]["message"]
    r = http.post("/v1/chat/completions", json={
        "messages": msgs[:2], "max_tokens": 2, "add_generation_prompt": True,
        "continue_final_message": True})
    assert r.status_code == 400


def test_assistant_prefill_continues_the_last_message(http):
    msgs = [{"role": "user", "content": "Name a fruit."},
            {"role": "assistant", "content": "The fruit is"}]
    p = http.post("/apply-template", json={"messages": msgs}).json()["prompt"]
    assert p.endswith("<start_of_turn>model\nThe fruit is")
    full = http.post("/apply-template", json={"messages": msgs[:1]}).json()["prompt"]
    assert full.endswith("<start_of_turn>model\n") and p.startswith(full)


# ------------------------------------------------------------------ endpoints


def test_tokenize_detokenize(http):
    text = "What is the capital of France?"
    toks = http.post("/tokenize", json={"content": text}).json()["tokens"]
    assert len(toks) > 5 and all(isinstance(t, int) for t in toks)
    with_bos = http.post("/tokenize", json={"content": text, "add_special": True}).json()
    assert with_bos["tokens"] == [2] + toks  # Gemma's BOS
    assert http.post("/detokenize", json={"tokens": toks}).json() == {"content": text}
    assert http.post("/tokenize", json={}).json() == {"tokens": []}
    r = http.post("/detokenize", json={"tokens": [1, 10 ** 9]})
    assert r.status_code == 400


def test_tokenize_with_pieces(http):
    text = "unicode 媽 and emoji 🤗"
    ids = http.post("/tokenize", json={"content": text}).json()["tokens"]
    pieces = http.post("/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == ids
    raw = b""
    for p in pieces:
        assert isinstance(p["piece"], (str, list)) and len(p["piece"]) > 0
        raw += p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"])
    assert raw.decode() == text


def test_apply_template_and_input_tokens(http):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    p = http.post("/apply-template", json={"messages": msgs}).json()["prompt"]
    assert p == "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    n = http.post("/v1/chat/completions/input_tokens", json={"messages": msgs}).json()
    toks = http.post("/tokenize", json={"content": p, "add_special": True}).json()["tokens"]
    assert n == {"input_tokens": len(toks), "object": "response.input_tokens"}
    r = http.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 1}).json()
    assert r["usage"]["prompt_tokens"] == len(toks)


def test_openai_batch_prompts_one_choice_each(http):
    prompts = ["def add(a, b):", "The capital of France is"]
    single = [http.post("/v1/completions", json={"prompt": p, "max_tokens": 6}).json()
              for p in prompts]
    r = http.post("/v1/completions", json={"prompt": prompts, "max_tokens": 6})
    assert r.status_code == 200, r.text
    b = r.json()
    assert [c["index"] for c in b["choices"]] == [0, 1]
    assert [c["text"] for c in b["choices"]] == [s["choices"][0]["text"] for s in single]
    assert b["usage"]["completion_tokens"] == sum(s["usage"]["completion_tokens"] for s in single)


def test_native_batch_prompts_as_llama_server(http):
    """A list with no number at its top level is a batch: one result per prompt."""
    text = "I believe the meaning of life is"
    toks = http.post("/tokenize", json={"content": text, "add_special": True}).json()["tokens"]
    one = http.post("/completion", json={"prompt": text, "n_predict": 5}).json()
    for prompt in ([toks, toks], [toks, text], [toks, {"prompt_string": text}], [text, text]):
        r = http.post("/completion", json={"prompt": prompt, "n_predict": 5})
        assert r.status_code == 200, r.text
        b = r.json()
        assert isinstance(b, list) and [x["index"] for x in b] == [0, 1]
        assert [x["content"] for x in b] == [one["content"]] * 2
    single = http.post("/completion", json={"prompt": {"prompt_string": text}, "n_predict": 5})
    assert single.json()["content"] == one["content"]
    media = http.post("/completion", json={"prompt": {"prompt_string": text,
                                                      "multimodal_data": ["aGk="]}})
    assert media.status_code == 400
    mixed = http.post("/completion", json={"prompt": [2, 818, text, 3823], "n_predict": 2})
    assert isinstance(mixed.json()["content"], str)
    ev = sse_events(http, "/completion", {"prompt": [text, text], "n_predict": 5, "stream": True})
    finals = [e for e in ev if e["stop"]]
    assert sorted(e["index"] for e in finals) == [0, 1]
    for i in (0, 1):
        assert "".join(e["content"] for e in ev if e["index"] == i) == one["content"]


def test_verbose_carries_the_native_result(http):
    b = http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "What is the best book"}],
        "max_tokens": 4}).json()
    v = b["__verbose"]
    assert v["prompt"] == "<bos><start_of_turn>user\nWhat is the best book<end_of_turn>\n" \
                          "<start_of_turn>model\n"
    assert v["content"] == b["choices"][0]["message"]["content"]
    off = http.post("/v1/chat/completions", json={  # per request, as llama-server's `verbose`
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "verbose": False})
    assert "__verbose" not in off.json()


# ------------------------------------------------------------------ response shapes


def sse_events(http, path, body):
    with http.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        return [json.loads(ln[6:]) for ln in r.iter_lines()
                if ln.startswith("data: ") and ln != "data: [DONE]"]


def test_chat_stream_first_chunk_and_timings_per_token(http):
    ev = sse_events(http, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "test"}], "max_tokens": 10, "stream": True,
        "stream_options": {"include_usage": True}, "timings_per_token": True})
    assert ev[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert "timings" not in ev[0]
    assert all("role" not in e["choices"][0]["delta"] for e in ev[1:] if e["choices"])
    texts = [e for e in ev[1:] if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert texts and all("timings" in e for e in texts)
    assert ev[-1]["choices"] == [] and ev[-1]["timings"]["predicted_n"] <= 10
    assert ev[-2]["choices"][0]["delta"] == {} and ev[-2]["choices"][0]["finish_reason"]
    assert re.fullmatch(r"b\d+-[0-9a-f]+", ev[0]["system_fingerprint"])


def test_return_progress(http):
    prompt = "the quick brown fox jumps over the lazy dog " * 40
    ev = sse_events(http, "/completion", {"prompt": prompt, "n_predict": 4, "stream": True,
                                          "return_progress": True, "timings_per_token": True,
                                          "cache_prompt": False})
    prog = [e["prompt_progress"] for e in ev if "prompt_progress" in e]
    assert len(prog) >= 2
    assert prog[0]["cache"] == prog[0]["processed"] and prog[0]["total"] > 300
    first = next(e for e in ev if "prompt_progress" in e)["timings"]
    assert first["prompt_n"] == 0 and first["prompt_ms"] == 0.0
    assert all(b["processed"] > a["processed"] for a, b in zip(prog, prog[1:]))
    assert prog[-1]["processed"] == prog[-1]["total"]
    assert ev[-1]["stop"] is True and ev[-1]["timings"]["predicted_n"] == 4


def test_response_fields(http):
    b = http.post("/completion", json={"prompt": "I believe the meaning of life is",
                                       "n_predict": 8, "response_fields": [
                                           "content", "generation_settings/n_predict", "prompt",
                                           "no/such"]}).json()
    assert set(b) == {"content", "generation_settings/n_predict", "prompt"}
    assert b["generation_settings/n_predict"] == 8
    assert b["prompt"] == "<bos>I believe the meaning of life is"


def test_single_token_rate_and_cache_n(http):
    t = http.post("/completion", json={"prompt": "I believe", "n_predict": 1}).json()["timings"]
    assert t["predicted_n"] == 1 and t["predicted_per_second"] == 0.0 and "cache_n" in t


def test_slots_next_token_is_a_list(http):
    http.post("/completion", json={"prompt": "I believe", "n_predict": 8})
    for s in http.get("/slots").json():
        assert s["next_token"][0]["n_remain"] == -1 and s["next_token"][0]["n_decoded"] == 0


def test_metrics_names_and_header(http):
    prompt = "the quick brown fox jumps over the lazy dog " * 30  # long: its KV is reused
    n_pred = sum(http.post("/completion", json={"prompt": prompt, "n_predict": 4})
                 .json()["timings"]["predicted_n"] for _ in range(2))
    r = http.get("/metrics")
    assert int(r.headers["Process-Start-Time-Unix"]) > 1_600_000_000
    types = dict(ln.split(" ")[2:4] for ln in r.text.splitlines() if ln.startswith("# TYPE "))
    for name in ("prompt_tokens_total", "prompt_tokens_cached_total", "prompt_seconds_total",
                 "tokens_predicted_total", "tokens_predicted_seconds_total", "n_decode_total",
                 "n_tokens_max", "spec_decode_num_draft_tokens_total",
                 "spec_decode_num_accepted_tokens_total", "spec_decode_num_drafts_total",
                 "spec_rested_steps_total"):
        assert types[f"llamacpp:{name}"] == "counter", name
    for name in ("prompt_tokens_seconds", "predicted_tokens_seconds", "requests_processing",
                 "requests_deferred", "n_busy_slots_per_decode"):
        assert types[f"llamacpp:{name}"] == "gauge", name
    assert not any(k.startswith("ngramspec:") for k in types)
    values = {ln.split(" ")[0]: float(ln.split(" ")[1]) for ln in r.text.splitlines()
              if ln.startswith("llamacpp:") and "{" not in ln}
    assert values["llamacpp:prompt_tokens_cached_total"] > 0  # the second request reused it
    assert values["llamacpp:tokens_predicted_total"] >= n_pred
    assert values["llamacpp:requests_processing"] == 0


# ------------------------------------------------------------------ the openai client


def test_openai_client_chat_completions_streaming(server):
    from openai import OpenAI

    oai = OpenAI(base_url=server.url + "/v1", api_key="none", timeout=120, max_retries=0)
    msgs = [{"role": "user", "content": "Count from one to five."}]
    full = oai.chat.completions.create(model="m", messages=msgs, max_tokens=12, temperature=0)
    assert full.choices[0].message.content and full.system_fingerprint.startswith("b")
    chunks = list(oai.chat.completions.create(model="m", messages=msgs, max_tokens=12,
                                              temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == \
        full.choices[0].message.content
    c = oai.completions.create(model="m", prompt=["Monday, Tuesday,", "1, 2, 3,"], max_tokens=6,
                               temperature=0)
    assert [ch.index for ch in c.choices] == [0, 1] and all(ch.text for ch in c.choices)
    s = list(oai.completions.create(model="m", prompt="Monday, Tuesday,", max_tokens=6,
                                    temperature=0, stream=True))
    assert "".join(x.choices[0].text for x in s if x.choices) == c.choices[0].text


# ------------------------------------------------------------------ CORS


def test_cors_preflight_and_origin(server):
    r = httpx.options(server.url + "/completions", headers={
        "Origin": "web.mydomain.fr", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "Authorization"})
    assert r.status_code == 200
    assert r.headers["Access-Control-Allow-Origin"] == "web.mydomain.fr"
    assert r.headers["Access-Control-Allow-Credentials"] == "true"
    assert r.headers["Access-Control-Allow-Methods"] == "GET, POST, DELETE, OPTIONS"
    assert r.headers["Access-Control-Allow-Headers"] == "*"
    r = httpx.get(server.url + "/health", headers={"Origin": "http://localhost:3000"})
    assert r.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"


def test_cors_localhost_only():
    from ngramspec.server.cors import allow_origin

    for o in ("http://localhost", "http://127.0.0.1:3000", "http://[::1]:3000"):
        assert allow_origin("localhost", o) == o
    for o in ("http://evil.com", "http://notlocalhost", "http://localhost.evil.com", ""):
        assert allow_origin("localhost", o) is None
    assert allow_origin("https://a.example", "http://b.example") == "https://a.example"


def test_penalties_are_reported_in_generation_settings(http):
    """OpenAI's presence/frequency penalties reach the sampler and are reported as
    llama-server reports them."""
    body = {"prompt": "Repeat after me: " + "the cat sat on the mat, " * 8, "n_predict": 24,
            "temperature": 0}
    plain = http.post("/completion", json=body).json()
    pen = http.post("/completion", json={**body, "presence_penalty": 1.5,
                                         "frequency_penalty": 0.5}).json()
    gs = pen["generation_settings"]
    assert gs["presence_penalty"] == 1.5 and gs["frequency_penalty"] == 0.5
    assert pen["content"] != plain["content"]
    alias = http.post("/completion", json={**body, "penalty_last_n": 7}).json()
    assert alias["generation_settings"]["repeat_last_n"] == 7


def test_other_samplers_are_applied_and_reported(http):
    """DRY, XTC, typical, top-n-sigma, mirostat, dynatemp and the order: request fields
    reported in generation_settings as llama-server names them; a seeded request with
    DRY differs from one without, and the same request twice gives the same text."""
    body = {"prompt": "Repeat after me: " + "the cat sat on the mat, " * 8, "n_predict": 24,
            "temperature": 0.8, "seed": 9}
    plain = http.post("/completion", json=body).json()
    fields = {"dry_multiplier": 1.2, "dry_base": 0.5, "dry_allowed_length": 1,
              "dry_penalty_last_n": -1, "dry_sequence_breakers": ["\n"], "xtc_probability": 0.2,
              "xtc_threshold": 0.2, "typical_p": 0.95, "top_n_sigma": 2.0, "mirostat": 0,
              "mirostat_tau": 4.0, "mirostat_eta": 0.2, "dynatemp_range": 0.1,
              "dynatemp_exponent": 1.5, "min_keep": 1, "samplers": "edkypmxt"}
    got = http.post("/completion", json={**body, **fields}).json()
    again = http.post("/completion", json={**body, **fields}).json()
    gs = got["generation_settings"]
    for k, v in fields.items():
        want = {"dry_base": 1.75, "samplers": ["penalties", "dry", "top_k", "typ_p", "top_p",
                                               "min_p", "xtc", "temperature"]}.get(k, v)
        if k == "dry_penalty_last_n":
            want = gs["dry_penalty_last_n"]  # -1: the slot's context
            assert want > 64
        assert gs[k] == want, k
    assert got["content"] != plain["content"] and got["content"] == again["content"]
