"""Hostile clients: bad input never takes the server down (issue: bad input).

A live `ngramspec serve` (2 slots, slots/metrics on, a slot save directory) gets well
over 100 malformed and abusive requests across every endpoint: non-finite numbers,
deep nesting, grammars with no continuation or a huge cost, unsatisfiable JSON
schemas, out-of-range integers, wrong types, bad encodings, path traversal, broken
HTTP framing and half-closed sockets. Each must get a 4xx with llama-server's error
shape `{"error": {"code", "message", "type"}}` (never a 5xx, never a dropped
connection); afterwards the server is healthy, its greedy answer is unchanged and no
slot is left busy. The same classes go through `generate` (one line, exit 2 as for any bad setting) and
`batch` (an error record; the job goes on).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.model

DEAD = "root ::= [z-a]"  # an empty character range: no token is admitted
DEAD_LATER = 'root ::= "a" [z-a]'  # admits "a", then nothing
COSTLY = "root ::= " + " | ".join(f'"w{i}x"' for i in range(10000))
DEEP = "[" * 10000 + "]" * 10000
NEST = lambda n: "[" * n + '"x"' + "]" * n  # noqa: E731
IMPOSSIBLE = [{"type": "string", "minLength": 5, "maxLength": 3},
              {"type": "array", "items": {"type": "integer"}, "minItems": 1e9},
              {"type": "integer", "minimum": 5, "maximum": 3},
              {"type": "object", "properties": {"a": {"enum": []}}},
              {"type": "object", "minProperties": 4, "maxProperties": 1}]


def native(**kw) -> dict:
    return {"prompt": "hi", "n_predict": 2, **kw}


def oai(**kw) -> dict:
    return {"prompt": "hi", "max_tokens": 2, **kw}


def chat(**kw) -> dict:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **kw}


GEN = (("/completion", native), ("/v1/completions", oai), ("/v1/chat/completions", chat))


def raw_json(body: dict, field: str, literal: str) -> bytes:
    """`body` as JSON with `field` set to a literal Python's json would not write."""
    text = json.dumps({**body, field: "@@"})
    return text.replace('"@@"', literal).encode()


def cases() -> list[tuple[str, str, str, bytes, dict]]:
    """(name, method, path, body bytes, headers): every one must be a 4xx."""
    out = []

    def add(name, path, body, method="POST", headers=None):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        out.append((name, method, path, data, headers or {"Content-Type": "application/json"}))

    for path, make in GEN:
        ep = path.strip("/").replace("/", "_")
        # non-finite numbers, whichever field holds them
        for field in ("temperature", "top_p", "repeat_penalty", "min_p", "seed"):
            for lit in ("NaN", "Infinity", "-Infinity", "1e400"):
                add(f"{ep}-{field}-{lit}", path, raw_json(make(), field, lit))
        # deep nesting: the body, the prompt/content, a schema
        add(f"{ep}-deep-body", path, DEEP.encode())
        add(f"{ep}-deep-object", path, ('{"a":' * 5000 + "1" + "}" * 5000).encode())
        add(f"{ep}-deep-json_schema", path, make(json_schema=json.loads(
            '{"type":"array","items":' * 150 + '{"type":"integer"}' + "}" * 150)))
        # grammars and schemas that admit nothing, or cost too much
        add(f"{ep}-dead-grammar", path, make(grammar=DEAD))
        add(f"{ep}-dead-grammar-stream", path, make(grammar=DEAD, stream=True))
        add(f"{ep}-dead-later", path, make(grammar=DEAD_LATER, n_predict=4, max_tokens=4))
        add(f"{ep}-costly-grammar", path, make(grammar=COSTLY))
        add(f"{ep}-dead-later-2-choices", path, make(grammar=DEAD_LATER, n_predict=4, max_tokens=4,
                                                     n_cmpl=2, n=2))
        add(f"{ep}-dead-later-spec-off", path, make(grammar=DEAD_LATER, n_predict=4, max_tokens=4,
                                                    speculative={"type": "none"}))
        add(f"{ep}-bad-gbnf", path, make(grammar="root ::= ("))
        for i, schema in enumerate(IMPOSSIBLE):
            add(f"{ep}-impossible-schema-{i}", path, make(json_schema=schema))
        # integers out of llama-server's int32 range; wrong types
        add(f"{ep}-seed-over-uint32", path, make(seed=1 << 33))
        add(f"{ep}-top_k-over-int32", path, make(top_k=1 << 31))
        add(f"{ep}-temperature-string", path, make(temperature="hot"))
        add(f"{ep}-stream-string", path, make(stream="yes"))
        add(f"{ep}-stop-number", path, make(stop=5))
        add(f"{ep}-n-zero", path, make(n=0))
        add(f"{ep}-presence-penalty-3", path, make(presence_penalty=3))
        add(f"{ep}-frequency-penalty-string", path, make(frequency_penalty="high"))
        add(f"{ep}-xtc-probability-2", path, make(xtc_probability=2))
        add(f"{ep}-mirostat-3", path, make(mirostat=3))
        add(f"{ep}-dry-breakers-empty", path, make(dry_sequence_breakers=[]))
        add(f"{ep}-samplers-unknown", path, make(samplers=["top_k", "top_q"]))
        add(f"{ep}-draft-type-without-md", path, make(speculative={"type": "draft-simple"}))
        add(f"{ep}-spec-type-unknown", path, make(speculative={"type": "ngram-bogus"}))
        add(f"{ep}-not-an-object", path, b"[1, 2]")
        add(f"{ep}-not-json", path, b"{prompt: hi}")
        add(f"{ep}-truncated-json", path, b'{"prompt": "hi", ')
        add(f"{ep}-invalid-utf8", path, b'{"prompt": "\xff\xfe hi"}')
        add(f"{ep}-lone-surrogate", path, b'{"prompt": "\\ud800"}')
        add(f"{ep}-empty-body", path, b"")
        add(f"{ep}-logit-bias-nan", path, raw_json(make(), "logit_bias", '[[1, NaN]]'))
    add("completion-n_predict-over-int32", "/completion", native(n_predict=1 << 31))
    add("completion-n_predict-2^40", "/completion", native(n_predict=1 << 40))
    add("completion-n_keep-over-int32", "/completion", native(n_keep=1 << 40))
    add("completion-id_slot-over-int32", "/completion", native(id_slot=1 << 40))
    add("completion-token-out-of-vocab", "/completion", native(prompt=[1 << 30]))
    add("completion-deep-prompt", "/completion", NEST(500).join(['{"prompt":', "}"]).encode())
    add("completions-max_tokens-over-int32", "/v1/completions", oai(max_tokens=1 << 32))
    add("chat-deep-content", "/v1/chat/completions", (
        '{"messages":[{"role":"user","content":' + NEST(3000) + "}]}").encode())
    add("chat-content-number", "/v1/chat/completions",
        {"messages": [{"role": "user", "content": 5}]})
    add("chat-no-messages", "/v1/chat/completions", {"messages": []})
    add("chat-bad-role", "/v1/chat/completions", {"messages": [{"role": "god", "content": "x"}]})
    add("chat-response-format-impossible", "/v1/chat/completions", chat(response_format={
        "type": "json_schema", "json_schema": {"schema": IMPOSSIBLE[0]}}))
    add("chat-top_logprobs-negative", "/v1/chat/completions", chat(logprobs=True, top_logprobs=-1))
    for name, body in (("deep", DEEP.encode()), ("nan", b'{"content": NaN}'),
                       ("deep-content", ('{"content":' + NEST(2000) + "}").encode()),
                       ("content-object", {"content": {"a": 1}})):
        add(f"tokenize-{name}", "/tokenize", body)
    add("detokenize-out-of-vocab", "/detokenize", {"tokens": [-1]})
    add("detokenize-huge-id", "/detokenize", {"tokens": [1 << 40]})
    add("detokenize-deep", "/detokenize", DEEP.encode())
    add("apply-template-deep", "/apply-template", DEEP.encode())
    add("apply-template-nan", "/apply-template", b'{"messages": NaN}')
    for name in ("../../etc/passwd", "/etc/passwd", "a\x00b", "\uff0e\uff0e/x", ".."):
        add(f"slot-save-{name!r}", "/slots/0?action=save", {"filename": name})
        add(f"slot-restore-{name!r}", "/slots/0?action=restore", {"filename": name})
    add("slot-save-deep", "/slots/0?action=save", DEEP.encode())
    add("slot-save-nan", "/slots/0?action=save", b'{"filename": NaN}')
    add("slot-bad-action", "/slots/0?action=explode", {"filename": "x.bin"})
    add("slot-negative", "/slots/-1?action=erase", b"")
    add("slot-not-a-number", "/slots/abc?action=erase", b"")
    add("unknown-path", "/no/such/endpoint", b"{}")
    add("wrong-method-get", "/completion", b"", method="GET")
    add("wrong-method-delete", "/v1/chat/completions", b"", method="DELETE")
    return out


CASES = cases()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from ngramspec.server.launch import start_server

    slots = tmp_path_factory.mktemp("slots")
    threads = os.environ.get("NGRAMSPEC_TEST_THREADS", "2")
    sp = start_server(["-np", "2", "--temp", "0", "-c", "2048", "-t", threads, "--metrics",
                       "--slots", "--slot-save-path", str(slots), "--spec-type", "ngram-mod"],
                      timeout=180)
    yield sp
    sp.stop()


GREEDY = {"prompt": "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n", "n_predict": 24,
          "temperature": 0}


@pytest.fixture(scope="module")
def reference(http):
    r = http.post("/completion", json=GREEDY)
    assert r.status_code == 200
    return r.json()["content"]


def assert_error_shape(r: httpx.Response) -> dict:
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    err = r.json()["error"]
    assert err["code"] == r.status_code and err["message"] and err["type"], err
    return err


def test_corpus_size():
    assert len(CASES) >= 100


@pytest.mark.parametrize("name,method,path,body,headers", CASES, ids=[c[0] for c in CASES])
def test_hostile_request_is_a_4xx(http, reference, name, method, path, body, headers):
    r = http.request(method, path, content=body, headers=headers)
    assert_error_shape(r)


def raw_exchange(server, data: bytes, half_close: bool = False, timeout: float = 30.0) -> bytes:
    """Send raw bytes on a fresh connection; everything the server answers until it closes."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as s:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            try:
                b = s.recv(65536)
            except socket.timeout:
                break
            if not b:
                break
            chunks.append(b)
    return b"".join(chunks)


def split_response(raw: bytes) -> tuple[int, dict]:
    """(status, JSON body) of the final response, interim 1xx responses skipped."""
    while True:
        head, _, raw = raw.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status >= 200:
            return status, json.loads(raw)


@pytest.mark.parametrize("name,data", [
    ("bad-chunk-size", b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                       b"\r\nTransfer-Encoding: chunked\r\n\r\nZZZ\r\n{}\r\n0\r\n\r\n"),
    ("missing-host", b"GET /health HTTP/1.1\r\n\r\n"),
    ("garbage-request-line", b"\x00\x01\x02 nonsense\r\n\r\n"),
    ("bad-header", b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header Name: 1\r\n\r\n"),
])
def test_framing_errors_have_the_error_shape(server, name, data):
    status, body = split_response(raw_exchange(server, data))
    assert status == 400 and body["error"]["code"] == 400 and body["error"]["type"]


def test_half_closed_client_gets_its_answer(server):
    """The answer arrives after the interim responses that probe the half-closed socket
    (the generation takes longer than the first probe's 0.25 s)."""
    body = json.dumps({"prompt": "Hello", "n_predict": 48,
                       "speculative": {"type": "none"}}).encode()
    req = (b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    raw = raw_exchange(server, req, half_close=True)
    status, out = split_response(raw)
    assert raw.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert status == 200 and out["tokens_predicted"] == 48


def test_errors_keep_the_connection_alive(server):
    """Several errors and a success on ONE keep-alive connection."""
    with httpx.Client(base_url=server.url, timeout=60) as c:
        for body in (b'{"temperature": NaN}', DEEP.encode(), json.dumps(native(grammar=DEAD))):
            assert_error_shape(c.post("/completion", content=body))
        assert c.post("/completion", json=native()).status_code == 200


def test_head_health(http):
    assert http.head("/health").status_code == 200


def test_dead_end_mid_stream_is_an_error_event(http):
    """The grammar admits "a" and then nothing: the streamed answer ends with an error
    event (the status line was sent with the first token), and the slot is freed."""
    with http.stream("POST", "/completion", json=native(grammar=DEAD_LATER, n_predict=4,
                                                         stream=True)) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert r.status_code == 200
    assert events[-1]["error"]["code"] == 400 and "grammar" in events[-1]["error"]["message"]


def test_neighbours_keep_generating(server, http, reference):
    """Hostile requests beside a long greedy one: the neighbour's answer is whole and
    unchanged (a grammar dead end fails its own sequence only; a costly grammar is
    refused after one probe of its cost)."""
    got = {}

    def neighbour():
        with httpx.Client(base_url=server.url, timeout=120) as c:
            got["r"] = c.post("/completion", json=GREEDY)

    t = threading.Thread(target=neighbour)
    t.start()
    for grammar in (DEAD_LATER, COSTLY, DEAD_LATER, COSTLY):
        assert_error_shape(http.post("/completion", json=native(grammar=grammar,
                                                                n_predict=8)))
    t.join()
    assert got["r"].status_code == 200 and got["r"].json()["content"] == reference


def test_server_intact_after_the_corpus(server, http, reference):
    """Runs last in this module: alive, the same greedy text, every slot idle, and
    /metrics without a negative value."""
    assert server.proc.poll() is None
    assert http.get("/health").status_code == 200
    assert http.post("/completion", json=GREEDY).json()["content"] == reference
    deadline = time.monotonic() + 5
    while any(s["is_processing"] for s in http.get("/slots").json()):
        assert time.monotonic() < deadline, "a slot is still busy"
        time.sleep(0.05)
    for line in http.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            assert float(line.rsplit(" ", 1)[1]) >= 0, line


# ------------------------------------------------------------------ generate and batch

GENERATE_CASES = [
    ("dead-grammar", ["--grammar", DEAD]),
    ("dead-later", ["--grammar", DEAD_LATER]),
    ("nan-temperature", ["--temp", "nan"]),
    ("inf-repeat-penalty", ["--repeat-penalty", "inf"]),
    ("deep-schema", ["-j", '{"type":"array","items":' * 150 + "{}" + "}" * 150]),
    ("nan-schema", ["-j", '{"type": "string", "maxLength": NaN}']),
    ("impossible-schema", ["-j", json.dumps(IMPOSSIBLE[0])]),
    ("costly-grammar", ["--grammar", COSTLY]),
]


@pytest.mark.parametrize("name,args", GENERATE_CASES, ids=[c[0] for c in GENERATE_CASES])
def test_generate_bad_input_is_one_line(name, args):
    threads = os.environ.get("NGRAMSPEC_TEST_THREADS", "2")
    p = subprocess.run([sys.executable, "-m", "ngramspec", "generate", "-p", "hi", "-n", "4",
                        "--temp", "0", "-t", threads, "-c", "512", *args],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])  # a bad setting: usage error
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), p.stderr[-2000:]


def test_batch_bad_records_get_error_lines(tmp_path):
    """Every hostile record gets one error line, every good record its text, in one job."""
    good = [{"id": f"g{i}", "prompt": f"Count: {i}, {i + 1},", "n_predict": 4} for i in range(3)]
    bad_lines = [
        '{"id": "nan", "prompt": "hi", "temperature": NaN}',
        '{"id": "inf", "prompt": "hi", "n_predict": 1e400}',
        '{"id": "deep", "prompt": ' + NEST(3000) + "}",
        json.dumps({"id": "dead", "prompt": "hi", "grammar": DEAD}),
        json.dumps({"id": "dead-later", "prompt": "hi", "grammar": DEAD_LATER}),
        json.dumps({"id": "costly", "prompt": "hi", "grammar": COSTLY}),
        json.dumps({"id": "schema", "prompt": "hi", "json_schema": IMPOSSIBLE[1]}),
        json.dumps({"id": "int32", "prompt": "hi", "n_predict": 1 << 40}),
        json.dumps({"id": "draft", "prompt": "hi", "speculative": {"type": "draft-simple"}}),
    ]
    lines = [json.dumps(good[0]), *bad_lines[:5], json.dumps(good[1]), *bad_lines[5:],
             json.dumps(good[2])]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(lines) + "\n")
    threads = os.environ.get("NGRAMSPEC_TEST_THREADS", "2")
    p = subprocess.run([sys.executable, "-m", "ngramspec", "batch", str(src), "-o", str(dst),
                        "-np", "2", "-t", threads, "-c", "1024", "--temp", "0"],
                       capture_output=True, text=True, timeout=600)
    results = [json.loads(x) for x in dst.read_text().splitlines()]
    assert len(results) == len(lines), (p.returncode, p.stderr[-2000:])
    by_line = {r["line"]: r for r in results}
    for i, line in enumerate(lines, 1):
        rec = by_line[i]
        if line in bad_lines:
            assert rec.get("error"), rec
        else:
            assert not rec.get("error") and rec["text"], rec
