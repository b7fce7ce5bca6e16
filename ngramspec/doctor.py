"""`ngramspec doctor`: what a bug report needs, as `vllm collect-env` gives it.

The llama.cpp build (llama-cpp-python and ggml versions, build flags, devices), the CPU
and its flags, each kernel of ngramspec's own (active or not, and why: first for the
process, then in a context of the model), the cache and slot folders, and the
environment variables that change what runs. `--json` prints one object whose
`kernels` member maps each kernel to {"active": bool, "reason": str}.

Invariant: it changes nothing but, with --rebuild, the kernels' compiled files; a model
that cannot be loaded leaves the process-level states, with the reason, not a crash.
"""
from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

import click

#: CPU flags that decide which kernels (ours and llama.cpp's) can run
CPU_FLAGS = ("avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl",
             "avx512dq", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8",
             "amx_bf16", "neon", "asimd", "sve")
ENV_VARS = ("NGRAMSPEC_OWN_HEAD", "NGRAMSPEC_OWN_ATTENTION", "NGRAMSPEC_OWN_MATMUL",
            "NGRAMSPEC_CACHE_DIR", "NGRAMSPEC_CMAKE_ARGS", "GGML_CPU_TILED_MM", "CC",
            "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "OPENBLAS_CORETYPE")


def cpu() -> dict:
    """The CPU's model name, architecture, cores and the flags of CPU_FLAGS it has."""
    from .llama.host import cpu_flags

    name = ""
    try:
        name = next((ln.split(":", 1)[1].strip() for ln in
                     Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
                     if ln.startswith("model name")), "")
    except OSError:
        pass
    have = cpu_flags()
    return {"model": name or platform.processor(), "machine": platform.machine(),
            "cores": os.cpu_count(), "flags": [f for f in CPU_FLAGS if f in have]}


def llama() -> dict:
    """llama-cpp-python's version, ggml's, the build's system info and the devices."""
    import llama_cpp

    from .llama.kernels import ggml, guard

    return {"llama_cpp_python": getattr(llama_cpp, "__version__", "?"), "ggml": ggml.version(),
            "verified": f"llama-cpp-python {guard.VERIFIED_LLAMA_CPP}, ggml {guard.VERIFIED_GGML}",
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
            "devices": [{"name": n, "type": t} for n, t in guard.devices()]}


def kernels_report(model_path: str | None) -> tuple[dict, dict]:
    """(each kernel's state, what a context of the model said): the process-level
    state, refined by a batch-invariant context of the model where one can be made."""
    from .llama import kernels
    from .llama.kernels import build

    procs = kernels.states()
    for k in kernels.KERNELS:
        st = procs[k.name]
        st["library"] = build.library(k.source, st["variant"]).path if st["active"] else ""
        st["variants"] = {"has": list(k.variants), "cpu_runs": k.candidates()}
    context = {"model": model_path or "(embedded)", "error": None, "cell_mode": None}
    try:
        from .llama.context import Context, ContextParams
        from .llama.model import Model

        m = Model(model_path)
        ctx = Context(m, ContextParams(n_ctx=512, n_batch=64))
        for name, st in ctx.kernels.state().items():
            procs[name].update(st)
        context["cell_mode"] = ctx.kernels.cell_mode
        ctx.close()
        m.close()
    except Exception as e:  # a report, not a crash: the process-level states stand
        context["error"] = f"{type(e).__name__}: {e}"
    return procs, context


def device_report(model_path: str | None) -> dict:
    """Exact decoding on a device (llama/fixed_shape.py): where llama.cpp has a device
    besides the CPU, the start-up check of a fixed-shape context with every layer on it
    (-ngl all), its result and shape; else why there is nothing to check."""
    from .llama.kernels import guard

    other = [n for n, t in guard.devices() if t != "CPU"]
    out = {"devices": other, "ngl": "all", "rows": None, "exact": None, "reason": None}
    if not other:
        out["reason"] = "no device besides the CPU: -ngl has nothing to offload"
        return out
    try:
        from .llama.context import ContextParams
        from .llama.fixed_shape import FixedShapeContext
        from .llama.model import Model

        m = Model(model_path, n_gpu_layers=-1)
        try:
            ctx = FixedShapeContext(m, ContextParams(n_ctx=512, flash_attn=None))
            check = ctx.self_check()
            ctx.close()
        finally:
            m.close()
        out.update(rows=check.rows, exact=check.passed, reason=check.reason,
                   max_diff=check.max_diff, seconds=round(check.seconds, 3))
    except Exception as e:  # a report, not a crash
        out["reason"] = f"{type(e).__name__}: {e}"
    return out


def drafting() -> dict:
    """The drafters' C loops (speculative/native.py): loaded, or why the Python
    reference runs."""
    from .speculative import native

    loaded = native.kernel() is not None
    return {"native": loaded, "reason": "compiled and loaded" if loaded else native.reason()}


def paths(slot_save_path: str | None) -> dict:
    """The cache folder (cost curves, compiled kernels, remembered failures) and the
    slot folder, each with whether it can be written."""
    from .llama.kernels import build
    from .settings.paths import cache_dir

    def where(p: Path | None) -> dict | None:
        if p is None:
            return None
        return {"path": str(p), "exists": p.is_dir(), "writable": os.access(p, os.W_OK)}

    native = cache_dir() / "native"
    failed = sorted(str(f) for f in native.glob("*.failed")) if native.is_dir() else []
    return {"cache": where(cache_dir()), "kernels": where(native), "failed_builds": failed,
            "compiler": build.compiler(),
            "slots": where(Path(slot_save_path)) if slot_save_path else None}


def collect(model_path: str | None, slot_save_path: str | None) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("ngramspec")
    except PackageNotFoundError:
        ours = "?"
    report = {"ngramspec": ours, "python": sys.version.split()[0],
              "platform": platform.platform(), "cpu": cpu(), "llama": llama()}
    report["kernels"], report["context"] = kernels_report(model_path)
    report["drafting"] = drafting()
    report["device"] = device_report(model_path)
    report["paths"] = paths(slot_save_path)
    report["env"] = {k: os.environ[k] for k in ENV_VARS if k in os.environ}
    return report


@click.command()
@click.option("-m", "--model", "model_path", default=None, help="GGUF to check the kernels on "
              "(default: the embedded model)")
@click.option("--slot-save-path", default=None, help="the folder serve would keep slots in")
@click.option("--rebuild", is_flag=True, help="compile the kernels again first (also after a "
              "remembered failure)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def doctor(model_path, slot_save_path, rebuild, as_json) -> None:
    """Print what a bug report needs: llama.cpp build, CPU, kernels and why, paths."""
    from .llama.kernels import KERNELS, build

    if rebuild:
        for k in KERNELS:
            for variant in k.candidates():
                build.library(k.source, variant, force=True)
    report = collect(model_path, slot_save_path)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    for line in text(report):
        click.echo(line)


def text(r: dict) -> list[str]:
    """The report as lines for a terminal."""
    lines = [f"ngramspec {r['ngramspec']}, Python {r['python']}, {r['platform']}",
             f"CPU: {r['cpu']['model']} ({r['cpu']['machine']}, {r['cpu']['cores']} cores); "
             f"flags: {' '.join(r['cpu']['flags']) or 'none of note'}",
             f"llama-cpp-python {r['llama']['llama_cpp_python']}, ggml {r['llama']['ggml']} "
             f"(kernels verified with {r['llama']['verified']})",
             f"build: {r['llama']['system_info']}",
             "devices: " + ", ".join(f"{d['name']} ({d['type']})" for d in r["llama"]["devices"])]
    ctx = r["context"]
    lines.append(f"kernels (checked in a context of {ctx['model']}" +
                 (f"; it failed: {ctx['error']})" if ctx["error"] else
                  f"; KV cells: {ctx['cell_mode']})") + ":")
    for name, st in r["kernels"].items():
        lines.append(f"  {name:<9} {'active [' + st['variant'] + ']' if st['active'] else 'inactive'}"
                     f": {st['reason']} (variants: {', '.join(st['variants']['has'])}; this "
                     f"CPU runs {', '.join(st['variants']['cpu_runs']) or 'none'})"
                     + (f"; one-row decodes: {st['one_row']}" if st.get("one_row") else ""))
    lines.append(f"drafting loops: {'C' if r['drafting']['native'] else 'Python'} "
                 f"({r['drafting']['reason']})")
    d = r["device"]
    lines.append("exact on a device: " + (
        d["reason"] if d["exact"] is None else
        f"{'yes' if d['exact'] else 'no'}, -ngl {d['ngl']} on {', '.join(d['devices'])} in "
        f"{d['rows']}-row decodes: {d['reason']}"))
    p = r["paths"]
    for key in ("cache", "kernels", "slots"):
        if p[key]:
            lines.append(f"{key} folder: {p[key]['path']}"
                         + ("" if p[key]["writable"] else " (not writable)"))
    lines += [f"remembered failed build: {f}" for f in p["failed_builds"]]
    lines += [f"{k}={v}" for k, v in r["env"].items()]
    return lines


def measured_on() -> dict:
    """The CPU, its flags and the kernel variants this process's models run (the same
    machine and environment as a bench's servers), for every bench figure."""
    import llama_cpp  # noqa: F401  (the kernels' guard reads ggml's libraries)

    from .llama import kernels
    from .llama.kernels.matmul import kquants_on

    states = kernels.states()
    kq_off = not kquants_on()
    return {"cpu": cpu(), "kernels": ", ".join(
        (f"{n} {st['variant']}" + (" (Q5_0 only)" if n == "matmul" and kq_off else ""))
        if st["active"] else f"{n} off" for n, st in states.items())}


def measured_on_line(where: dict) -> str:
    c = where["cpu"]
    return (f"measured on: {c['model']} ({c['machine']}, {c['cores']} cores; "
            f"{' '.join(c['flags'])}); ngramspec kernels: {where['kernels']}")
