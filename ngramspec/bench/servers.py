"""The server processes of `bench --parallel`: started at a row's first use, stopped
(SIGSTOP) while another row is timed, ended after their last row.

Invariant: at most one server process is runnable while a row is timed (two llama.cpp
processes on the same cores slow each other down 10-50x).
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass(frozen=True)
class Row:
    """One timed configuration: `server` in `mode` ("prompt": the prompt checks),
    served by the process named `process`: "ngramspec" (spec-off, prefill, oracle and
    prompt rows) and "llama-server:none", or, for a row that drafts from n-gram pools,
    "ngramspec#MODE@ROUND" / "llama-server:TYPE@ROUND", a process of its own (`starter`
    names what starts it)."""

    server: str
    mode: str
    process: str


def starter(process: str) -> str:
    """The key of `starters` that starts `process` (its name less "#MODE" and "@ROUND")."""
    return process.split("@")[0].split("#")[0]


def process_state(pid: int) -> str | None:
    """The process's state letter from /proc/PID/stat ("R", "S", "T" stopped, ...);
    None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def wait_stopped(pid: int, stopped: bool, timeout: float = 5.0) -> None:
    """Wait until /proc says the process is stopped (state T), or is not; signals arrive
    asynchronously. Returns at once where /proc cannot be read."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = process_state(pid)
        if state is None or (state in "Tt") == stopped:
            return
        time.sleep(0.002)


@dataclass
class Started:
    """A running server process: where it listens, its pid, how to end it."""

    url: str
    pid: int
    close: Callable[[], None]


class Servers:
    """The processes a schedule uses: each started at its first row, stopped (SIGSTOP)
    whenever another one's row runs, ended after its last row. Invariant: at most one
    of them is runnable while a row is timed."""

    def __init__(self, starters: dict[str, Callable[[], Started]], plan: list[list[Row]]):
        self.starters, self.live = starters, {}
        flat = [r.process for rows in plan for r in rows]
        self.last = {p: i for i, p in enumerate(flat)}

    def __enter__(self) -> "Servers":
        return self

    def __exit__(self, *exc) -> None:
        for name in list(self.live):
            self._end(name)

    def resume(self, name: str) -> Started:
        if name not in self.live:
            self.live[name] = self.starters[starter(name)]()
        else:
            os.kill(self.live[name].pid, signal.SIGCONT)
            wait_stopped(self.live[name].pid, False)
        return self.live[name]

    def pause(self, name: str, index: int) -> None:
        """After row `index` of the flattened schedule: end the process if that was its
        last row, else stop it until its next one (returns once it is stopped)."""
        if index >= self.last[name]:
            self._end(name)
        else:
            self.stop(name)

    def stop(self, name: str) -> None:
        """Stop a live process (SIGSTOP) until its next `resume`; returns once stopped."""
        os.kill(self.live[name].pid, signal.SIGSTOP)
        wait_stopped(self.live[name].pid, True)

    def _end(self, name: str) -> None:
        srv = self.live.pop(name)
        try:
            os.kill(srv.pid, signal.SIGCONT)  # a stopped process would not see SIGTERM
        except ProcessLookupError:
            pass
        srv.close()


def start_ngramspec(slots: int, threads: int, slot_ctx: int, model: str | None,
                    server_args: Sequence[str] = ()) -> Started:
    """`ngramspec serve -np slots` (`server_args`: the user's load, -md and spec flags)."""
    from ..server.launch import start_server

    args = ["-np", str(slots), "-c", str(slot_ctx * slots), "-t", str(threads), "--temp", "0",
            "--metrics", *server_args]
    if model:
        args += ["-m", model]
    sp = start_server(args, timeout=900)
    return Started(sp.url, sp.pid, sp.stop)


def start_llama_server(binary: str, model_path: str, spec_type: str, slots: int, threads: int,
                       slot_ctx: int, extra: Sequence[str] = ()) -> Started:
    from .peer import LlamaServerPeer

    peer = LlamaServerPeer(binary, model_path, spec_type, n_ctx=slot_ctx * slots, threads=threads,
                           extra=list(extra), n_parallel=slots).__enter__()
    return Started(peer.url, peer.proc.pid, lambda: peer.__exit__(None, None, None))
