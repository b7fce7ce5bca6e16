"""`ngramspec serve` end to end: the real server on the embedded model, on loopback,
driven by the official `openai` client and by raw HTTP (httpx)."""
from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytestmark = pytest.mark.model

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
FOX = "Repeat this text exactly:\n" + "The quick brown fox jumps over the lazy dog.\n" * 6
PROMPTS = [
    FOX,
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "List the days of the week: Monday, Tuesday,",
    "Once upon a time, in a small village by the sea,",
]
N = 24  # tokens per request (keep the suite small)


@pytest.fixture(scope="module")
def server():
    from ngramspec.server.launch import start_server

    threads = os.environ.get("NGRAMSPEC_TEST_THREADS", "2")
    sp = start_server(["-np", "4", "--temp", "0", "-c", "4096", "-t", threads, "--metrics",
                       "--api-key", KEY, "--spec-type", "ngram-mod"],
                      env={"NGRAMSPEC_SERVER_LOAD_DELAY": "1.5"}, timeout=180)
    yield sp
    sp.stop()
    assert sp.proc.returncode is not None


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def oai(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key=KEY, timeout=120, max_retries=0)


def complete(http, prompt, n=N, spec=True, **body):
    headers = {} if spec else {"X-Ngramspec-Speculative": "off"}
    r = http.post("/completion", json={"prompt": prompt, "n_predict": n, **body}, headers=headers)
    assert r.status_code == 200, r.text
    return r


def wait_idle(http, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        slots = http.get("/slots").json()
        if not any(s["is_processing"] for s in slots):
            return slots
        time.sleep(0.05)
    raise AssertionError(f"slots still busy: {slots}")


def metric(http, name):
    text = http.get("/metrics").text
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics:\n{text}")


# ------------------------------------------------------------------ health, models, props, slots


def test_health_503_while_loading_then_ok(server):
    loading = [(s, b) for s, b in server.health_seen if s == 503]
    assert loading, f"no 503 seen while loading: {server.health_seen}"
    assert loading[0][1] == {"error": {"code": 503, "message": "Loading model",
                                       "type": "unavailable_error"}}
    r = httpx.get(server.url + "/health")  # public: no API key needed
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_models_with_openai_client(oai):
    models = oai.models.list().data
    assert len(models) == 1 and models[0].id.endswith(".gguf")


def test_props_and_slots(http):
    p = http.get("/props").json()
    assert p["total_slots"] == 4
    d = p["default_generation_settings"]
    assert d["n_ctx"] == 1024 and d["params"]["temperature"] == 0.0
    assert d["params"]["speculative.types"] == "ngram-mod"
    slots = wait_idle(http)
    assert [s["id"] for s in slots] == [0, 1, 2, 3]
    assert all(s["n_ctx"] == 1024 and not s["is_processing"] for s in slots)
    # as llama-server: an idle slot shows the last task it ran, or no task fields at all
    assert all(("params" in s) == ("id_task" in s) == ("next_token" in s) for s in slots)


# ------------------------------------------------------------------ OpenAI client


def test_chat_completion(oai):
    raw = oai.chat.completions.with_raw_response.create(
        model="any", messages=[{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "Name three colors."}],
        max_tokens=N, temperature=0)
    assert raw.headers["x-ngramspec-speculative"] == "enabled"
    assert float(raw.headers["x-ngramspec-acceptance-rate"]) >= 0.0
    assert float(raw.headers["x-ngramspec-effective-speedup"]) >= 1.0
    r = raw.parse()
    assert r.object == "chat.completion"
    c = r.choices[0]
    assert c.message.role == "assistant" and c.message.content
    assert c.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= N and r.usage.prompt_tokens > 5
    t = r.model_extra["timings"]
    assert t["predicted_n"] == r.usage.completion_tokens and t["prompt_n"] == r.usage.prompt_tokens


def test_chat_streaming_equals_non_streaming_with_usage(oai):
    msgs = [{"role": "user", "content": "Count from one to ten in words."}]
    full = oai.chat.completions.create(model="m", messages=msgs, max_tokens=N, temperature=0)
    stream = oai.chat.completions.create(model="m", messages=msgs, max_tokens=N, temperature=0,
                                         stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [full.choices[0].finish_reason]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert "timings" in chunks[-1].model_extra


def test_completions_and_streaming(oai):
    r = oai.completions.create(model="m", prompt=PROMPTS[1], max_tokens=N, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text
    assert r.usage.completion_tokens == N and r.choices[0].finish_reason == "length"
    s = oai.completions.create(model="m", prompt=PROMPTS[1], max_tokens=N, temperature=0,
                               stream=True, stream_options={"include_usage": True})
    chunks = list(s)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    assert chunks[-1].usage.completion_tokens == N


def test_sse_ends_with_done(http):
    with http.stream("POST", "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][6:])
    assert last["choices"][0]["finish_reason"] in ("stop", "length") and "timings" in last


def test_json_mode_and_schema(oai):
    r = oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Give a JSON object with a name."}],
        max_tokens=32, temperature=0, response_format={"type": "json_object"})
    content = r.choices[0].message.content
    assert content.lstrip().startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}},
              "required": ["answer"], "additionalProperties": False}
    r = oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "What is 2+2? Answer in JSON."}],
        max_tokens=32, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
    content = r.choices[0].message.content
    assert content.lstrip().startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content)["answer"], int)


# ------------------------------------------------------------------ /completion (native)


def test_native_completion_fields(http):
    r = complete(http, FOX, return_tokens=True)
    b = r.json()
    assert b["stop"] is True and b["stop_type"] == "limit" and b["tokens_predicted"] == N
    assert len(b["tokens"]) == N and b["content"].startswith("The quick brown fox")
    t = b["timings"]
    for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second"):
        assert k in t
    assert t["predicted_n"] == N and t["draft_n"] > 0 and 0 < t["draft_n_accepted"] <= t["draft_n"]
    assert r.headers["x-ngramspec-speculative"] == "enabled"
    assert float(r.headers["x-ngramspec-effective-speedup"]) > 1.0


def test_native_stop_word_and_stream(http):
    b = complete(http, FOX, stop=["lazy"]).json()
    assert b["stop_type"] == "word" and b["stopping_word"] == "lazy"
    assert b["content"] == "The quick brown fox jumps over the "
    with http.stream("POST", "/completion", json={"prompt": FOX, "n_predict": N, "stream": True,
                                                  "stop": ["lazy"]}) as r:
        assert r.status_code == 200
        events = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: ")]
    assert "".join(e["content"] for e in events) == b["content"]
    assert events[-1]["stop"] is True and events[-1]["stop_type"] == "word"
    assert "timings" in events[-1] and all(not e["stop"] for e in events[:-1])


def test_native_token_prompt_and_grammar(http):
    toks = http.post("/completion", json={"prompt": FOX, "n_predict": 0,
                                          "cache_prompt": False}).json()
    assert toks["tokens_predicted"] == 0 and toks["timings"]["prompt_n"] > 10
    assert toks["timings"]["cache_n"] == 0
    r = http.post("/completion", json={"prompt": [2, 818, 3823], "n_predict": 4,
                                       "return_tokens": True})
    assert r.status_code == 200 and len(r.json()["tokens"]) <= 4
    g = 'root ::= ("yes" | "no") "."'
    b = complete(http, "Is the sky blue? Answer:", n=8, grammar=g).json()
    assert b["content"] in ("yes.", "no.")


# ------------------------------------------------------------------ speculation: exactness, control


def test_greedy_spec_on_equals_spec_off(http):
    for p in PROMPTS[:2]:
        on = complete(http, p, spec=True)
        off = complete(http, p, spec=False)
        assert on.headers["x-ngramspec-speculative"] == "enabled"
        assert off.headers["x-ngramspec-speculative"] == "disabled"
        assert "draft_n" not in off.json()["timings"]
        assert on.json()["content"] == off.json()["content"]


def test_per_request_speculative_body(http):
    off = complete(http, FOX, speculative={"type": "none"})
    assert off.headers["x-ngramspec-speculative"] == "disabled"
    base = off.json()["content"]
    for spec in ({"type": "ngram-simple", "n_max": 4, "ngram_size_n": 3},
                 {"type": "ngram-map-k4v", "ngram_size_n": 5000, "ngram_size_m": -3},  # clamped
                 {"n_max": 8, "n_min": 100},  # n_min clamped to n_max
                 {"type": "ngram-map-k", "ngram_min_hits": 0, "p_min": 0.5}):  # hits clamped
        r = complete(http, FOX, speculative=spec)
        assert r.json()["content"] == base, spec
    b = complete(http, FOX, **{"speculative.type": "ngram-simple", "speculative.n_max": 4}).json()
    assert b["content"] == base and b["generation_settings"]["speculative.types"] == "ngram-simple"
    assert b["generation_settings"]["speculative.n_max"] == 4


def test_four_concurrent_slots_equal_sequential_spec_off(http):
    seq = [complete(http, p, spec=False).json()["content"] for p in PROMPTS]
    barrier = threading.Barrier(len(PROMPTS))

    def run(p):
        barrier.wait()
        return complete(http, p, spec=True).json()

    with ThreadPoolExecutor(len(PROMPTS)) as ex:
        conc = list(ex.map(run, PROMPTS))
    assert [b["content"] for b in conc] == seq
    assert len({b["id_slot"] for b in conc}) > 1  # they really ran in different slots
    wait_idle(http)


def test_requests_beyond_slots_are_deferred_not_rejected(http):
    before = metric(http, "llamacpp:requests_deferred_total")
    with ThreadPoolExecutor(7) as ex:
        rs = list(ex.map(lambda p: http.post("/completion", json={"prompt": p, "n_predict": 6}),
                         PROMPTS + PROMPTS[:3]))
    assert [r.status_code for r in rs] == [200] * 7
    assert metric(http, "llamacpp:requests_deferred_total") >= before + 1
    wait_idle(http)


def test_disconnect_frees_slot(http, server):
    before = metric(http, "llamacpp:requests_cancelled_total")
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
        with c.stream("POST", "/completion", json={"prompt": PROMPTS[3], "n_predict": 600,
                                                   "stream": True}) as r:
            for ln in r.iter_lines():
                if ln.startswith("data: "):
                    break  # one chunk, then hang up
    t0 = time.monotonic()
    wait_idle(http, timeout=5)
    assert time.monotonic() - t0 < 5
    assert metric(http, "llamacpp:requests_cancelled_total") >= before + 1


def test_metrics(http):
    complete(http, FOX)
    text = http.get("/metrics").text
    for name in ("requests_total", "prompt_tokens_total", "prompt_seconds_total",
                 "tokens_predicted_total", "tokens_predicted_seconds_total", "slots_busy",
                 "requests_deferred", "spec_pool_bytes", "spec_pool_occupancy"):
        assert f"llamacpp:{name} " in text, name
    assert metric(http, "llamacpp:spec_decode_num_drafts_total") >= 1
    drafted = metric(http, "llamacpp:spec_decode_num_draft_tokens_total")
    accepted = metric(http, "llamacpp:spec_decode_num_accepted_tokens_total")
    assert 0 < accepted <= drafted
    assert 'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"}' in text
    assert metric(http, "llamacpp:spec_pool_bytes") == 16 << 20


def test_metrics_count_each_drafters_proposals(http):
    """/metrics labels each drafter's drafts, draft tokens and accepted tokens (what
    `bench --parallel` reports per source); `drafter_counts` reads them back."""
    from ngramspec.bench.pipeline import drafter_counts

    complete(http, FOX)
    text = http.get("/metrics").text
    assert "# TYPE llamacpp:spec_drafter_draft_tokens_total counter" in text
    counts = drafter_counts(str(http.base_url).rstrip("/"), AUTH)
    assert sum(tok for _, tok, _ in counts.values()) >= 1
    for name, (drafts, tok, acc) in counts.items():
        assert f'llamacpp:spec_drafter_draft_tokens_total{{drafter="{name}"}} {tok}' in text
        assert drafts <= tok and 0 <= acc <= tok, name
    # the spec_decode_* totals are these counts summed, not a second count
    for i, total in enumerate(("drafts_total", "draft_tokens_total", "accepted_tokens_total")):
        want = sum(c[i] for c in counts.values())
        assert f"llamacpp:spec_decode_num_{total} {want}" in text, total
    per_pos = [int(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith("llamacpp:spec_decode_num_accepted_tokens_per_pos_total{")]
    assert sum(per_pos) == sum(c[2] for c in counts.values())


# ------------------------------------------------------------------ errors


def err(r, status, type_):
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert e["code"] == status and e["type"] == type_ and e["message"]
    return e


@pytest.mark.parametrize("path,body,what", [
    ("/completion", b"{not json", "malformed JSON"),
    ("/completion", b"[1, 2]", "not an object"),
    ("/completion", {"prompt": 5}, "prompt type"),
    ("/completion", {"prompt": "x", "n_predict": "many"}, "n_predict type"),
    ("/completion", {"prompt": "x", "top_p": 2.0}, "top_p range"),
    ("/completion", {"prompt": "x", "top_k": -1}, "top_k range"),
    ("/completion", {"prompt": "x", "n_predict": -5}, "n_predict range"),
    ("/completion", {"prompt": ""}, "empty prompt"),
    ("/completion", {"prompt": []}, "empty token prompt"),
    ("/completion", {"prompt": [1, 99999999]}, "token outside the vocabulary"),
    ("/completion", {"prompt": "x", "speculative": {"type": "ngram-bogus"}}, "unknown spec type"),
    ("/completion", {"prompt": "x", "speculative": {"n_max": "8"}}, "spec field type"),
    ("/completion", {"prompt": "x", "speculative": {"bogus": 1}}, "unknown spec field"),
    ("/completion", {"prompt": "x", "grammar": "root ::= ("}, "bad grammar"),
    ("/completion", {"prompt": "x", "json_schema": {"type": "nonsense-type"}}, "bad schema"),
    ("/v1/chat/completions", {"messages": []}, "no messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "bad role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "json_schema"}}, "schema missing"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1.5}, "max_tokens type"),
])
def test_client_mistakes_are_400(http, path, body, what):
    if isinstance(body, bytes):
        r = http.post(path, content=body, headers={"Content-Type": "application/json"})
    else:
        r = http.post(path, json=body)
    err(r, 400, "invalid_request_error")


def test_prompt_over_context(http):
    r = http.post("/completion", json={"prompt": "word " * 1500, "n_predict": 4})
    e = err(r, 400, "exceed_context_size_error")
    assert e["n_ctx"] == 1024 and e["n_prompt_tokens"] > 1024


def test_bad_header_and_api_key(server, http):
    r = http.post("/completion", json={"prompt": "x"}, headers={"X-Ngramspec-Speculative": "maybe"})
    err(r, 400, "invalid_request_error")
    r = httpx.post(server.url + "/completion", json={"prompt": "x", "n_predict": 1},
                   headers={"Authorization": "Bearer wrong"})
    err(r, 401, "authentication_error")
    r = httpx.get(server.url + "/props")
    err(r, 401, "authentication_error")
    err(http.get("/nope"), 404, "not_found_error")


def test_openai_client_error_mapping(oai):
    import openai

    with pytest.raises(openai.BadRequestError) as ei:
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 20000}],
                                    max_tokens=4)
    assert ei.value.body["type"] == "exceed_context_size_error"


def test_server_still_healthy_after_errors(server, http):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    wait_idle(http)
    assert server.proc.poll() is None
