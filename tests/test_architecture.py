"""The layer rules of docs/architecture.md, checked on the source (issue 24)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_import_cycle_and_no_layer_violation():
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_graph.py")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert " 0 cycles, 0 layer violations" in p.stdout


def test_no_function_over_60_lines():
    long = []
    for path in (ROOT / "ngramspec").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 60:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, long


def test_flags_and_a_request_override_mean_the_same_for_every_role():
    """The generic flags and a request's `speculative` fields both derive from
    config.SPEC_TYPE_TABLE: the same value gives the same config."""
    from ngramspec.settings.config import SPEC_TYPE_TABLE, spec_config_from_options

    for types in ("ngram-mod", "ngram-simple,ngram-map-k", "auto"):
        base = spec_config_from_options(types)
        for flag, field, value in (("spec_ngram_size_n", "ngram_size_n", 8),
                                   ("spec_ngram_size_m", "ngram_size_m", 16),
                                   ("spec_ngram_min_hits", "ngram_min_hits", 3)):
            assert spec_config_from_options(types, **{flag: value}) == \
                base.override(**{field: value}), (types, flag)
    cfg = spec_config_from_options("ngram-map-k", spec_ngram_min_hits=3)
    for t in SPEC_TYPE_TABLE:  # only the types whose table row has the role
        assert (getattr(cfg.params(t.name), "min_hits", None) == 3) == (t.hits is not None)


def test_props_sizes_are_the_first_types():
    from ngramspec.settings.config import SpecConfig

    assert SpecConfig(types=("ngram-mod",)).sizes() == (24, 64)
    assert SpecConfig(types=("ngram-map-k", "ngram-mod")).sizes() == (12, 48)
    assert SpecConfig(types=("auto",)).sizes() == SpecConfig(types=()).sizes() == (12, 48)


def test_one_output_budget_rule_for_requests_and_records():
    from ngramspec.engine.request import output_budget

    assert output_budget(10, 100) == (10, False)
    assert output_budget(200, 100) == (100, True)
    assert output_budget(-1, 100) == (100, True)
    assert output_budget(-1, 100, shift=True) == (-1, False)


def test_a_prepared_job_gives_a_fresh_job_per_submission():
    import numpy as np

    from ngramspec.jobs.scheduler import Job
    from ngramspec.settings.sampling import SamplingParams
    from ngramspec.server.prepare import Prepared, make_job

    prep = Prepared(Job(prompt=np.arange(3, dtype=np.int32), sampling=SamplingParams(),
                        n_predict=4, speculative=True, spec=None, stop=[],
                        sink=lambda ev: None), "abc")
    sinks = [lambda ev: None, lambda ev: None]
    a, b = (make_job(prep, s) for s in sinks)
    assert a.id != b.id and (a.sink, b.sink) == tuple(sinks)
    assert (a.cancelled, a.finished) == (False, False) and a.prompt is prep.job.prompt


def test_the_layers_are_folders_and_the_rank_rule_holds():
    """Issue 46's bars: few modules at the top, none over 500 lines, llama.context.Context at
    most 200 lines, no `own_*` module at the top, at most 10 tools in scripts/; and the
    rank rule of scripts/import_graph.py on hand-written module names."""
    import importlib.util

    pkg = ROOT / "ngramspec"
    top = sorted(p.name for p in pkg.glob("*.py"))
    assert len(top) <= 12 and not [n for n in top if n.startswith("own_")], top
    long = {str(p.relative_to(ROOT)): n for p in pkg.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long
    tree = ast.parse((pkg / "llama" / "context.py").read_text())
    ctx = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Context")
    assert ctx.end_lineno - ctx.lineno + 1 <= 200
    assert len([p for p in (ROOT / "scripts").iterdir() if p.is_file()]) <= 10
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    graph = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(graph)
    ok, bad = graph.allowed, lambda a, b: not graph.allowed(a, b)
    assert ok("ngramspec.engine.engine", "ngramspec.speculative.planner")
    assert ok("ngramspec.server.__main__", "ngramspec.cli.main")
    assert bad("ngramspec.batch.runner", "ngramspec.server.prepare")  # one rank, two layers
    assert bad("ngramspec.jobs.build", "ngramspec.batch.records")
    assert bad("ngramspec.llama.context", "ngramspec.speculative.cost")  # upwards
    assert bad("ngramspec.bench.pipeline", "ngramspec.cli.bench")


def test_one_function_builds_a_job():
    """Requests and batch records become Jobs in jobs/build.build_job alone."""
    calls = [str(p.relative_to(ROOT)) for p in (ROOT / "ngramspec").rglob("*.py")
             for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Job"]
    assert calls == ["ngramspec/jobs/build.py"], calls


def test_one_entry_point_and_no_research_tree():
    """`ngramspec` (and `python -m ngramspec`) is the one way in; finished experiments are
    a table in docs/experiments.md and their scripts in git's history (issue 55)."""
    assert not (ROOT / "cli.py").exists()
    assert not (ROOT / "ngramspec" / "server" / "__main__.py").exists()
    assert (ROOT / "ngramspec" / "__main__.py").exists()
    assert not (ROOT / "experiments").exists()
    assert (ROOT / "docs" / "experiments.md").exists()


def test_benchmarks_doc_holds_current_figures_only():
    """docs/benchmarks.md: current tables and their commands, at most 200 lines; the
    history goes to docs/benchmarks-history.md."""
    lines = (ROOT / "docs" / "benchmarks.md").read_text().splitlines()
    assert len(lines) <= 200, len(lines)


def test_no_tool_writes_the_systems_package_sources():
    """Set-up, tests and CI install into private prefixes: nothing writes /etc/apt (issue 55)."""
    import re

    writes = re.compile(r"(>|tee|cp|mv|rm|sed -i)[^\n]*/etc/apt")
    found = [str(p.relative_to(ROOT)) for d in ("tests", "scripts", ".ci") for p in (ROOT / d).rglob("*")
             if p.is_file() and p.suffix in ("", ".sh", ".py") and p.name != "test_architecture.py"
             and writes.search(p.read_text(errors="replace"))]
    assert not found, found


def test_one_word_per_type():
    """The speculation package is `speculative/` (no folder a test tool takes for specs),
    a sequence's Speculation is `.speculation`, and `spec` is a SpecConfig (issue 55)."""
    assert not (ROOT / "ngramspec" / "spec").exists()
    assert (ROOT / "ngramspec" / "speculative" / "speculation.py").exists()
    for path in (ROOT / "ngramspec").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                    and getattr(node.value.func, "id", "") == "Speculation"):
                names = [getattr(t, "attr", getattr(t, "id", "")) for t in node.targets]
                assert "spec" not in names, f"{path}: a Speculation named spec"


def test_no_synthetic_acceptance_in_the_product():
    """llama-server's --spec-synth-* are accepted and ignored (hidden, a warning): nothing on
    the engine's step accepts a draft token the model did not sample (issue 55)."""
    from click.testing import CliRunner

    from ngramspec.cli.main import main

    assert not (ROOT / "ngramspec" / "engine" / "synth.py").exists()
    for cmd in ("serve", "generate", "batch", "bench"):
        r = CliRunner().invoke(main, [cmd, "--help"], obj={})
        assert r.exit_code == 0 and "--spec-synth" not in r.output, cmd
    assert "synth" not in (ROOT / "ngramspec" / "engine" / "engine.py").read_text()


def test_the_clairvoyant_planner_is_a_script():
    """The research planner that knows the stream lives in scripts/rerun_bench.py, not in
    the product (issue 55)."""
    for path in (ROOT / "ngramspec").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        names |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
        assert not any("clairvoyant" in n for n in names), path


def test_server_settings_is_written_and_holds_the_flag_table():
    """ServerSettings is a written dataclass (readers, IDEs and type checkers see its
    fields), and its flag fields are the flag table's, with its defaults (issue 55)."""
    import dataclasses

    from ngramspec.settings.server import ServerSettings
    from ngramspec.settings import flags

    assert "make_dataclass" not in (ROOT / "ngramspec" / "settings" / "server.py").read_text()
    mine = {f.name: f for f in dataclasses.fields(ServerSettings)}
    table = flags.settings_fields()
    assert [n for n, _, _ in table] == [n for n in mine if n not in ("spec", "sampling", "api_keys")]
    for name, _, fld in table:
        assert mine[name].default == fld.default, name


def test_flag_values_go_down_once_into_settings():
    """A command's flag values become typed settings in settings/ alone: the builders
    (`typed`, and the per-group ones it calls) are defined there and called, outside
    settings/, only as `typed`; so serve's values go down into settings/ once and come
    back as ServerSettings, instead of climbing to engine/ and server/ between groups."""
    builders = ("settings_values", "engine_from_flags", "sampling_from_flags")
    for path in (ROOT / "ngramspec").rglob("*.py"):
        if path.parent.name == "settings":
            continue
        text = path.read_text()
        assert not any(b in text for b in builders), path
        if "typed(" in text:
            assert "from ..settings.typed import typed" in text, path
    assert not (ROOT / "ngramspec" / "engine" / "flag_values.py").exists()
    assert not (ROOT / "ngramspec" / "server" / "settings.py").exists()


def test_one_request_to_sampling_builder():
    """The server's requests and batch's records get their SamplingParams from one
    function (jobs/build.request_sampling); the ranges are SamplingParams' own (issue 55)."""
    for path in ("server/prepare.py", "batch/runner.py"):
        text = (ROOT / "ngramspec" / path).read_text()
        assert "request_sampling(" in text, path
        assert not any(piece in text for piece in ("other_samplers", "seed_or_random",
                                                   "grammar_of", "min_p")), path
