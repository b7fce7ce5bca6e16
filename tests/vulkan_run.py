#!/usr/bin/env python
"""What ngramspec does on a llama.cpp build with a GPU backend: run by
tests/vulkan_check.sh inside .venv-vulkan (llama-cpp-python built with GGML_VULKAN=ON,
Mesa's lavapipe as the only Vulkan driver). Each step runs the `ngramspec` command line,
as a user would, on the embedded model, greedy:

1. `ngramspec doctor --json`: the devices llama.cpp sees and each kernel's state;
2. `-ngl 0`, spec off and spec auto: every node on the CPU, outputs equal;
3. `-ngl 0`, `batch -np 4` of 4 documents, spec off and on: outputs equal;
4. `-ngl 99`: refused in one line (exit 2);
5. `-ngl 99 --no-batch-invariance`, spec off and on: runs on the device (reported, not
   required equal: exactness is verified on the CPU backend only).

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
PROMPT = ROOT / "ngramspec" / "bench" / "fixtures" / "prompts" / "refactor.txt"


def run(args: list[str], timeout: int = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(BIN + args, capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def generate(n: int, *extra: str) -> dict:
    p = run(["generate", "-f", str(PROMPT), "-n", str(n), "--temp", "0", "--json", *extra])
    if p.returncode != 0:
        return {"rc": p.returncode, "error": p.stderr.strip().splitlines()[-1:]}
    out = json.loads(p.stdout)
    return {"rc": 0, "content": out["content"], "tps": out["timings"]["predicted_per_second"],
            "kernels": out.get("kernels"), "notes": p.stderr.strip().splitlines()[:3]}


def batch(n: int, spec: str, folder: Path) -> dict:
    docs = folder / "docs.jsonl"
    if not docs.exists():
        text = PROMPT.read_text()
        with docs.open("w") as f:
            for i in range(4):
                f.write(json.dumps({"id": f"d{i}", "prompt": text[i * 300:] + "\n# again:\n"}) + "\n")
    out = folder / f"out-{spec}.jsonl"
    p = run(["batch", str(docs), "-o", str(out), "-np", "4", "-n", str(n), "--temp", "0",
             "--spec-type", spec, "-ngl", "0"])
    if p.returncode != 0:
        return {"rc": p.returncode, "error": p.stderr.strip().splitlines()[-1:]}
    texts = {r["id"]: r.get("text") for r in map(json.loads, out.read_text().splitlines())}
    return {"rc": 0, "texts": texts}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-predict", type=int, default=96)
    n = ap.parse_args().n_predict
    report, failed = {}, []
    p = run(["doctor", "--json"])
    doc = json.loads(p.stdout) if p.returncode == 0 else {}
    report["devices"] = doc.get("llama", {}).get("devices")
    report["kernels"] = doc.get("kernels")
    print(f"1. devices: {report['devices']}; kernels: {report['kernels']}")
    if not any(d["type"] != "CPU" for d in report["devices"] or []):
        failed.append("llama.cpp sees no device besides the CPU (no Vulkan driver?)")
    if any(st["active"] for st in (report["kernels"] or {}).values()):
        failed.append("a kernel is active beside a GPU device")

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

    p = run(["generate", "-p", "hello", "-n", "4", "-ngl", "99"])
    lines = p.stderr.strip().splitlines()
    report["ngl99"] = {"rc": p.returncode, "stderr": lines[-1:] if lines else []}
    print(f"4. -ngl 99: exit {p.returncode}: {lines[-1] if lines else ''}")
    if p.returncode != 2 or len([ln for ln in lines if ln.strip()]) != 1:
        failed.append("-ngl 99 is not refused in one line")

    m = min(n, 24)  # a software GPU is slow
    g_off = generate(m, "--spec-type", "none", "-ngl", "99", "--no-batch-invariance")
    g_on = generate(m, "--spec-type", "auto", "-ngl", "99", "--no-batch-invariance")
    report["ngl99_free"] = {"rc": [g_off["rc"], g_on["rc"]],
                            "equal": g_off.get("content") == g_on.get("content"),
                            "tps_off": g_off.get("tps"), "tps_auto": g_on.get("tps"),
                            "errors": [g_off.get("error"), g_on.get("error")]}
    print(f"5. -ngl 99 --no-batch-invariance: ran {report['ngl99_free']['rc']}, outputs equal: "
          f"{report['ngl99_free']['equal']} (not required)")
    report["failed"] = failed
    print(json.dumps(report))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
