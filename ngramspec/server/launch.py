"""Start `ngramspec serve` as a subprocess on a free loopback port (tests, benchmarks)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Sequence


def status_kib(pid: int, key: str = "VmRSS") -> int:
    """A memory line of /proc/PID/status in KiB (VmRSS: resident now; VmHWM: the peak
    resident so far); 0 where it cannot be read (not Linux, process gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def pss_kib(pid: int) -> int:
    """The process's proportional set size in KiB (/proc/PID/smaps_rollup): its resident
    pages, each counted once however many of its mappings share it (a file mapped twice
    counts once, where VmRSS counts it twice), and pages shared with other processes
    (libraries) split among them; 0 where it cannot be read."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class PeakPss:
    """A thread that samples `pss_kib(pid)` every `period` seconds while the `with` block
    runs; `.mib` is the largest sample (a sampled peak: a spike shorter than the
    period can be missed, unlike VmHWM's)."""

    def __init__(self, pid: int, period: float = 0.25):
        self.pid, self.period, self.kib = pid, period, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-pss", daemon=True)

    def _run(self) -> None:
        while True:
            self.kib = max(self.kib, pss_kib(self.pid))
            if self._stop.wait(self.period):
                return

    def __enter__(self) -> "PeakPss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.kib = max(self.kib, pss_kib(self.pid))

    @property
    def mib(self) -> float:
        return self.kib / 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    port: int
    log_path: str
    health_seen: list = field(default_factory=list)  # (status, body) while waiting

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss_kib(self) -> int:
        """Resident memory of the server process (VmRSS, KiB)."""
        return status_kib(self.proc.pid)

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def get_health(url: str, timeout: float = 2.0) -> tuple[int, dict | None]:
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"null")
        except ValueError:
            return e.code, None
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return 0, None


def start_server(args: list[str], timeout: float = 120.0, env: dict | None = None,
                 log_path: str | None = None,
                 entry: Sequence[str] = ("-m", "ngramspec", "serve")) -> ServerProcess:
    """Run `python ENTRY --host 127.0.0.1 --port P ARGS` (ENTRY: `-m ngramspec serve`, or a
    script that runs it) and wait until /health is 200."""
    port = free_port()
    log_path = log_path or f"/tmp/ngramspec-serve-{port}.log"
    full_env = dict(os.environ)
    full_env.update(env or {})
    logf = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, *entry, "--host", "127.0.0.1",
                             "--port", str(port), *args], stdout=logf, stderr=subprocess.STDOUT,
                            env=full_env)
    logf.close()
    sp = ServerProcess(proc, port, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{sp.log()}")
        status, body = get_health(sp.url)
        if status:
            sp.health_seen.append((status, body))
        if status == 200:
            return sp
        time.sleep(0.05)
    sp.stop()
    raise RuntimeError(f"server not healthy after {timeout} s:\n{sp.log()}")
