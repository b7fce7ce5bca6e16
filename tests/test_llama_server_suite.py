"""llama.cpp's own server test suite against `ngramspec serve` (slow: ~30-60 min on 2 cores).

Runs scripts/llama_server_tests.py on the default test files. ngramspec must pass at least
as many tests as the C++ llama-server with the same model swap: the one measured in the
same run when $LLAMA_SERVER_BIN_PATH names the binary, otherwise the count recorded in
docs/llama_server_tests.md (the `llama-server passed:` marker).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "llama_server_tests.py"
DOC = REPO / "docs" / "llama_server_tests.md"

pytestmark = [pytest.mark.slow, pytest.mark.model]


def recorded_llama_passed() -> int:
    """The llama-server pass count recorded in the doc's `<!-- llama-server passed: N -->`."""
    m = re.search(r"<!-- llama-server passed: (\d+) -->", DOC.read_text())
    assert m, f"{DOC} has no '<!-- llama-server passed: N -->' marker"
    return int(m.group(1))


def passed(report: dict, side: str) -> int:
    return sum(1 for r in report["servers"][side]["tests"].values() if r["outcome"] == "passed")


def test_ngramspec_passes_as_many_as_llama_server(tmp_path):
    binary = os.environ.get("LLAMA_SERVER_BIN_PATH")
    if binary and not os.access(binary, os.X_OK):
        pytest.skip(f"LLAMA_SERVER_BIN_PATH={binary} is not an executable llama-server; "
                    "unset it to compare with the count recorded in docs/llama_server_tests.md")
    out = tmp_path / "results.json"
    cmd = [sys.executable, str(SCRIPT), "--json-out", str(out)]
    cmd += ["--server", "both", "--llama-server", binary] if binary else ["--server", "ngramspec"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0 and out.is_file(), proc.stderr[-3000:]
    report = json.loads(out.read_text())
    target = passed(report, "llama") if binary else recorded_llama_passed()
    ours = passed(report, "ngramspec")
    failing = [f"{t}: {r['outcome']}: {r['message']}"
               for t, r in report["servers"]["ngramspec"]["tests"].items()
               if r["outcome"] in ("failed", "error")]
    assert ours >= target, (f"ngramspec passed {ours}, llama-server {target}; failing:\n"
                            + "\n".join(failing[:80]) + "\n" + proc.stdout[-4000:])
