"""`ngramspec batch`: input records, the resumable OUTPUT, the Python API and the
command on the embedded model (resume after SIGKILL, bad records)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from ngramspec.batch.output import OutputFile
from ngramspec.batch.records import BadRecord, Record, parse_records, read_lines
from ngramspec.batch.results import BatchResult, in_order
from ngramspec.errors import ConfigError

FOX = "Repeat this text exactly:\n" + "The quick brown fox jumps over the lazy dog.\n" * 6
CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"
PROMPTS = [FOX, CODE, "List the days of the week: Monday, Tuesday,",
           "Once upon a time, in a small village by the sea,"]
N = 16  # tokens per record (keep the suite fast)
FLAGS = ["-np", "2", "-c", "2048", "-n", str(N), "-t", os.environ.get("NGRAMSPEC_TEST_THREADS", "2"),
         "--spec-type", "ngram-mod,ngram-simple", "--draft-policy", "fixed"]


def parse(lines):
    return list(parse_records(read_lines(lines)))


# ------------------------------------------------------------------ records, no model


def test_every_line_is_one_item_with_a_key():
    items = parse(['{"id": "a", "prompt": "x"}\n', "\n", "{not json\n", '{"prompt": "x"}\n',
                   '{"id": "a", "prompt": "again"}\n', '{"id": 7, "prompt": "x", "n_predcit": 3}\n',
                   '{"id": 8, "prompt": "x", "messages": [{"role": "user", "content": "y"}]}\n',
                   '{"id": 9, "messages": [{"role": "user", "content": "y"}], "seed": 3}\n',
                   '{"id": true, "prompt": "x"}\n', '[1, 2]\n'])
    kinds = [(type(i).__name__, getattr(i, "type", None), i.key) for i in items]
    assert kinds == [
        ("Record", None, 'id:"a"'),
        ("BadRecord", "malformed_json", "line:3"),
        ("BadRecord", "missing_id", "line:4"),
        ("BadRecord", "duplicate_id", "line:5"),  # the first line owns the id
        ("BadRecord", "invalid_request_error", "id:7"),
        ("BadRecord", "invalid_request_error", "id:8"),
        ("Record", None, "id:9"),
        ("BadRecord", "missing_id", "line:9"),
        ("BadRecord", "malformed_json", "line:10"),
    ]
    assert [i.index for i in items] == list(range(9))
    assert "n_predcit" in items[4].message and "exactly one of" in items[5].message
    assert "already used by line 1" in items[3].message


def test_overrides_are_validated():
    bad = ['{"id": 1, "prompt": "x", "temperature": -1}', '{"id": 2, "prompt": "x", "n_predict": "9"}',
           '{"id": 3, "prompt": "x", "speculative": {"n_maxx": 2}}',
           '{"id": 4, "prompt": "x", "grammar": "root ::= \\"a\\"", "json_schema": {}}',
           '{"id": 5, "prompt": "x", "stop": 3}', '{"id": 6, "prompt": "x", "seed": -2}']
    items = parse(bad)
    assert all(isinstance(i, BadRecord) and i.type == "invalid_request_error" for i in items)
    good = parse(['{"id": 1, "prompt": "x", "temperature": 0.5, "seed": 3, "stop": ["\\n"], '
                  '"n_predict": 8, "speculative": {"type": "none"}, "json_schema": {}}'])
    assert isinstance(good[0], Record) and good[0].body.stop_list() == ["\n"]


# ------------------------------------------------------------------ OUTPUT, no model


def _result(i, rid, error=None):
    return BatchResult(rid, i + 1, i, text=f"t{i}", finish_reason=None if error else "stop",
                       error=error)


def test_output_recovers_a_truncated_last_line(tmp_path):
    path = tmp_path / "out.jsonl"
    out = OutputFile(str(path))
    out.append(_result(0, "a"))
    out.append(_result(1, None, {"type": "malformed_json", "message": "m"}))
    out.close()
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"id": "c", "line": 3, "te')  # killed mid-write
    out = OutputFile(str(path))
    assert out.recover() == {'id:"a"': False, "line:2": True}
    assert path.read_bytes() == whole and out.repaired_bytes == 26
    path.write_bytes(whole + b'{"id": "c", "line": 3}\n')
    assert OutputFile(str(path)).recover() == {'id:"a"': False, "line:2": True, 'id:"c"': False}


def test_output_that_is_not_ours_is_left_alone(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text('{"id": "a", "line": 1}\nhello\n{"id": "b", "line": 2}\n')
    with pytest.raises(ConfigError, match="line 2 is not a batch result"):
        OutputFile(str(path)).recover()
    assert path.read_text().count("\n") == 3


def test_in_order_passes_over_skipped_indices():
    results = [_result(i, i) for i in (3, 0, 5, 2)]
    assert [r.index for r in in_order(results, skipped={1, 4})] == [0, 2, 3, 5]


# ------------------------------------------------------------------ the Python API, model


@pytest.mark.model
def test_api_gives_plain_decoding_output_whatever_the_slot(make_engine):
    """Greedy records through 2 slots with speculation = each prompt decoded alone, spec off."""
    from ngramspec import SpecConfig
    from ngramspec.batch import batch
    from ngramspec.engine.generate import generate
    from ngramspec.settings.sampling import SamplingParams

    engine = make_engine(SpecConfig(types=("ngram-mod", "ngram-simple")), n_seq=2, n_ctx=2048)
    recs = [{"id": i, "prompt": p} for i, p in enumerate(PROMPTS * 2)]
    recs.append({"id": "too-long", "prompt": "word " * 1500})
    got = {r.id: r for r in batch(engine, recs, parallel=2, n_predict=N)}
    assert set(got) == {r["id"] for r in recs}
    assert got["too-long"].error["type"] == "exceed_context_size_error"
    assert sum(r.timings.get("draft_n_accepted", 0) for r in got.values()) > 0
    for i, p in enumerate(PROMPTS):
        plain = generate(engine, p, SamplingParams(temperature=0.0), N, speculative=False).text
        assert got[i].text == got[i + len(PROMPTS)].text == plain, i


# ------------------------------------------------------------------ the command, model


def write_input(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


def cli(*args):
    return [sys.executable, "-c", "from ngramspec.cli.main import run; run()", "batch", *args]


def read_output(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.model
def test_api_loads_with_the_commands_default_speculation(monkeypatch):
    """`batch(path, ...)` without `spec` loads the model with what `ngramspec batch` uses."""
    from ngramspec.settings import flags
    from ngramspec.settings.typed import typed
    from ngramspec.batch import api

    seen = {}

    def load(settings, defaults=None, notify=None):
        seen["settings"] = settings
        raise RuntimeError("stop before loading")

    monkeypatch.setattr(api.EngineRunner, "load", staticmethod(load))
    with pytest.raises(RuntimeError):
        next(api.batch(None, [], parallel=2))
    command = typed(flags.defaults("batch"), n_seq=2).engine
    assert seen["settings"].spec == command.spec and seen["settings"].n_seq == 2


def test_bad_records_get_error_lines_and_the_job_goes_on(tmp_path):
    from ngramspec.cli.main import main

    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_input(inp, [{"id": "ok-1", "prompt": PROMPTS[0]}, "{this is not json",
                      {"id": "ok-1", "prompt": "a duplicate"}, {"prompt": "no id"},
                      {"id": "long", "prompt": "word " * 1500},
                      {"id": "bad-param", "prompt": "x", "temperature": "hot"},
                      {"id": "bad-grammar", "prompt": "x", "grammar": "root ::= ("},
                      {"id": "ok-2", "prompt": PROMPTS[2], "n_predict": 4}])
    r = CliRunner().invoke(main, ["batch", str(inp), "-o", str(out), *FLAGS], obj={})
    assert r.exit_code == 1, r.output
    lines = read_output(out)
    errors = {(x["id"], x["line"]): x["error"]["type"] for x in lines if "error" in x}
    assert errors == {(None, 2): "malformed_json", (None, 3): "duplicate_id",
                      (None, 4): "missing_id", ("long", 5): "exceed_context_size_error",
                      ("bad-param", 6): "invalid_request_error",
                      ("bad-grammar", 7): "invalid_request_error"}
    ok = {x["id"]: x for x in lines if "error" not in x}
    assert set(ok) == {"ok-1", "ok-2"} and ok["ok-2"]["timings"]["predicted_n"] == 4
    assert ok["ok-1"]["timings"]["draft_n_accepted"] > 0
    assert "done / failed this run" in r.output and "Traceback" not in r.output
    again = CliRunner().invoke(main, ["batch", str(inp), "-o", str(out), *FLAGS], obj={})
    assert again.exit_code == 1  # the failures are still in OUTPUT
    assert read_output(out) == lines  # nothing ran twice


@pytest.mark.model
def test_resume_after_sigkill(tmp_path):
    """Kill the job with SIGKILL mid-way (and tear its last line), re-run: every id once,
    outputs equal to an uninterrupted run's, which --ordered writes in input order."""
    inp = tmp_path / "in.jsonl"
    ids = [f"doc-{i}" for i in range(10)]
    write_input(inp, [{"id": d, "prompt": PROMPTS[i % 4]} for i, d in enumerate(ids)])
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    ref = tmp_path / "ref.jsonl"
    subprocess.run(cli(str(inp), "-o", str(ref), "--ordered", *FLAGS), env=env, check=True,
                   timeout=600, capture_output=True)
    expected = read_output(ref)
    assert [x["id"] for x in expected] == ids

    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen(cli(str(inp), "-o", str(out), *FLAGS), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and out.read_text().count("\n") >= 3:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    first = read_output(out)
    assert 3 <= len(first) < len(ids)
    with open(out, "ab") as f:  # a write torn by the kill
        f.write(b'{"id": "doc-9", "line": 10, "text": "The qu')

    done = subprocess.run(cli(str(inp), "-o", str(out), *FLAGS), env=env, timeout=600,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "cut a truncated last line" in done.stderr
    final = read_output(out)
    assert final[:len(first)] == first
    assert sorted(x["id"] for x in final) == sorted(ids)
    strip = lambda xs: {x["id"]: (x["text"], x["finish_reason"]) for x in xs}  # noqa: E731
    assert strip(final) == strip(expected)


@pytest.mark.parametrize("setup,args,message", [
    (None, ["--actors", "2"], "--actors and --chunk-size need --ray"),
    (None, ["-np", "0"], "-np/--parallel must be >= 1"),
    (None, ["--ray", "--chunk-size", "0"], "--chunk-size must be >= 1"),
    ("hello\n{}\n", [], "line 1 is not a batch result"),
])
def test_command_refuses_bad_use_before_loading_the_model(tmp_path, setup, args, message):
    from ngramspec.cli.main import main

    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_input(inp, [{"id": 1, "prompt": "x"}])
    if setup is not None:
        out.write_text(setup)
    r = CliRunner().invoke(main, ["batch", str(inp), "-o", str(out), *args], obj={})
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output
    if setup is None:
        assert not out.exists()
    else:
        assert out.read_text() == setup  # untouched


# ------------------------------------------------------------------ the speedup estimate, no model


class _Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


class _FakeEngine:
    """Decodes cost BASE + PER_TOKEN * tokens; each step drafts `script(step)` per sequence."""

    BASE, PER_TOKEN = 0.010, 0.002

    def __init__(self, clock, script):
        from types import SimpleNamespace

        self.ctx = SimpleNamespace(cost_layout={"per_seq_streams": True, "n_ubatch": 512,
                                                "pad": False})
        self.clock, self.script, self.n = clock, script, 0

    def step(self, seqs, fold=True):
        from ngramspec.engine.engine import StepOutput

        k, acc = self.script(self.n)
        self.n += 1
        self.clock.t += self.BASE + self.PER_TOKEN * len(seqs) * (1 + k)
        return [StepOutput([1] * (acc + 1), drafted=k, accepted=acc) for _ in seqs]


def _timed(script, n_seqs, steps):
    from types import SimpleNamespace

    from ngramspec.batch.speed import StepTimer

    clock = _Clock()
    timer = StepTimer(_FakeEngine(clock, script), clock=clock)
    seqs = [SimpleNamespace(seq_id=i, n_hist=0, done=False, prefilling=False)
            for i in range(n_seqs)]
    for _ in range(steps):
        timer.step(seqs)
    return timer.summary()


def test_plain_decodes_are_priced_by_the_runs_undrafted_steps():
    """Every other step drafts 4 and keeps 3 (+1): it stands for 4 plain decodes."""
    s = _timed(lambda i: (4, 3) if i % 2 else (0, 0), n_seqs=2, steps=20)
    plain_decode = _FakeEngine.BASE + _FakeEngine.PER_TOKEN * 2
    assert s.undrafted == 10 and s.plain_measured == 1.0
    assert s.plain_seconds == pytest.approx((10 + 10 * 4) * plain_decode)
    assert s.seconds == pytest.approx(10 * plain_decode + 10 * (_FakeEngine.BASE + 0.002 * 10))
    assert s.speedup == pytest.approx(s.plain_seconds / s.seconds)
    off = _timed(lambda i: (0, 0), n_seqs=3, steps=12)
    assert off.speedup == pytest.approx(1.0)


def test_an_occupancy_never_undrafted_is_priced_by_the_fitted_cost():
    s = _timed(lambda i: (1 + i % 6, i % 6), n_seqs=1, steps=30)
    assert s.undrafted == 0 and s.plain_measured == 0.0
    produced = sum(i % 6 + 1 for i in range(30))
    assert s.plain_seconds == pytest.approx(produced * (_FakeEngine.BASE + _FakeEngine.PER_TOKEN),
                                            rel=0.05)


@pytest.mark.model
def test_records_take_the_other_samplers(tmp_path):
    """A record's DRY and XTC settings are applied (seeded text differs from the
    same record without them, and equals the same record run again); a bad value is an
    error record."""
    from ngramspec.cli.main import main

    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    base = {"prompt": PROMPTS[0], "n_predict": 24, "temperature": 0.9, "seed": 4}
    write_input(inp, [{"id": "plain", **base},
                      {"id": "dry", **base, "dry_multiplier": 1.5, "dry_allowed_length": 1},
                      {"id": "dry-again", **base, "dry_multiplier": 1.5, "dry_allowed_length": 1},
                      {"id": "xtc", **base, "xtc_probability": 1.0, "xtc_threshold": 0.02},
                      {"id": "bad-xtc", **base, "xtc_probability": 3}])
    r = CliRunner().invoke(main, ["batch", str(inp), "-o", str(out), *FLAGS], obj={})
    assert r.exit_code == 1, r.output
    got = {x["id"]: x for x in read_output(out)}
    assert got["bad-xtc"]["error"]["type"] == "invalid_request_error"
    text = {k: v["text"] for k, v in got.items() if "error" not in v}
    assert text["dry"] == text["dry-again"] != text["plain"] and text["xtc"] != text["plain"]
