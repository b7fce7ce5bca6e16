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
