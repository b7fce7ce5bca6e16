#!/usr/bin/env python
"""What ngramspec does on a llama.cpp build with a GPU backend: run by
tests/vulkan_check.sh inside .venv-vulkan (llama-cpp-python built with GGML_VULKAN=ON,
Mesa's lavapipe as the only Vulkan driver). Each step runs the `ngramspec` command line,
as a user would, greedy:

1. `ngramspec doctor --json`: the devices llama.cpp sees, each kernel's state, and the
   fixed-shape start-up check with every layer on the device (it must pass);
2. `-ngl 0` (the embedded model), spec off and spec auto: every node on the CPU, outputs equal;
3. `-ngl 0`, `batch -np 4` of 4 documents, spec off and on: outputs equal;
4. `-ngl 99` exact (fixed-shape decodes, llama/fixed_shape.py; the fast model, since a
   software GPU is slow), spec off and auto on two fixtures at one slot, and `batch
   -np 4` of 4 documents: outputs equal;
5. spec-off tok/s at `-ngl 99` in fixed-shape decodes against llama.cpp's own unpadded
   decode (`--no-batch-invariance`).

Prints one line a step and, last, one JSON object; exit 1 if a requirement fails.

    bash tests/vulkan_check.sh [--n-predict N]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = [sys.executable, "-m", "ngramspec"]
PROMPTS = ROOT / "ngramspec" / "bench" / "fixtures" / "prompts"
PROMPT = PROMPTS / "refactor.txt"
#: the fast model scripts/setup.sh makes in the main venv (tests/fast_model.py)
FAST = ROOT / ".venv" / "share" / "smollm2" / "SmolLM2-135M-4blocks.Q4_1.gguf"


def run(args: list[str], timeout: int = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(BIN + args, capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def generate(n: int, *extra: str, prompt: Path = PROMPT) -> dict:
    p = run(["generate", "-f", str(prompt), "-n", str(n), "--temp", "0", "--json", *extra])
    if p.returncode != 0:
        return {"rc": p.returncode, "error": p.stderr.strip().splitlines()[-1:]}
    out = json.loads(p.stdout)
    return {"rc": 0, "content": out["content"], "tps": out["timings"]["predicted_per_second"],
            "kernels": out.get("kernels"), "notes": p.stderr.strip().splitlines()[:3]}


def batch(n: int, spec: str, folder: Path, *extra: str) -> dict:
    docs = folder / "docs.jsonl"
    if not docs.exists():
        text = PROMPT.read_text()
        with docs.open("w") as f:
            for i in range(4):
                f.write(json.dumps({"id": f"d{i}", "prompt": text[i * 300:] + "\n# again:\n"}) + "\n")
    out = folder / f"out-{spec}-{'device' if extra else 'cpu'}.jsonl"
    p = run(["batch", str(docs), "-o", str(out), "-np", "4", "-n", str(n), "--temp", "0",
             "--spec-type", spec, *(extra or ("-ngl", "0"))])
    if p.returncode != 0:
        return {"rc": p.returncode, "error": p.stderr.strip().splitlines()[-1:]}
    texts = {r["id"]: r.get("text") for r in map(json.loads, out.read_text().splitlines())}
    return {"rc": 0, "texts": texts}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-predict", type=int, default=96)
    n = ap.parse_args().n_predict
    report, failed = {}, []
    p = run(["doctor", "--json", "-m", str(FAST)])
    doc = json.loads(p.stdout) if p.returncode == 0 else {}
    report["devices"] = doc.get("llama", {}).get("devices")
    report["kernels"] = doc.get("kernels")
    report["device_check"] = doc.get("device")
    print(f"1. devices: {report['devices']}; kernels: {report['kernels']}; "
          f"fixed-shape check: {report['device_check']}")
    if not any(d["type"] != "CPU" for d in report["devices"] or []):
        failed.append("llama.cpp sees no device besides the CPU (no Vulkan driver?)")
    if any(st["active"] for st in (report["kernels"] or {}).values()):
        failed.append("a kernel is active beside a GPU device")
    if not (report["device_check"] or {}).get("exact"):
        failed.append("the fixed-shape start-up check did not pass on the device")

    off, auto = generate(n, "--spec-type", "none", "-ngl", "0"), generate(n, "--spec-type", "auto", "-ngl", "0")
    report["ngl0"] = {"equal": off.get("content") == auto.get("content") and off["rc"] == 0,
                      "tps_off": off.get("tps"), "tps_auto": auto.get("tps"),
                      "notes": auto.get("notes"), "errors": [off.get("error"), auto.get("error")]}
    print(f"2. -ngl 0: spec-on output equals spec-off: {report['ngl0']['equal']} "
          f"({off.get('tps')} / {auto.get('tps')} tok/s); notes: {auto.get('notes')}")
    if not report["ngl0"]["equal"]:
        failed.append("-ngl 0: spec-on output differs from spec-off")

    with tempfile.TemporaryDirectory() as tmp:
        b_off, b_on = batch(n, "none", Path(tmp)), batch(n, "auto", Path(tmp))
        report["batch4"] = {"equal": b_off.get("texts") == b_on.get("texts") and b_off["rc"] == 0,
                            "errors": [b_off.get("error"), b_on.get("error")]}
        print(f"3. -ngl 0, batch -np 4: spec-on outputs equal spec-off: {report['batch4']['equal']}")
        if not report["batch4"]["equal"]:
            failed.append("-ngl 0, 4 slots: spec-on outputs differ from spec-off")
        failed += device_steps(report, min(n, 32), Path(tmp))
    report["failed"] = failed
    print(json.dumps(report))
    return 1 if failed else 0


def device_steps(report: dict, m: int, tmp: Path) -> list[str]:
    """Steps 4 and 5: -ngl 99 exact by fixed-shape decodes, on the fast model."""
    failed = []
    fast = ("-m", str(FAST), "-c", "1024", "-ngl", "99")
    report["ngl99"] = {}
    for name in ("story", "refactor"):
        prompt = PROMPTS / f"{name}.txt"
        off = generate(m, "--spec-type", "none", *fast, prompt=prompt)
        on = generate(m, "--spec-type", "auto", *fast, prompt=prompt)
        report["ngl99"][name] = {"equal": off["rc"] == 0 and off.get("content") == on.get("content"),
                                 "tps_off": off.get("tps"), "tps_auto": on.get("tps"),
                                 "notes": off.get("notes"), "errors": [off.get("error"), on.get("error")]}
        if not report["ngl99"][name]["equal"]:
            failed.append(f"-ngl 99, {name}: spec-on output differs from spec-off")
    b_off = batch(m, "none", tmp, "-m", str(FAST), "-c", "4096", "-ngl", "99")
    b_on = batch(m, "auto", tmp, "-m", str(FAST), "-c", "4096", "-ngl", "99")
    report["ngl99"]["batch4"] = {"equal": b_off["rc"] == 0 and b_off.get("texts") == b_on.get("texts"),
                                 "errors": [b_off.get("error"), b_on.get("error")]}
    if not report["ngl99"]["batch4"]["equal"]:
        failed.append("-ngl 99, 4 slots: spec-on outputs differ from spec-off")
    print(f"4. -ngl 99 in fixed-shape decodes: spec-on equals spec-off: "
          f"{ {k: v['equal'] for k, v in report['ngl99'].items()} }")
    free = generate(m, "--spec-type", "none", *fast, "--no-batch-invariance",
                    prompt=PROMPTS / "story.txt")
    report["padded_vs_unpadded"] = {"tps_fixed_shape": report["ngl99"]["story"]["tps_off"],
                                    "tps_unpadded": free.get("tps")}
    print(f"5. spec-off tok/s at -ngl 99: fixed shape {report['ngl99']['story']['tps_off']}, "
          f"llama.cpp's unpadded decode {free.get('tps')}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
