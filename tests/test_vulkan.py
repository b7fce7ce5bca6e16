"""A llama.cpp build with a GPU backend (issue 43): tests/vulkan_check.sh builds
llama-cpp-python with GGML_VULKAN=ON (first run: 20-40 min on 2 cores) and runs
tests/vulkan_run.py on Mesa's software Vulkan driver: the device seen, every kernel
off with its reason, -ngl 0 spec-on == spec-off (1 and 4 slots), and -ngl 99 exact by
fixed-shape decodes: the start-up check passes, spec-on == spec-off on two fixtures at
one slot and at four slots (docs/exactness.md, "Exact decoding on a device")."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_vulkan_build_runs_exact_on_the_cpu_and_on_the_device():
    if shutil.which("apt-get") is None:
        pytest.skip("no apt-get: the check fetches Debian's Vulkan packages into a private prefix")
    p = subprocess.run(["bash", str(ROOT / "tests" / "vulkan_check.sh")], capture_output=True,
                       text=True, cwd=ROOT, timeout=4 * 3600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    report = json.loads(p.stdout.strip().splitlines()[-1])
    assert any(d["type"] != "CPU" for d in report["devices"])
    assert all(not st["active"] and "besides the CPU" in st["reason"]
               for st in report["kernels"].values())
    assert report["ngl0"]["equal"] and report["batch4"]["equal"]
    assert report["device_check"]["exact"] and report["device_check"]["rows"] >= 2
    assert all(step["equal"] for step in report["ngl99"].values()), report["ngl99"]
    assert report["padded_vs_unpadded"]["tps_fixed_shape"] > 0
