"""Input records of a batch job: JSONL lines -> validated `Record`s or `BadRecord`s.

A record is `{"id": ..., "prompt": "..."}` or `{"id": ..., "messages": [...]}` with
optional per-record overrides (`n_predict`, `temperature`, `seed`, `stop`,
`grammar` or `json_schema`, `speculative`, `prediction`, and llama-server's other samplers:
`jobs.types.OtherSamplers`); any other key is refused, so a typo never silently
falls back to a default.

Invariants:
- Every non-blank input line becomes exactly one item, numbered `index` 0, 1, ...
  in input order (`line` is its 1-based line number); blank lines are no records.
- An item's `key` names it in OUTPUT: `id:<json of the id>` when the line is run
  under its id, `line:<n>` when the line has no usable id of its own (malformed
  JSON, a missing id, a duplicate of an earlier line's id). So an id appears in
  OUTPUT at most once, and every input line maps to exactly one key.
- The first line with an id owns it; later lines with the same id are
  `duplicate_id` errors, whether or not the first one runs in this invocation.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from pydantic import ConfigDict, Field, StrictInt, StrictStr, ValidationError

from ..settings import strict_json
from ..errors import ConfigError, validation_message
from ..jobs.build import one_grammar
from ..jobs.types import ChatMessage, Int32, OtherSamplers, Prediction, SpeculativeParams


class RecordBody(OtherSamplers):
    """The fields a record may carry (validated; unknown keys are errors), llama-server's
    other samplers included."""

    model_config = ConfigDict(extra="forbid")
    id: StrictStr | StrictInt
    prompt: StrictStr | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    n_predict: Int32 | None = Field(None, ge=-1)
    temperature: float | None = Field(None, ge=0.0, allow_inf_nan=False)
    seed: StrictInt | None = Field(None, ge=-1, le=0xFFFFFFFF)
    stop: StrictStr | list[StrictStr] | None = None
    grammar: StrictStr | None = None
    json_schema: dict[str, Any] | None = None
    speculative: SpeculativeParams | None = None
    # the output expected (an earlier run's text): drafted first; as OpenAI's object too
    prediction: StrictStr | Prediction | None = None

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


def id_key(record_id: Any) -> str:
    return "id:" + json.dumps(record_id)


def line_key(line: int) -> str:
    return f"line:{line}"


@dataclass
class Record:
    """A valid record, ready for an engine."""

    index: int
    line: int
    body: RecordBody

    @property
    def id(self) -> Any:
        return self.body.id

    @property
    def key(self) -> str:
        return id_key(self.body.id)


@dataclass
class BadRecord:
    """An input line that cannot run; it becomes an error line in OUTPUT."""

    index: int
    line: int
    id: Any  # None when the line has no id of its own (see `key`)
    type: str  # malformed_json | missing_id | duplicate_id | invalid_request_error
    message: str

    @property
    def key(self) -> str:
        return id_key(self.id) if self.id is not None else line_key(self.line)


def read_lines(stream: Iterable[str]) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of every non-blank line."""
    for n, text in enumerate(stream, 1):
        if text.strip():
            yield n, text


def parse_records(items: Iterable[tuple[int, Any]]) -> Iterator[Record | BadRecord]:
    """(line, JSON text or already-decoded object) -> Record | BadRecord, in order."""
    owner: dict[str, int] = {}  # id key -> line that owns it
    for index, (line, raw) in enumerate(items):
        yield _parse_one(index, line, raw, owner)


def _parse_one(index: int, line: int, raw: Any, owner: dict[str, int]) -> Record | BadRecord:
    def bad(kind: str, message: str, rid: Any = None) -> BadRecord:
        return BadRecord(index, line, rid, kind, message)

    obj = raw
    try:
        if isinstance(raw, (str, bytes)):
            obj = strict_json.loads(raw, f"JSON on line {line}")
        else:
            strict_json.check_depth(raw, f"record on line {line}")
    except ConfigError as e:
        return bad("malformed_json", str(e))
    if not isinstance(obj, dict):
        return bad("malformed_json", f"line {line} is not a JSON object")
    rid = obj.get("id")
    if rid is None:
        return bad("missing_id", f"line {line} has no 'id'")
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        return bad("missing_id", f"line {line}: 'id' must be a string or an integer, got "
                                 f"{json.dumps(rid)[:60]}")
    key = id_key(rid)
    if key in owner:
        return bad("duplicate_id", f"line {line}: id {json.dumps(rid)} is already used by "
                                   f"line {owner[key]}")
    owner[key] = line
    try:
        body = RecordBody.model_validate(obj)
    except ValidationError as e:
        return bad("invalid_request_error", validation_message(list(e.errors())), rid)
    if (body.prompt is None) == (body.messages is None):
        return bad("invalid_request_error", "a record needs exactly one of 'prompt' and "
                                            "'messages'", rid)
    try:
        one_grammar(body)
    except ConfigError as e:
        return bad("invalid_request_error", str(e), rid)
    return Record(index, line, body)
