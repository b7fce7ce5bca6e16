"""The command line: tables, exit codes and one-line errors (no tracebacks)."""
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ngramspec.cli.main import main

STREAMS = Path(__file__).resolve().parent.parent / "ngramspec" / "bench" / "fixtures" / "streams"


@pytest.fixture()
def stream(tmp_path):
    rng = np.random.default_rng(3)
    base = rng.integers(0, 5000, 600).tolist()
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"name": "synthetic", "prompt_tokens": base,
                                "generated_tokens": base[50:350]}))
    return path


def run(*args):
    return CliRunner().invoke(main, list(args), obj={})


def test_replay_prints_a_row_per_drafter(stream):
    r = run("replay", "--spec-type", "ngram-mod", "--cost-history", "1024", str(stream))
    assert r.exit_code == 0, r.output
    for name in ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "drafter cost"):
        assert name in r.output
    assert "★ ngram-mod" in r.output


def test_replay_json_has_the_measures(stream):
    r = run("replay", "--json", "--cost-history", "0", str(stream))
    data = json.loads(r.output)
    rows = {x["name"]: x for x in data[0]["results"]}
    assert set(rows) == {"ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod"}
    for x in rows.values():
        assert x["steps"] + x["accepted"] == 299
        assert x["tokens_per_step"] >= 1.0


@pytest.mark.parametrize("args,message", [
    (["--spec-type", "bogus"], "valid values: ngram-simple"),
    (["--spec-ngram-size-n", "0"], "must be between 1 and 1024"),
    (["--spec-ngram-size-m", "0"], "must be between 1 and 1024"),
    (["--draft-min", "9", "--draft-max", "2"], "must not exceed --draft-max"),
    (["--draft-max", "x"], "is not a valid integer"),
])
def test_bad_flags_exit_2_with_one_line(stream, args, message):
    r = run("replay", *args, str(stream))
    assert r.exit_code == 2
    assert message in r.output
    assert "Traceback" not in r.output


def test_missing_and_malformed_streams(tmp_path):
    r = run("replay", str(tmp_path / "nope.json"))
    assert r.exit_code == 1 and "stream file not found" in r.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"prompt_tokens": [1, "x"], "generated_tokens": [1]}))
    r = run("replay", str(bad))
    assert r.exit_code == 2 and "non-negative integers" in r.output


def test_llama_drafters_reach_5_tokens_per_step_on_refactor():
    r = run("replay", "--json", "--cost-history", "0", str(STREAMS / "refactor.json"))
    rows = json.loads(r.output)[0]["results"]
    assert all(x["tokens_per_step"] >= 5.0 for x in rows), rows


def test_generate_missing_model_exits_2(tmp_path):
    r = run("generate", "-m", str(tmp_path / "missing.gguf"), "-p", "hi")
    assert r.exit_code == 2 and "model file not found" in r.output
    assert "Traceback" not in r.output


def test_generate_corrupt_model_names_path_and_size(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model at all")
    r = run("generate", "-m", str(bad), "-p", "hi")
    assert r.exit_code == 1 and str(bad) in r.output and "18 bytes" in r.output
    truncated = tmp_path / "trunc.gguf"
    truncated.write_bytes(b"GGUF" + b"\0" * 60)
    r = run("generate", "-m", str(truncated), "-p", "hi")
    assert r.exit_code == 1 and str(truncated) in r.output and "64 bytes" in r.output


@pytest.mark.model
def test_generate_prints_text_and_llama_cpp_statistics():
    r = CliRunner().invoke(main, ["generate", "-p", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4,",
                                  "-n", "16", "--temp", "0", "-t", "2", "--spec-type",
                                  "ngram-simple,ngram-mod", "--spec-ngram-size-n", "3"], obj={})
    assert r.exit_code == 0, r.output
    assert "draft acceptance rate = " in r.output
    assert "statistics ngram_simple: #calls(b,g,a) = 1 " in r.output
    assert "tok/s" in r.output and "mean acceptance length" in r.output


@pytest.mark.model
def test_generate_json_output_and_prompt_over_context():
    r = CliRunner().invoke(main, ["generate", "-p", "Hello", "-n", "4", "--temp", "0", "-t", "2",
                                  "--json"], obj={})
    data = json.loads(r.output)
    assert data["timings"]["predicted_n"] == 4 and "content" in data
    r = CliRunner().invoke(main, ["generate", "-p", "word " * 600, "-c", "256", "-t", "2"], obj={})
    assert r.exit_code != 0 and "raise -c/--ctx-size" in r.output
    assert "Traceback" not in r.output


@pytest.mark.model
def test_bench_draft_model_type_measures_the_draft_model(tmp_path):
    """`bench --spec-type draft-simple -md X` runs the draft model (it used to measure
    spec-off: the draft type adds no n-gram drafter, so no drafter was attached), and
    its output equals spec-off's; without -md it is refused with one line."""
    from ngramspec.llama.model import default_model_path

    prompt = tmp_path / "p.txt"
    prompt.write_text("Write a short story about a lighthouse keeper.")
    out = tmp_path / "b.json"
    r = run("bench", "--spec-type", "draft-simple", "-md", str(default_model_path()), "-n", "12",
            "--reps", "1", "--workloads", "none", "--no-oracle", "-c", "1024", "--json-out",
            str(out), str(prompt))
    assert r.exit_code == 0, r.output
    modes = json.loads(out.read_text())["workloads"]["p"]
    assert modes["draft-simple"]["drafted"] > 0 and modes["draft-simple"]["exact"]
    bad = run("bench", "--spec-type", "draft-simple", "-n", "4", "--workloads", "none", str(prompt))
    assert bad.exit_code == 2 and "-md" in bad.output


def test_bench_has_subcommands_and_the_old_spelling_still_works():
    """`bench fixtures` and `bench pipeline` (issue 55); `bench [FILES] [--parallel N]`
    routes to the one the options mean. Checked on their errors: nothing loads."""
    r = run("bench", "--help")
    assert r.exit_code == 0 and "fixtures" in r.output and "pipeline" in r.output
    assert "refactor" in r.output  # the workloads are listed (tests/test_wheel.py)
    r = run("bench", "fixtures", "--help")
    assert r.exit_code == 0 and "--workloads" in r.output and "--parallel" not in r.output
    r = run("bench", "pipeline", "--help")
    assert r.exit_code == 0 and "--parallel" in r.output and "--reps" not in r.output
    for args, msg in ((("bench", "--parallel", "0"), "slot counts >= 1"),
                      (("bench", "pipeline", "--parallel", "x"), "slot counts like"),
                      (("bench", "--reps", "0"), "--reps and -n must be >= 1"),
                      (("bench", "fixtures", "-n", "0"), "--reps and -n must be >= 1")):
        r = run(*args)
        assert r.exit_code == 2 and msg in r.output, (args, r.output)
    r = run("bench", "fixtures", "--parallel", "1")
    assert r.exit_code == 2 and "No such option" in r.output
