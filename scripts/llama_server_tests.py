#!/usr/bin/env python3
"""Run llama.cpp's own server test suite against `ngramspec serve` and/or llama-server.

    python scripts/llama_server_tests.py --server both --llama-server PATH --json-out r.json

The suite (tools/server/tests of the llama.cpp that llama-cpp-python vendors) is copied
from the sdist into a temporary folder and run unchanged with pytest, one test file at a
time, with `LLAMA_SERVER_BIN_PATH` set to the server under test. Every model the harness
names is swapped for the embedded Gemma 3 270M GGUF by the plugin llama_server_swap.py
(same folder), identically for both servers, so a difference in outcome is a difference
between the servers. ngramspec is started through a wrapper that runs
`python -m ngramspec serve "$@"`: every flag the harness passes reaches our CLI.

Output: per-file passed/failed/error/skipped counts side by side, the tests that pass on
llama-server and not on ngramspec with the first line of their failure, and (--json-out)
every test's outcome per server. Results of a server not run this time are kept from an
existing --json-out file, so one side can be re-run alone and still be compared.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import venv
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ngramspec" / "llama-server-tests"
SDIST_VERSION = "0.3.36"
TESTS_SUBDIR = Path("vendor/llama.cpp/tools/server/tests")
DEFAULT_FILES = ["test_basic", "test_completion", "test_chat_completion", "test_speculative",
                 "test_metrics", "test_tokenize", "test_stream", "test_ctx_shift",
                 "test_ignore_eos", "test_security", "test_slot_save"]
# what the harness imports (conftest, utils, the test files above); versions left to pip
HARNESS_PACKAGES = ["pytest", "requests", "filelock", "wget", "openai"]
OUTCOMES = ("passed", "failed", "error", "skipped")
SERVERS = ("llama", "ngramspec")


# ------------------------------------------------------------------ the suite's source


def tests_dir_in(src: Path) -> Path:
    """The tools/server/tests folder given the sdist root, vendor/llama.cpp or the folder."""
    for cand in (src, src / "tools/server/tests", src / TESTS_SUBDIR):
        if (cand / "utils.py").is_file() and (cand / "unit").is_dir():
            return cand
    raise SystemExit(f"no llama.cpp server tests (utils.py, unit/) under {src}")


def download_tests(cache: Path, version: str) -> Path:
    """Fetch the llama-cpp-python sdist with pip once and extract only the server tests."""
    root = cache / f"llama_cpp_python-{version}"
    if (root / TESTS_SUBDIR / "utils.py").is_file():
        return root / TESTS_SUBDIR
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / f"llama_cpp_python-{version}.tar.gz"
    if not archive.is_file():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--no-binary", ":all:", f"llama-cpp-python=={version}", "-d", str(cache)],
                       check=True)
    prefix = f"llama_cpp_python-{version}/{TESTS_SUBDIR.as_posix()}/"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        tar.extractall(cache, members=members, filter="data")
    return root / TESTS_SUBDIR


def copy_suite(tests_src: Path, dest: Path) -> Path:
    """A fresh, writable copy of the suite (the harness writes tmp/ and logs inside it)."""
    suite = dest / "tests"
    shutil.copytree(tests_src, suite, ignore=shutil.ignore_patterns("tmp", "__pycache__",
                                                                   ".pytest_cache"))
    (suite / "tmp").mkdir(exist_ok=True)
    return suite


# ------------------------------------------------------------------ the processes


def harness_python(explicit: str | None, cache: Path) -> str:
    """A Python that has pytest and the harness's imports: given, this one, or a cached venv."""
    if explicit:
        return explicit
    probe = "import " + ", ".join(p.replace("-", "_") for p in HARNESS_PACKAGES)
    if subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0:
        return sys.executable
    env_dir = cache / "harness-venv"
    py = env_dir / "bin" / "python"
    if not py.exists() or subprocess.run([str(py), "-c", probe], capture_output=True).returncode:
        print(f"installing the harness's packages into {env_dir} ...", file=sys.stderr)
        venv.create(env_dir, with_pip=True, clear=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *HARNESS_PACKAGES], check=True)
    return str(py)


def ngramspec_wrapper(dest: Path, python: str) -> Path:
    """An executable that runs `python -m ngramspec serve` with every argument it gets."""
    wrapper = dest / "ngramspec-server"
    wrapper.write_text("#!/bin/sh\n"
                       f"PYTHONPATH='{REPO}'${{PYTHONPATH:+:$PYTHONPATH}} "
                       "OMP_WAIT_POLICY=PASSIVE "
                       f"exec '{python}' -m ngramspec serve \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


def free_port() -> int:
    """A TCP port nobody listens on now (the harness's default 8080 may be taken)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_while(path: str | None) -> None:
    """Block while `path` exists (someone is timing a benchmark on this machine)."""
    while path and os.path.exists(path):
        time.sleep(30)


def run_file(py: str, suite: Path, name: str, server_bin: str, model: str, args,
             junit: Path) -> str | None:
    """pytest on unit/<name>.py against `server_bin`; the JUnit XML lands in `junit`.

    Returns None, or a line saying why the whole file produced no results."""
    # the servers run with OMP_WAIT_POLICY=PASSIVE, beside pytest: the decode-cost curves they
    # measure go to the work folder, never to the user's cache (they would steer a benchmark)
    env = {**os.environ, "LLAMA_SERVER_BIN_PATH": server_bin, "NGRAMSPEC_SWAP_MODEL": model,
           "PORT": str(args.port or free_port()), "OMP_WAIT_POLICY": "PASSIVE",
           "NGRAMSPEC_CACHE_DIR": str(junit.parent / "decode-cost"),
           "PYTHONPATH": os.pathsep.join([str(suite), str(SCRIPTS)])}
    cmd = [py, "-m", "pytest", f"unit/{name}.py", "-p", "llama_server_swap",
           "-p", "no:cacheprovider", "-q", "-rN", f"--junitxml={junit}",
           "-o", "junit_logging=system-out", "-o", "junit_family=xunit1"]
    if not args.slow:
        cmd += ["-m", "not slow"]
    if args.k:
        cmd += ["-k", args.k]
    log = junit.with_suffix(".log")
    with log.open("w") as out:
        try:
            subprocess.run(cmd, cwd=suite, env=env, stdout=out, stderr=subprocess.STDOUT,
                           timeout=args.file_timeout)
        except subprocess.TimeoutExpired:
            return f"timed out after {args.file_timeout} s (log: {log})"
    return None if junit.is_file() else f"pytest wrote no report (log: {log})"


# ------------------------------------------------------------------ results


def first_line(text: str | None) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def server_error_line(output: str | None) -> str:
    """The last line of the captured output that reads like a server error, if any."""
    keys = ("error", "usage:", "no such option", "invalid", "unknown", "no module",
            "exception", "abort")
    harness = ("Response from server", "Partial response", "tests: starting", "server pid=",
               "Stopping server", "Waiting for server", "Final response")
    lines = [ln.strip() for ln in (output or "").splitlines()
             if ln.strip() and not ln.startswith(harness)
             and not ln.lstrip().startswith(('"', "{", "}", "[", "]"))]  # printed JSON
    hits = [ln for ln in lines if any(k in ln.lower() for k in keys)]
    return hits[-1][:300] if hits else ""


def parse_junit(path: Path, name: str) -> dict[str, dict]:
    """{test id: {outcome, message, server}} from pytest's JUnit XML for one file.

    A test reported twice (a call failure and a teardown error) keeps the first non-pass."""
    results: dict[str, dict] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        tid = f"{name}::{case.get('name')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = first_line(node.get("message")) or first_line(node.text)
                break
        out = case.findtext("system-out")
        entry = {"outcome": outcome, "message": message}
        if outcome in ("failed", "error"):
            entry["server"] = server_error_line(out)
        if tid not in results or results[tid]["outcome"] == "passed":
            results[tid] = entry
    return results


def count(results: dict[str, dict], name: str) -> dict[str, int]:
    c = dict.fromkeys(OUTCOMES, 0)
    for tid, r in results.items():
        if tid.split("::")[0] == name:
            c[r["outcome"]] += 1
    return c


def regressions(report: dict) -> list[dict]:
    """Tests that pass on llama-server and do not pass on ngramspec."""
    if not all(s in report["servers"] for s in SERVERS):
        return []
    llama, ours = report["servers"]["llama"]["tests"], report["servers"]["ngramspec"]["tests"]
    rows = []
    for tid, r in llama.items():
        o = ours.get(tid, {"outcome": "missing", "message": "not run on ngramspec"})
        if r["outcome"] == "passed" and o["outcome"] != "passed":
            rows.append({"test": tid, **o})
    return rows


def print_table(report: dict, files: list[str]) -> None:
    sides = [s for s in SERVERS if s in report["servers"]]
    head = f"{'file':24}" + "".join(f" | {s + ' p/f/e/s':>22}" for s in sides)
    print(head)
    print("-" * len(head))
    totals = {s: dict.fromkeys(OUTCOMES, 0) for s in sides}
    for name in files:
        row = f"{name:24}"
        for s in sides:
            c = report["servers"][s]["files"].get(name) or dict.fromkeys(OUTCOMES, 0)
            row += " | " + f"{'/'.join(str(c[o]) for o in OUTCOMES):>22}"
            for o in OUTCOMES:
                totals[s][o] += c[o]
        print(row)
    print(f"{'total':24}" + "".join(
        f" | {'/'.join(str(totals[s][o]) for o in OUTCOMES):>22}" for s in sides))
    for s in sides:
        for name, why in report["servers"][s].get("file_errors", {}).items():
            print(f"{s}: {name}: {why}")


# ------------------------------------------------------------------ main


def run_server(side: str, args, py: str, suite: Path, model: str, work: Path) -> dict:
    """Every chosen file against one server: {tests, files, file_errors}."""
    server_bin = (args.llama_server if side == "llama"
                  else str(ngramspec_wrapper(work, args.ngramspec_python)))
    tests, files, file_errors = {}, {}, {}
    for name in args.files:
        if not (suite / "unit" / f"{name}.py").is_file():
            file_errors[name] = "not in this llama.cpp version"
            continue
        wait_while(args.pause_while)
        junit = work / f"{side}-{name}.xml"
        t0 = time.time()
        why = run_file(py, suite, name, server_bin, model, args, junit)
        if why:
            file_errors[name] = why
        else:
            tests.update(parse_junit(junit, name))
        files[name] = count(tests, name)
        c = files[name]
        print(f"[{side}] {name}: {c['passed']} passed, {c['failed']} failed, {c['error']} "
              f"errors, {c['skipped']} skipped ({time.time() - t0:.0f} s)"
              + (f" -- {why}" if why else ""), file=sys.stderr, flush=True)
    return {"binary": server_bin, "tests": tests, "files": files, "file_errors": file_errors}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", choices=["llama", "ngramspec", "both"], default="both")
    p.add_argument("--llama-server", help="llama-server binary (needed for --server llama/both)")
    p.add_argument("--llama-cpp-src", type=Path,
                   help="llama-cpp-python sdist folder, its vendor/llama.cpp, or tools/server/tests "
                        "(default: the sdist downloaded with pip into the cache)")
    p.add_argument("--files", nargs="+", default=DEFAULT_FILES,
                   help="test files under unit/, without .py")
    p.add_argument("-k", help="pytest -k expression")
    p.add_argument("--json-out", type=Path, help="write every test's outcome per server here")
    p.add_argument("--model", help="GGUF used for every model of the harness (default: embedded)")
    p.add_argument("--slow", action="store_true", help="include tests marked slow")
    p.add_argument("--port", type=int, help="server port (default: a free one per file)")
    p.add_argument("--file-timeout", type=int, default=1800, help="seconds per test file")
    p.add_argument("--harness-python", help="Python with pytest, requests, filelock, wget, openai")
    p.add_argument("--ngramspec-python", default=sys.executable,
                   help="Python that runs ngramspec serve (default: this one)")
    p.add_argument("--pause-while", help="before each test file, wait while this path exists")
    p.add_argument("--keep", action="store_true", help="keep the work folder (logs, XML)")
    args = p.parse_args(argv)
    args.files = [f.removesuffix(".py").split("/")[-1] for f in args.files]
    if args.server in ("llama", "both") and not (args.llama_server and os.access(args.llama_server, os.X_OK)):
        p.error("--server llama/both needs --llama-server PATH to an executable llama-server")
    return args


def default_model() -> str:
    sys.path.insert(0, str(REPO))
    from ngramspec.llama.model import default_model_path

    return default_model_path()


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    src = tests_dir_in(args.llama_cpp_src) if args.llama_cpp_src else download_tests(CACHE, SDIST_VERSION)
    model = args.model or default_model()
    py = harness_python(args.harness_python, CACHE)
    sides = list(SERVERS) if args.server == "both" else [args.server]
    report = {"servers": {}}
    if args.json_out and args.json_out.is_file():
        report["servers"] = json.loads(args.json_out.read_text()).get("servers", {})
    work = Path(tempfile.mkdtemp(prefix="llama-server-tests-"))
    try:
        suite = copy_suite(src, work)
        for side in sides:
            report["servers"][side] = run_server(side, args, py, suite, model, work)
    finally:
        if args.keep:
            print(f"work folder kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    report.update(model=model, files=args.files, regressions=regressions(report))
    print_table(report, args.files)
    if report["regressions"]:
        print(f"\npass on llama-server, not on ngramspec ({len(report['regressions'])}):")
        for r in report["regressions"]:
            print(f"  {r['test']}: {r['outcome']}: {r['message']}"
                  + (f"  [server: {r['server']}]" if r.get("server") else ""))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
