"""OUTPUT of a batch job: a JSONL file that is only ever appended to.

Invariants:
- Each result is one line, written with a single `os.write` on an O_APPEND
  descriptor the moment the record finishes, so a killed job (even SIGKILL)
  leaves every finished record in OUTPUT and at most one truncated last line.
- `recover()` runs before anything is appended: a last line without its newline
  or that is not JSON is cut off (that record runs again); every complete line
  before it must be a result, else OUTPUT is refused untouched (it is not ours,
  or it was edited). The keys of the lines kept are the records done.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import ConfigError
from .results import BatchResult, key_of


class OutputFile:
    def __init__(self, path: str):
        self.path = Path(path)
        self.repaired_bytes = 0  # size of the truncated line cut off by recover()
        self._fd: int | None = None

    def recover(self) -> dict[str, bool]:
        """Repair a truncated last line; {key: failed} of the results already in OUTPUT."""
        if not self.path.exists():
            return {}
        done: dict[str, bool] = {}
        pos, cut = 0, None
        with open(self.path, "rb") as f:
            for n, raw in enumerate(f, 1):
                obj = result_line(raw) if raw.endswith(b"\n") else None
                if obj is None:
                    if raw.endswith(b"\n") and f.read().strip():
                        raise ConfigError(f"{self.path}: line {n} is not a batch result; not "
                                          "appending to this file")
                    cut = pos
                    break
                done[key_of(obj)] = "error" in obj
                pos += len(raw)
        if cut is not None:
            self._truncate(cut)
        return done

    def _truncate(self, size: int) -> None:
        with open(self.path, "r+b") as f:
            self.repaired_bytes = f.seek(0, os.SEEK_END) - size
            f.truncate(size)

    def append(self, result: BatchResult) -> None:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        data = (json.dumps(result.to_json(), ensure_ascii=False) + "\n").encode()
        view = memoryview(data)
        while view:  # a regular file takes it in one write; loop only on a short write
            view = view[os.write(self._fd, view):]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def result_line(line: bytes) -> dict | None:
    """The JSON object of an OUTPUT line, or None if it is not a result."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict) or "line" not in obj or "id" not in obj:
        return None
    return obj
