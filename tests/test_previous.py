"""Pipelines re-run with an earlier run's results as predictions (issue 45): the
prediction drafter on hand-written arrays, reading --previous files, the
counters in timings/usage/summary, and on the embedded model: a re-run after an
edit gives the cold run's text (greedy and seeded) while drafting from the
earlier text; the server reports OpenAI's prediction usage."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from ngramspec.batch.previous import load_previous, with_previous
from ngramspec.batch.progress import Tally, summary_table
from ngramspec.batch.records import Record, parse_records, read_lines
from ngramspec.batch.results import BatchResult
from ngramspec.speculative.drafters.prediction import PredictionDrafter
from ngramspec.errors import ConfigError
from ngramspec.speculative.stats import timings

PROMPT = np.arange(1000, 1010, dtype=np.int32)


def _draft(d, out, max_len=8):
    """The draft after the output `out` (its last token is the one just sampled)."""
    hist = np.concatenate([PROMPT, np.asarray(out[:-1], dtype=np.int32)])
    return list(d.draft(0, hist, int(out[-1]), max_len))


# ------------------------------------------------------------------ the drafter, no model


def test_follows_the_prediction_and_resyncs_after_a_removed_line():
    pred = list(range(1, 41))
    d = PredictionDrafter(pred)
    d.begin(0, PROMPT)
    assert _draft(d, [1], 4) == [2, 3, 4, 5]
    # the output skips 11..15 (a line removed from the input): after 4 tokens of the
    # new text the drafter is back on the prediction, at the next match
    assert _draft(d, list(range(1, 11)) + [16, 17, 18]) == []
    assert _draft(d, list(range(1, 11)) + [16, 17, 18, 19]) == list(range(20, 28))


def test_resyncs_after_inserted_text_at_the_next_match_not_an_earlier_one():
    pred = [7, 8, 9, 10, 50, 51, 52, 53, 7, 8, 9, 10, 60, 61, 62]
    d = PredictionDrafter(pred)
    d.begin(0, PROMPT)
    assert _draft(d, pred[:9], 3) == [8, 9, 10]
    # new text, then the key 7 8 9 10 again: the match after the alignment wins
    assert _draft(d, pred[:9] + [99, 98, 7, 8, 9, 10], 3) == [60, 61, 62]


def test_an_output_that_leaves_at_once_gets_no_chance_drafts():
    d = PredictionDrafter([5, 6, 7, 8, 9, 5, 6, 7])
    d.begin(0, PROMPT)
    assert _draft(d, [6]) == [] and _draft(d, [6, 7]) == [] and _draft(d, [6, 7, 8]) == []
    assert _draft(d, [1, 2, 3, 4]) == []  # 4 tokens found nowhere
    assert _draft(d, [1, 6, 7, 8, 9]) == [5, 6, 7]  # a 4-token key: aligned


# ------------------------------------------------------------------ files and counters


def _line(rid, text, error=None):
    r = BatchResult(rid, 1, 0, text, None if error else "length", {}, 1.0,
                    {"type": "x", "message": "y"} if error else None)
    return json.dumps(r.to_json()) + "\n"


def test_previous_files_later_wins_errors_and_empty_texts_do_not_count(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(_line("x", "old x") + _line("y", "old y") + _line(3, "three"))
    b.write_text(_line("x", "new x") + _line("y", "", error=True) + _line("z", "")
                 + '{"id": "w", "line": 9, "te')  # a killed run's torn last line
    assert load_previous([str(a), str(b)]) == {'id:"x"': "new x", 'id:"y"': "old y",
                                                "id:3": "three"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(_line("x", "t") + "not a result\n" + _line("y", "u"))
    with pytest.raises(ConfigError, match="bad.jsonl: line 2 is not a batch result"):
        load_previous([str(bad)])


def test_a_records_own_prediction_wins():
    items = list(parse_records(read_lines([
        '{"id": "a", "prompt": "p"}', '{"id": "b", "prompt": "p", "prediction": "mine"}',
        '{"id": "c", "prompt": "p", "prediction": {"type": "content", "content": "obj"}}',
        '{"id": "d", "prompt": "p", "prediction": 5}'])))
    texts = {'id:"a"': "earlier a", 'id:"b"': "earlier b", 'id:"c"': "earlier c"}
    got = list(with_previous(items, texts))
    assert [type(g).__name__ for g in got] == ["Record", "Record", "Record", "BadRecord"]
    assert got[0].body.prediction == "earlier a" and got[1].body.prediction == "mine"
    assert got[2].body.prediction.content == "obj"
    assert items[0].body.prediction is None  # the input record is not changed


def test_timings_usage_and_summary_count_the_prediction():
    from ngramspec.server.render import usage

    t = timings(10, 5.0, 20, 100.0, draft_n=12, draft_n_accepted=9, prediction=(10, 8))
    assert (t["prediction_n_accepted"], t["prediction_n_rejected"]) == (8, 2)
    assert "prediction_n_accepted" not in timings(10, 5.0, 20, 100.0, draft_n=3)

    class R:  # a GenerationResponse's fields that usage reads
        def __init__(self, prediction, unused=None):
            self.prompt_tokens, self.generation_tokens, self.cache_n = 10, 20, 0
            self.prediction, self.prediction_unused = prediction, unused

    u = usage([R((10, 8)), R((4, 1))], n=2)
    assert u["completion_tokens_details"] == {"accepted_prediction_tokens": 9,
                                              "rejected_prediction_tokens": 5}
    # OpenAI's meaning, from a final response: the prediction's tokens not in the output
    u = usage([R((0, 0), unused=30), R((10, 8), unused=2)], n=2)
    assert u["completion_tokens_details"] == {"accepted_prediction_tokens": 8,
                                              "rejected_prediction_tokens": 32}
    assert "completion_tokens_details" not in usage([R(None)])
    tally = Tally(total=2)
    tally.add(BatchResult("a", 1, 0, "x", "length", t, 2.0))
    tally.add(BatchResult("b", 2, 1, "x", "length", timings(10, 5.0, 20, 50.0), 1.0))
    assert (tally.prediction_accepted, tally.prediction_rejected, tally.with_prediction) == (8, 2, 1)
    assert tally.predicted_ms == 150.0 and tally.as_dict()["prediction_accepted"] == 8
    from rich.console import Console

    con = Console(width=200, record=True)
    con.print(summary_table(tally, None, "out.jsonl", "1 engine"))
    assert "prediction tokens accepted / rejected" in con.export_text()


def test_bad_previous_file_is_one_line_before_the_model_loads(tmp_path):
    from ngramspec.cli.main import main

    inp, out, prev = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "prev.jsonl"
    inp.write_text('{"id": 1, "prompt": "x"}\n')
    prev.write_text("garbage\n" + _line(1, "t"))
    r = CliRunner().invoke(main, ["batch", str(inp), "-o", str(out), "--previous", str(prev)],
                           obj={})
    assert r.exit_code != 0 and "line 1 is not a batch result" in r.output
    assert "Traceback" not in r.output and not out.exists()


# ------------------------------------------------------------------ the embedded model

DOC = ("class Account:\n    def __init__(self, owner, balance=0):\n        self.owner = owner\n"
       "        self.balance = balance\n        self.history = []\n\n"
       "    def deposit(self, amount):\n        if amount <= 0:\n            raise ValueError"
       "('amount must be positive')\n        self.balance += amount\n        self.history."
       "append(('deposit', amount))\n\n    def withdraw(self, amount):\n        if amount > "
       "self.balance:\n            raise ValueError('insufficient funds')\n        self.balance"
       " -= amount\n        self.history.append(('withdraw', amount))\n")
ASK = "Rewrite this Python class with type hints and docstrings:\n\n"


def _edited(doc: str) -> str:
    lines = doc.splitlines(keepends=True)
    del lines[len(lines) // 2]
    return "".join(lines)


@pytest.mark.model
@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
def test_rerun_with_previous_gives_the_cold_runs_text(make_engine, tmp_path, sampling):
    """Run once; edit (one line removed from the middle); run cold and with the first
    run's results as --previous: the same texts, and the prediction drafted."""
    from ngramspec import SpecConfig
    from ngramspec.batch import batch
    from ngramspec.settings.config import AUTO

    engine = make_engine(SpecConfig().with_types(AUTO), n_seq=2, n_ctx=2048)
    extra = {"temperature": 0.8, "seed": 11} if sampling == "seeded" else {}
    docs = {"acct": DOC, "fox": "The quick brown fox jumps over the lazy dog.\n" * 3
            + "A second line about the dog.\nAnd a third one, about the fox.\n"}
    first = [{"id": k, "prompt": ASK + d, **extra} for k, d in docs.items()]
    prev = tmp_path / "first.jsonl"
    prev.write_text("".join(json.dumps(r.to_json()) + "\n"
                            for r in batch(engine, first, parallel=2, n_predict=64)))
    edited = [{"id": k, "prompt": ASK + _edited(d), **extra} for k, d in docs.items()]
    cold = {r.id: r for r in batch(engine, edited, parallel=2, n_predict=64)}
    warm = {r.id: r for r in batch(engine, edited, parallel=2, n_predict=64,
                                   previous=[str(prev)])}
    for k in docs:
        assert warm[k].error is None and warm[k].text == cold[k].text, k
        assert "prediction_n_accepted" in warm[k].timings
        assert "prediction_n_accepted" not in cold[k].timings
    if sampling == "greedy":
        assert sum(w.timings["prediction_n_accepted"] for w in warm.values()) > 0


@pytest.mark.model
def test_server_reports_prediction_usage_and_keeps_the_text():
    from openai import OpenAI

    from ngramspec.server.launch import start_server

    threads = os.environ.get("NGRAMSPEC_TEST_THREADS", "2")
    sp = start_server(["-np", "1", "--temp", "0", "-c", "2048", "-t", threads], timeout=180)
    try:
        oai = OpenAI(base_url=sp.url + "/v1", api_key="none", timeout=120, max_retries=0)
        # an answer the prompt does not contain: only the prediction can draft it (a
        # rewrite of DOC is drafted from the prompt's copy before the prediction's
        # per-record credit allows it long drafts: own_budget.py)
        msgs = [{"role": "user", "content": "Write a short poem about a lighthouse at night."}]
        plain = oai.chat.completions.create(model="m", messages=msgs, max_tokens=48,
                                            temperature=0)
        text = plain.choices[0].message.content
        pred = oai.chat.completions.create(model="m", messages=msgs, max_tokens=48,
                                           temperature=0,
                                           prediction={"type": "content", "content": text})
        assert pred.choices[0].message.content == text
        det = pred.usage.completion_tokens_details
        assert det.accepted_prediction_tokens > 0 and det.rejected_prediction_tokens >= 0
        assert det.accepted_prediction_tokens <= pred.usage.completion_tokens
        wrong = oai.chat.completions.create(
            model="m", messages=msgs, max_tokens=48, temperature=0,
            prediction={"type": "content", "content": "Nothing like the answer at all. " * 8})
        assert wrong.choices[0].message.content == text  # a wrong prediction changes nothing
        assert wrong.usage.completion_tokens_details is not None
        import httpx

        r = httpx.post(sp.url + "/completion", json={
            "prompt": ASK + DOC, "n_predict": 8, "prediction": {"content": [1, 10 ** 9]}})
        assert r.status_code == 400 and "prediction token 1" in r.json()["error"]["message"]
    finally:
        sp.stop()


@pytest.mark.model
def test_the_command_drafts_from_previous_and_reports_it(tmp_path):
    """`ngramspec batch --previous`: the earlier texts are read before the model loads,
    drafted from (result lines and the summary count them), the texts unchanged."""
    from ngramspec.cli.main import main

    threads = os.environ.get("NGRAMSPEC_TEST_THREADS", "2")
    flags = ["-np", "2", "-c", "2048", "-n", "48", "-t", threads, "--spec-type", "none"]
    inp, first, second = tmp_path / "in.jsonl", tmp_path / "first.jsonl", tmp_path / "again.jsonl"
    inp.write_text(json.dumps({"id": "acct", "prompt": ASK + DOC}) + "\n"
                   + json.dumps({"id": "new", "prompt": "Name three colours:"}) + "\n")
    r = CliRunner().invoke(main, ["batch", str(inp), "-o", str(first), *flags], obj={})
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["batch", str(inp), "-o", str(second), "--previous", str(first),
                                  *flags], obj={})
    assert r.exit_code == 0, r.output
    assert "2 earlier texts from 1 --previous file(s)" in r.output
    assert "prediction tokens accepted / rejected" in r.output
    a = {x["id"]: x for x in map(json.loads, first.read_text().splitlines())}
    b = {x["id"]: x for x in map(json.loads, second.read_text().splitlines())}
    assert all(a[k]["text"] == b[k]["text"] for k in a)
    t = b["acct"]["timings"]  # spec types off: every drafted token is the prediction's
    assert t["prediction_n_accepted"] == t["draft_n_accepted"] > 0
    assert t["prediction_n_accepted"] + t["prediction_n_rejected"] == t["draft_n"]


def test_unused_prediction_tokens_are_those_not_in_the_completion():
    """OpenAI's rejected_prediction_tokens: a prediction never drafted from still counts
    the tokens the completion does not repeat."""
    import numpy as np

    from ngramspec.speculative.drafters.prediction import unused_tokens

    pred = np.arange(100, 120, dtype=np.int32)
    assert unused_tokens(pred, list(range(100, 120))) == 0
    assert unused_tokens(pred, [1, 2, 3]) == 20  # nothing of it in the output
    assert unused_tokens(pred, [*range(100, 110), 7, 8, *range(112, 120)]) == 2  # an edit

