"""llama.cpp's library is mapped before numpy and any third-party extension module
(llama/library.py: a CUDA build crashes at model load otherwise).

Each check runs an entry point in a fresh interpreter with two hooks installed first:
a `sys.meta_path` finder that records every top-level import, and a `ctypes.CDLL`
wrapper that, when libllama is mapped, records which extension modules outside the
standard library are already loaded and whether numpy is."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ngramspec.llama import library

HOOKS = textwrap.dedent("""
    import ctypes, json, os, sys, sysconfig
    STDLIB = (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"])
    events = []

    class Recorder:
        def find_spec(self, name, path=None, target=None):
            if "." not in name and name not in sys.modules:
                events.append(["import", name])
            return None

    def third_party_extensions():
        out = []
        for name, m in list(sys.modules.items()):
            f = getattr(m, "__file__", None) or ""
            if f.endswith((".so", ".pyd")) and not f.startswith(STDLIB):
                out.append(name)
        return sorted(out)

    _init = ctypes.CDLL.__init__
    def init(self, name, *a, **k):
        base = os.path.basename(str(name)) if name else ""
        if base.startswith("libllama"):
            events.append(["libllama", third_party_extensions(), "numpy" in sys.modules])
        return _init(self, name, *a, **k)

    ctypes.CDLL.__init__ = init
    sys.meta_path.insert(0, Recorder())

    def dump():
        with open(os.environ["LOAD_ORDER_OUT"], "w") as f:
            json.dump(events, f)
""")


def _run(tmp_path: Path, body: str, timeout: float = 300) -> list:
    """Run `body` after the hooks in a fresh interpreter; the events it recorded."""
    out = tmp_path / "events.json"
    script = tmp_path / "entry.py"
    script.write_text(HOOKS + "\ntry:\n" + textwrap.indent(body, "    ")
                      + "\nfinally:\n    dump()\n")
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=timeout, env={**__import__("os").environ,
                                             "LOAD_ORDER_OUT": str(out)})
    assert out.exists(), p.stderr[-2000:]
    return json.loads(out.read_text())


def _check_llama_first(events: list) -> None:
    loads = [e for e in events if e[0] == "libllama"]
    assert loads, "libllama was never mapped"
    _, extensions, numpy_loaded = loads[0]
    assert not numpy_loaded, "numpy was imported before llama.cpp's library"
    assert extensions == [], f"extension modules mapped before llama.cpp's: {extensions}"
    imports = [e[1] for e in events if e[0] == "import"]
    first = events.index(loads[0])
    assert "numpy" not in [e[1] for e in events[:first] if e[0] == "import"]
    assert "numpy" in imports  # the hooks saw the rest of the start-up


def _cli(*args: str) -> str:
    return ("import sys\nfrom ngramspec.cli.main import run\n"
            f"sys.argv = ['ngramspec', *{list(args)!r}]\n"
            "try:\n    run()\nexcept SystemExit as e:\n    assert not e.code, e.code\n")


def test_python_api_maps_llama_before_numpy(tmp_path):
    _check_llama_first(_run(tmp_path, "import ngramspec\nimport numpy\n"))


def test_doctor_maps_llama_before_numpy(tmp_path):
    _check_llama_first(_run(tmp_path, _cli("doctor", "--json")))


@pytest.mark.model
def test_generate_maps_llama_before_numpy(tmp_path):
    _check_llama_first(_run(tmp_path, _cli("generate", "-p", "Hello", "-n", "4", "--temp", "0")))


def test_server_and_batch_entries_map_llama_before_numpy(tmp_path):
    _check_llama_first(_run(tmp_path, _cli("serve", "--help")))
    _check_llama_first(_run(tmp_path, _cli("batch", "--help")))


def test_the_library_is_the_one_llama_cpp_loads():
    import llama_cpp.llama_cpp as lc
    assert library.is_loaded()
    assert Path(lc._lib._name).resolve() == library.library_path().resolve()


def test_preload_env_puts_llama_first(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/opt/other.so")
    env = library.preload_env()
    if sys.platform.startswith("linux"):
        assert env["LD_PRELOAD"].split() == [str(library.library_path()), "/opt/other.so"]
    else:
        assert env == {}


def test_gpu_backends_found_by_file_name(tmp_path):
    for name in ("libllama.so", "libggml-base.so", "libggml-cpu.so", "libggml-cuda.so"):
        (tmp_path / name).write_bytes(b"")
    assert library.gpu_backends(tmp_path) == ["ggml-cuda"]
    (tmp_path / "libggml-cuda.so").unlink()
    assert library.gpu_backends(tmp_path) == []


def test_numpy_first_warns_on_a_device_build(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    for name in ("libllama.so", "libggml-vulkan.so"):
        (lib / name).write_bytes(b"")  # not loadable: load_first then reports False
    p = subprocess.run([sys.executable, "-W", "always", "-c",
                        "import numpy, ngramspec.llama.library as l; print(l.is_loaded())"],
                       capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "LLAMA_CPP_LIB_PATH": str(lib)})
    assert "numpy was imported before ngramspec" in p.stderr
    assert "ggml-vulkan" in p.stderr
