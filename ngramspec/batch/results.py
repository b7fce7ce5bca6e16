"""One output line of a batch job, and how an OUTPUT line is read back.

Invariants: `BatchResult.to_json()` and `key_of()` agree: the key of a result
written to OUTPUT is the key of the input item it came from (`records.py`), so a
re-run skips exactly the items already written. A result has `error` set or a
`finish_reason`, never both.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Container, Iterable, Iterator

from ..errors import error_fields
from .records import BadRecord, Record, id_key, line_key


@dataclass
class BatchResult:
    """What became of one input item (an output line)."""

    id: Any
    line: int
    index: int
    text: str = ""
    finish_reason: str | None = None
    timings: dict = field(default_factory=dict)
    tokens_per_step: float = 0.0
    error: dict | None = None  # {"type", "message"}

    @property
    def key(self) -> str:
        return id_key(self.id) if self.id is not None else line_key(self.line)

    @property
    def failed(self) -> bool:
        return self.error is not None

    @classmethod
    def failure(cls, item: Record | BadRecord, type: str, message: str) -> "BatchResult":
        return cls(item.id, item.line, item.index, error={"type": type, "message": message})

    @classmethod
    def from_exception(cls, item: Record | BadRecord, exc: BaseException) -> "BatchResult":
        """The record failed on `exc`; the error type is llama-server's for it."""
        fields = error_fields(exc)
        if fields is None:  # a bug: reported, the job goes on
            return cls.failure(item, "server_error", f"internal error: {type(exc).__name__}: {exc}")
        return cls.failure(item, fields["type"], fields["message"])

    @classmethod
    def bad(cls, item: BadRecord) -> "BatchResult":
        return cls.failure(item, item.type, item.message)

    def to_json(self) -> dict:
        out = {"id": self.id, "line": self.line, "text": self.text,
               "finish_reason": self.finish_reason, "timings": self.timings,
               "tokens_per_step": round(self.tokens_per_step, 4)}
        if self.error is not None:
            out["error"] = self.error
        return out


def key_of(obj: dict) -> str:
    """The key of an OUTPUT line (see `records.py`)."""
    rid = obj.get("id")
    return id_key(rid) if rid is not None else line_key(int(obj["line"]))


def in_order(results: Iterable[BatchResult], skipped: Container[int] = ()) -> Iterator[BatchResult]:
    """`results` re-ordered by input index (`--ordered`). Indices in `skipped` (records
    already in OUTPUT) never come and are passed over. Every input index below a
    result's has been pulled before that result exists, so `skipped` may grow while
    this runs."""
    held: dict[int, BatchResult] = {}
    nxt = 0
    for r in results:
        held[r.index] = r
        while True:
            while nxt in skipped:
                nxt += 1
            if nxt not in held:
                break
            yield held.pop(nxt)
            nxt += 1
    yield from (held[i] for i in sorted(held))  # only if the source stopped early
