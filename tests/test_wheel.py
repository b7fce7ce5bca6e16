"""A wheel built from the repository, installed apart from it, finds its package data: the
bench workloads (`bench --help` lists them) and the C kernels' sources (issue 55)."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tracked_tree(dest: Path) -> Path:
    """The repository's tracked files copied to `dest` (the build writes beside them)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for f in filter(None, files):
        src, dst = ROOT / f, dest / f
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(src.read_bytes())
    return dest


def test_a_wheel_installed_elsewhere_finds_its_workloads(tmp_path):
    tree = _tracked_tree(tmp_path / "src")
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(tree)], check=True, capture_output=True)
    wheel = next(wheels.glob("ngramspec-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "ngramspec/bench/fixtures/prompts/refactor.txt" in names
    assert "ngramspec/llama/kernels/native/drafting.c" in names
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                    str(wheel)], check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import ngramspec; print(ngramspec.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert where.stdout.strip().startswith(str(site))
    p = subprocess.run([sys.executable, "-m", "ngramspec", "bench", "--help"], cwd=tmp_path,
                       env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    text = " ".join(p.stdout.split())
    for name in ("reasoning", "refactor", "story", "summarize"):
        assert name in text
    assert "none found" not in text
