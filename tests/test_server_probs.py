"""Through the server, asking for probabilities changes nothing else: greedy output with
`n_probs` / `logprobs` is the same text, token for token, as the same request without
them and as a server with speculation off (`--spec-type none`); the probabilities are
the same numbers with speculation on and off (they come from the logit rows the engine
computes anyway)."""
from __future__ import annotations

import json
import os

import httpx
import pytest

pytestmark = pytest.mark.model

N = 32
PROMPT = "Repeat this text exactly:\n" + "The quick brown fox jumps over the lazy dog.\n" * 4
MSGS = [{"role": "user", "content": "Copy this text:\n" + "The quick brown fox jumps over "
         "the lazy dog.\n" * 3}]
ON = ["--spec-type", "ngram-simple", "--spec-ngram-size-n", "3", "--spec-ngram-size-m", "8"]
OFF = ["--spec-type", "none"]
STOP = [" lazy"]  # drafts run past it: tokens after it must show nothing


def native(c: httpx.Client, extra: dict) -> dict:
    return c.post("/completion", json={"prompt": PROMPT, "n_predict": N, "temperature": 0,
                                       "return_tokens": True, **extra}).json()


def native_stream(c: httpx.Client, extra: dict) -> list[dict]:
    body = {"prompt": PROMPT, "n_predict": N, "temperature": 0, "stream": True, **extra}
    with c.stream("POST", "/completion", json=body) as s:
        return [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: ")]


def chat(c: httpx.Client, extra: dict) -> dict:
    return c.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": N,
                                                "temperature": 0, **extra}).json()


def answers(args: list[str]) -> dict:
    """The same requests, with and without probabilities, on a server started with `args`."""
    from ngramspec.server.launch import start_server

    threads = os.environ.get("NGRAMSPEC_TEST_THREADS", "2")
    sp = start_server(["-np", "1", "-c", "2048", "-t", threads, *args], timeout=180)
    try:
        with httpx.Client(base_url=sp.url, timeout=120) as c:
            return {"plain": native(c, {}), "probs": native(c, {"n_probs": 5}),
                    "stream": native_stream(c, {"n_probs": 5}),
                    "stop_plain": native(c, {"stop": STOP}),
                    "stop_probs": native(c, {"stop": STOP, "n_probs": 2}),
                    "stop_stream": native_stream(c, {"stop": STOP, "n_probs": 2}),
                    "chat_plain": chat(c, {}),
                    "chat_probs": chat(c, {"logprobs": True, "top_logprobs": 5})}
    finally:
        sp.stop()


@pytest.fixture(scope="module")
def runs() -> dict:
    return {"on": answers(ON), "off": answers(OFF)}


def test_speculation_works_on_these_prompts(runs):
    assert runs["on"]["probs"]["timings"]["draft_n_accepted"] > 0
    assert runs["on"]["chat_probs"]["timings"]["draft_n_accepted"] > 0
    assert runs["off"]["probs"]["timings"].get("draft_n", 0) == 0


def test_greedy_tokens_are_the_same_with_n_probs_and_without_speculation(runs):
    ref = runs["off"]["plain"]
    assert len(ref["tokens"]) == N
    for side in ("on", "off"):
        for key in ("plain", "probs"):
            got = runs[side][key]
            assert got["tokens"] == ref["tokens"] and got["content"] == ref["content"], (side, key)
        streamed = [t for e in runs[side]["stream"] for t in e["tokens"]]
        assert streamed == ref["tokens"]
    texts = {runs[s][k]["choices"][0]["message"]["content"]
             for s in ("on", "off") for k in ("chat_plain", "chat_probs")}
    assert len(texts) == 1


def test_probabilities_are_the_same_numbers_with_and_without_speculation(runs):
    on, off = runs["on"]["probs"], runs["off"]["probs"]
    assert on["completion_probabilities"] == off["completion_probabilities"]
    assert [p["id"] for p in off["completion_probabilities"]] == off["tokens"]
    streamed = [p for e in runs["on"]["stream"] for p in e.get("completion_probabilities", [])]
    assert streamed == off["completion_probabilities"]
    assert runs["on"]["chat_probs"]["choices"][0]["logprobs"] == \
        runs["off"]["chat_probs"]["choices"][0]["logprobs"]


def test_a_stop_string_cuts_the_same_text_and_tokens_with_probabilities(runs):
    ref = runs["off"]["stop_plain"]
    assert ref["stop_type"] == "word" and ref["content"].endswith("over the")
    assert runs["on"]["stop_probs"]["timings"]["draft_n_accepted"] > 0
    for side in ("on", "off"):
        for key in ("stop_plain", "stop_probs"):
            assert runs[side][key]["content"] == ref["content"], (side, key)
        listed = runs[side]["stop_probs"]["completion_probabilities"]
        assert "".join(p["token"] for p in listed) == ref["content"]
        streamed = "".join(e["content"] for e in runs[side]["stop_stream"])
        assert streamed == ref["content"], side
    assert runs["on"]["stop_probs"]["completion_probabilities"] == \
        runs["off"]["stop_probs"]["completion_probabilities"]
    # tokens drafted past the stop are not output: same tokens and count as plain decoding
    for key in ("stop_plain", "stop_probs"):
        for field in ("tokens", "tokens_predicted"):
            assert runs["on"][key][field] == runs["off"][key][field], (key, field)
        assert runs["on"][key]["timings"]["predicted_n"] == ref["timings"]["predicted_n"], key
