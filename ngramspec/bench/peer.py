"""Run the C++ llama-server on the same prompts, for side-by-side benchmarks.

`LlamaServerPeer` starts the binary on a free loopback port with one spec type,
waits for /health, sends /completion requests (greedy, no prompt cache) and
returns llama.cpp's `timings`. stdlib only (urllib, subprocess).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..errors import NgramSpecError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServerPeer:
    """A llama-server subprocess with one speculation setting (a context manager)."""

    def __init__(self, binary: str, model: str, spec_type: str, n_ctx: int = 4096,
                 threads: int = 2, extra: list[str] | None = None, timeout_s: float = 180,
                 n_parallel: int = 1):
        if not Path(binary).is_file() or not os.access(binary, os.X_OK):
            raise NgramSpecError(f"--llama-server {binary} is not an executable file; "
                                 "docs/benchmarks.md says how to build one")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(self.port),
                    "-c", str(n_ctx), "-t", str(threads), "-tb", str(threads), "-np", str(n_parallel),
                    "--no-warmup"] + ([] if spec_type == "none" else ["--spec-type", spec_type])
        self.cmd += extra or []
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "LlamaServerPeer":
        # its log goes to a file: a pipe nobody reads would stop the server once full
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + self.timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                err = self.log.read().decode(errors="replace")[-800:]
                raise NgramSpecError(f"llama-server exited with {self.proc.returncode}: {err}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.__exit__(None, None, None)
        raise NgramSpecError(f"llama-server did not become healthy in {self.timeout_s:.0f} s")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc is not None:
            self.log.close()
        self.proc = None

    def complete(self, prompt: str, n_predict: int) -> dict:
        """POST /completion greedily; return the response JSON (with `timings`)."""
        body = json.dumps({"prompt": prompt, "n_predict": n_predict, "temperature": 0.0,
                           "top_k": 1, "cache_prompt": False, "seed": 0}).encode()
        req = urllib.request.Request(self.url + "/completion", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())
