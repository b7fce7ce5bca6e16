"""ngramspec's kernels where they must not run, or cannot: every case ends with llama.cpp's
computation and a stated reason, never a crash (issue 43). Process-wide state (the
guard, compiled libraries) is per process, so each case runs in a fresh interpreter.

- `ngramspec doctor --json`: each kernel active or not, with a reason;
- no compiler (CC=false): said once with the compiler's message, remembered, not retried;
- every instruction-set variant the CPU runs (kernels/build.py) built and checked;
- a cache folder that cannot be written: compiled privately, still active;
- a CPU without AVX2/FMA/F16C (faked), another llama-cpp-python or ggml (faked), another
  device than the CPU (faked): inactive, the reason named, a context still decodes;
- a C struct whose size differs from its ctypes mirror: inactive;
- a slot saved with own attention and restored where it is off: the prompt is evaluated
  again and the continuation equals a cold one.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parents[1]
OFF = {"NGRAMSPEC_OWN_HEAD": "0", "NGRAMSPEC_OWN_ATTENTION": "0", "NGRAMSPEC_OWN_MATMUL": "0"}

#: run in a fresh interpreter: optional patch, then the kernel states, the state of a
#: context on the embedded model and a decode's first logits, as one JSON line
PROBE = """
import json, sys
import llama_cpp
from ngramspec.llama import kernels
from ngramspec.llama.kernels import guard
{patch}
from ngramspec.llama.context import Context, ContextParams
from ngramspec.llama.model import Model
states = kernels.states()
ctx = Context(Model(), ContextParams(n_ctx=512, n_batch=64))
rows = ctx.decode([(0, [2, 100, 200, 300], 0, True)])
print(json.dumps({{"states": states, "context": ctx.kernels.state(), "mode": ctx.kernels.cell_mode,
                  "logit": float(ctx.logits_at(rows[0][-1])[0])}}))
"""


def _run(args: list[str], env: dict[str, str] | None = None, cache: Path | None = None):
    e = {**os.environ, **(env or {})}
    if cache is not None:
        e["NGRAMSPEC_CACHE_DIR"] = str(cache)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=e,
                          cwd=ROOT, timeout=300)


def _probe(patch: str = "", probe_src: str = PROBE, **kw) -> tuple[dict, str]:
    p = _run(["-c", probe_src.format(patch=patch)], **kw)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def _all_off(out: dict, reason: str) -> None:
    for where in ("states", "context"):
        for name, st in out[where].items():
            assert st["active"] is False and reason in st["reason"], (where, name, st)
    assert out["mode"] == "llama.cpp"


def test_doctor_json_every_kernel_off_with_its_reason():
    p = _run(["-m", "ngramspec", "doctor", "--json"], env=OFF)
    assert p.returncode == 0, p.stderr[-2000:]
    report = json.loads(p.stdout)
    assert set(report["kernels"]) == {"head", "attention", "matmul"}
    for name, st in report["kernels"].items():
        assert st["active"] is False and "=0" in st["reason"], (name, st)
    assert report["context"]["cell_mode"] == "llama.cpp"
    assert report["llama"]["llama_cpp_python"] and report["cpu"]["machine"]
    assert report["paths"]["cache"]["path"]


def test_doctor_text_names_every_kernel():
    p = _run(["-m", "ngramspec", "doctor"])
    assert p.returncode == 0, p.stderr[-2000:]
    for name in ("head", "attention", "matmul"):
        assert any(line.strip().startswith(name) for line in p.stdout.splitlines()), p.stdout


def test_no_compiler_is_said_once_remembered_and_retried_by_setup(tmp_path):
    from kernel_toggle import require
    from ngramspec.llama.kernels import KERNELS, attention

    require(attention.KERNEL)  # where the kernels can be built at all
    n = sum(len(k.candidates()) for k in KERNELS)  # libraries: kernels x variants this CPU runs
    env = {"CC": "false"}
    out, err = _probe(env=env, cache=tmp_path)
    _all_off(out, "compilation failed")
    assert err.count("did not compile") == n, err  # once per library, with the compiler's words
    assert len(list((tmp_path / "native").glob("*.failed"))) == n
    out2, err2 = _probe(env=env, cache=tmp_path)
    _all_off(out2, "failed before")
    assert "did not compile" not in err2  # remembered: not compiled again, not said again
    assert out2["logit"] == out["logit"]
    # setup's step builds the drafting loops and the folded steps too (generic C, any CPU):
    # two libraries more
    p = _run(["-m", "ngramspec.llama.kernels", "build"], env=env, cache=tmp_path)
    assert p.returncode == 0 and p.stdout.count(": not built, its compilation failed (") == n + 2
    assert p.stderr.count("did not compile") == n + 2  # tried again, and said again
    assert "drafting (generic) did not compile; the Python code runs instead" in p.stderr
    p = _run(["-m", "ngramspec.llama.kernels", "build"], cache=tmp_path)  # a compiler: built
    assert p.returncode == 0 and p.stdout.count(": built (") == n + 2, p.stdout + p.stderr


def test_a_cache_folder_that_cannot_be_written(tmp_path):
    from kernel_toggle import require
    from ngramspec.llama.kernels import attention

    require(attention.KERNEL)
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")  # a folder under a file cannot be made, even by root
    out, err = _probe(cache=blocked / "cache")
    for st in out["states"].values():
        assert st["active"], out
    assert out["mode"] == "own-attention" and "did not compile" not in err
    assert blocked.read_text() == "not a folder"


def test_a_cpu_without_the_flags():
    out, _ = _probe("guard.cpu_flags = lambda: {'sse2', 'sse4_2'}")
    _all_off(out, "the CPU lacks avx2, fma, f16c")


def test_another_llama_cpp_python_or_ggml():
    out, _ = _probe("llama_cpp.__version__ = '0.3.99'")
    _all_off(out, "llama-cpp-python 0.3.99 is loaded")
    out2, _ = _probe("guard.VERIFIED_GGML = '0.26.0'")
    _all_off(out2, "the kernels are verified against 0.26.0 only")
    assert out["logit"] == out2["logit"]


def test_a_device_besides_the_cpu():
    out, _ = _probe("guard.devices = lambda: [('CPU', 'CPU'), ('Vulkan0', 'GPU')]")
    _all_off(out, "a device besides the CPU: Vulkan0 (GPU)")


def test_device_policy_keeps_every_node_on_the_cpu_at_ngl_0(monkeypatch):
    """-ngl 0 on a build with a device: every node on the CPU (no op offload); -ngl N
    there: tests/test_fixed_shape.py."""
    from ngramspec.llama.kernels import guard
    from ngramspec.engine.runtime import device_policy

    assert device_policy(99, True) == (True, None, False)  # a CPU build: -ngl changes nothing
    monkeypatch.setattr(guard, "devices", lambda: [("CPU", "CPU"), ("Vulkan0", "GPU")])
    offload, note, fixed = device_policy(0, True)
    assert offload is False and not fixed and "no op offload" in note


def test_the_layouts_of_this_build_pass_and_a_wrong_struct_size_is_caught():
    import ctypes as C
    import dataclasses

    import llama_cpp  # noqa: F401
    from ngramspec.llama.kernels import attention, guard, kernel
    from kernel_toggle import require

    require(attention.KERNEL)
    assert guard.layout_reason() is None and guard.blocker() is None

    class Short(C.Structure):
        _fields_ = attention.KERNEL.hook_struct._fields_[:-1]
    wrong = dataclasses.replace(attention.KERNEL, hook_struct=Short)
    assert "ctypes mirror" in kernel._check(wrong, attention.KERNEL.library())


def test_a_slot_restored_into_another_kernel_mode_is_evaluated_again(tmp_path, monkeypatch):
    """Saved by a server whose attention is ngramspec's, restored by one whose attention is
    llama.cpp's: the file's cells are not reused, and the continuation equals a cold
    evaluation of the same prompt on that server."""
    from kernel_toggle import require
    from ngramspec.llama.kernels import attention
    from test_slot_save import PROMPT, client, complete

    require(attention.KERNEL)
    with client(slot_save_path=str(tmp_path)) as c:
        assert c.app.state.ngramspec.engine.ctx.kernels.cell_mode == "own-attention"
        complete(c, PROMPT, 1)
        assert c.post("/slots/1?action=save", json={"filename": "s.bin"}).status_code == 200
    monkeypatch.setenv("NGRAMSPEC_OWN_ATTENTION", "0")
    with client(slot_save_path=str(tmp_path)) as c:
        assert c.app.state.ngramspec.engine.ctx.kernels.cell_mode == "llama.cpp"
        cold = complete(c, PROMPT, 1, cache_prompt=False)
        r = c.post("/slots/0?action=restore", json={"filename": "s.bin"})
        assert r.status_code == 200, r.text
        hit = complete(c, PROMPT, 0)
        assert hit["timings"]["cache_n"] == 0  # nothing of the other mode's cells reused
        assert hit["tokens"] == cold["tokens"]
        # the same server's own file is reused as before
        assert c.post("/slots/0?action=save", json={"filename": "t.bin"}).status_code == 200
        c.post("/slots/0?action=restore", json={"filename": "t.bin"})
        assert complete(c, PROMPT, 0)["timings"]["cache_n"] > 0


def test_a_ray_pool_keeps_one_kernel_mode(monkeypatch):
    """RayPool._one_mode with Ray stood in for (Ray is an optional extra): actors of one
    cell mode give one line; a mix is refused, naming each actor's mode."""
    import sys
    import types

    fake = types.ModuleType("ray")
    fake.get = lambda refs: refs  # the stand-in's "remote" calls return values
    fake.exceptions = types.ModuleType("ray.exceptions")
    fake.exceptions.RayActorError = RuntimeError
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setitem(sys.modules, "ray.exceptions", fake.exceptions)
    monkeypatch.delitem(sys.modules, "ngramspec.batch.ray_backend", raising=False)
    from ngramspec.batch.ray_backend import RayPool
    from ngramspec.errors import NgramSpecError

    class Actor:
        def __init__(self, mode):
            line = f"kernels: ...; KV cells: {mode}"
            self.kernels = types.SimpleNamespace(remote=lambda: (mode, line))
            self.where = types.SimpleNamespace(remote=lambda: ("node", 7))

    pool = object.__new__(RayPool)
    pool.close = lambda: None
    pool.actors = [Actor("own-attention"), Actor("own-attention")]
    assert pool._one_mode() == ("own-attention",
                                "2 Ray actors, each kernels: ...; KV cells: own-attention")
    pool.actors = [Actor("own-attention"), Actor("llama.cpp")]
    with pytest.raises(NgramSpecError, match=r"different kernel modes \(llama.cpp, own-attention\)"):
        pool._one_mode()
    monkeypatch.delitem(sys.modules, "ngramspec.batch.ray_backend", raising=False)


def test_the_cost_key_names_what_the_matmul_takes():
    """A decode-cost curve learnt with the K-quant matmuls is not reused without them
    (NGRAMSPEC_OWN_KQUANT=0: the matmul hook takes Q5_0 alone, a different cost)."""
    from kernel_toggle import require
    from ngramspec.llama.kernels import matmul

    require(matmul.KERNEL)
    probe = PROBE.replace("print(json.dumps({{", "from ngramspec.speculative.cost import _kernel_key\n"
                          "print(json.dumps({{\"key\": _kernel_key(ctx), ")
    on, _ = _probe(probe_src=probe)
    off, _ = _probe(probe_src=probe, env={"NGRAMSPEC_OWN_KQUANT": "0"})
    assert ":matmul=own" in on["key"] and ":matmul=q5_0" in off["key"], (on["key"], off["key"])
    assert on["context"]["matmul"]["scope"] == "own"
    assert off["context"]["matmul"]["scope"] == "q5_0"
