"""Compiling ngramspec's C kernels (`native/<name>.c`) with the system's C compiler.

A kernel is compiled once per version of its source and of the headers beside it, per
compiler, flags and machine, into the cache folder, and loaded from there. `scripts/setup.sh`
compiles every kernel (`python -m ngramspec.llama.kernels build`), so a first start compiles
nothing; a kernel missing from the cache is compiled at its first use.

A failed compilation is said once, with the compiler's own message, and remembered: a
file `<name>-<tag>.failed` beside where the library would be holds that message, and
later starts read it instead of compiling again (until the source, compiler or flags
change, or `library(name, force=True)`: setup and `ngramspec doctor --rebuild`).

A cache folder that cannot be written (read-only, full) does not turn a kernel off: it is
compiled into a private temporary folder, loaded, and the file removed (the mapping
stays); the next start compiles it again.

Invariants: a library is only loaded if it was built completely (written to a temporary
file, then renamed); `library(name)` never raises and never returns a library whose
build failed.
"""
from __future__ import annotations

import ctypes as C
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from ...settings.paths import cache_dir

SOURCES = Path(__file__).with_name("native")
#: the instruction sets the intrinsics name and no others (not -march=native: a VM may
#: advertise extensions it traps), and no contraction of products the source keeps apart
CFLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")
#: instruction-set variants a kernel's source may be compiled as: name -> (flags added to
#: CFLAGS, the CPU flags (/proc/cpuinfo) it needs), best first. A source that has no code
#: of its own for a variant compiles as AVX2 there; kernel.py runs a variant only where its
#: library says it is that variant (`ngs_variant`) and its checks pass.
VARIANTS = {
    "avx512vnni": (("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"),
                   ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")),
    "avx2": ((), ("avx2", "fma", "f16c")),
}
#: the flags of a kernel with no intrinsics (native/drafting.c): it runs on any CPU the
#: compiler targets, so it is compiled as "generic", apart from the instruction-set variants;
#: without fused multiply-adds, so that the planner's search in C rounds as its Python twin
GENERIC = "generic"
GENERIC_CFLAGS = ("-O2", "-ffp-contract=off", "-shared", "-fPIC")
DRAFTING = "drafting"  # native/drafting.c: the drafters' loops (speculative/native.py)
FOLD = "fold"  # native/fold.c: plain steps in one call (engine/fold.py)
_LOCK = threading.Lock()
_DONE: dict[tuple[str, str], "Built"] = {}


@dataclass(frozen=True)
class Built:
    """What became of one kernel's compilation: the loaded library, or why there is none."""

    lib: C.CDLL | None
    reason: str = ""  # empty when lib is loaded
    path: str = ""  # the library file, or the remembered failure


def compiler() -> str:
    """The C compiler: $CC, else cc."""
    return os.environ.get("CC") or "cc"


def flags(variant: str) -> tuple[str, ...]:
    return GENERIC_CFLAGS if variant == GENERIC else (*CFLAGS, *VARIANTS[variant][0])


def _tag(name: str, variant: str) -> str:
    """A digest of what the library depends on: its source, every header, compiler, flags."""
    src = (SOURCES / f"{name}.c").read_bytes()
    src += b"".join(h.read_bytes() for h in sorted(SOURCES.glob("*.h")))
    return hashlib.sha256(src + " ".join((compiler(), *flags(variant), platform.machine())).encode()
                          ).hexdigest()[:16]


def library(name: str, variant: str = "avx2", force: bool = False) -> Built:
    """native/<name>.c compiled as `variant` (or found compiled) and loaded; once per
    process unless `force`, which also compiles again after a remembered failure."""
    with _LOCK:
        if force or (name, variant) not in _DONE:
            _DONE[name, variant] = _build_or_load(name, variant, force)
        return _DONE[name, variant]


def _build_or_load(name: str, variant: str, force: bool) -> Built:
    tag = _tag(name, variant)
    folder = cache_dir() / "native"
    stem = f"{name}-{variant}-{tag}"
    out, failed = folder / f"{stem}.so", folder / f"{stem}.failed"
    if out.exists():
        return _load(out)
    if not force and failed.exists():
        first = failed.read_text(errors="replace").strip().splitlines()[:1] or ["no output"]
        return Built(None, f"its compilation failed before ({first[0][:160]}; all of it in "
                           f"{failed}; `ngramspec doctor --rebuild` tries again)", str(failed))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=folder, suffix=".so", delete=False)
        probe.close()
    except OSError:  # a cache folder that cannot be written: a private one for this process
        return _build_private(name, variant)
    error = _compile(name, variant, Path(probe.name))
    if error is None:
        os.replace(probe.name, out)
        failed.unlink(missing_ok=True)
        return _load(out)
    Path(probe.name).unlink(missing_ok=True)
    try:
        failed.write_text(error)
    except OSError:
        pass
    return _said(name, variant, error, str(failed))


def _build_private(name: str, variant: str) -> Built:
    """Compile into a temporary folder of this process, load, and remove the folder."""
    folder = Path(tempfile.mkdtemp(prefix="ngramspec-kernels-"))
    try:
        out = folder / f"{name}.so"
        error = _compile(name, variant, out)
        return _said(name, variant, error, "") if error is not None else _load(out)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _compile(name: str, variant: str, out: Path) -> str | None:
    """Run the compiler; None when it made `out`, else its message (stderr and stdout)."""
    cmd = [compiler(), *flags(variant), "-o", str(out), str(SOURCES / f"{name}.c"), "-lm"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{' '.join(cmd)}: {e}"
    if p.returncode == 0 and out.exists():
        return None
    msg = (p.stderr + p.stdout).strip() or f"exit status {p.returncode}, no message"
    return f"{' '.join(cmd)}: {msg}"


def _said(name: str, variant: str, error: str, remembered: str) -> Built:
    """A new failure: printed once (stderr), with the compiler's message and what runs
    instead (a generic kernel's Python reference, else llama.cpp's kernels)."""
    lines = error.splitlines()
    shown = "\n  ".join(lines[:12] + ([f"... ({len(lines) - 12} more lines)"] if len(lines) > 12 else []))
    instead = "the Python code runs" if variant == GENERIC else "llama.cpp's own kernels run"
    print(f"ngramspec: the C kernel {name} ({variant}) did not compile; {instead} instead."
          f"\n  {shown}", file=sys.stderr)
    return Built(None, f"its compilation failed ({lines[0][:160] if lines else error})", remembered)


def _load(path: Path) -> Built:
    try:
        return Built(C.CDLL(str(path)), "", str(path))
    except OSError as e:
        return Built(None, f"the compiled library does not load ({e})", str(path))
