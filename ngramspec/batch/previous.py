"""An earlier run's results as this run's predictions (`ngramspec batch --previous FILE`).

A pipeline is re-run after its inputs change a little; for each record, the text an
earlier run gave its id is then the best draft there is. `load_previous` reads
results files (OUTPUT of earlier runs) into {record key: text}; `with_previous`
gives each record without a `prediction` of its own the text of its key.

Invariants:
- Only successful results count (no `error`, a string `text`, a non-empty text);
  when several files hold an id, the file given last wins; a record's own
  `prediction` wins over all of them.
- A prediction only chooses which tokens are verified (drafters/prediction.py), so
  every output is the one a run without it gives.
- A results file may end in a truncated line (a killed run): that line is passed
  over. Any other line that is not a result is an error naming the file and line.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Iterator, Sequence

from ..errors import ConfigError
from .output import result_line
from .records import BadRecord, Record
from .results import key_of


def load_previous(paths: Sequence[str]) -> dict[str, str]:
    """{record key: text} of the successful results in `paths`, later files winning."""
    texts: dict[str, str] = {}
    for path in paths:
        try:
            f = open(path, "rb")
        except OSError as e:
            raise ConfigError(f"--previous {path}: {e.strerror}") from None
        with f:
            for n, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                obj = result_line(raw)
                if obj is None:
                    if raw.endswith(b"\n") or f.read().strip():
                        raise ConfigError(f"--previous {path}: line {n} is not a batch result")
                    break  # a truncated last line
                text = obj.get("text")
                if "error" not in obj and isinstance(text, str) and text:
                    texts[key_of(obj)] = text
    return texts


def with_previous(items: Iterable[Record | BadRecord],
                  texts: dict[str, str]) -> Iterator[Record | BadRecord]:
    """`items`, each record without a prediction given the earlier text of its key."""
    for item in items:
        if isinstance(item, Record) and item.body.prediction is None:
            text = texts.get(item.key)
            if text is not None:
                item = replace(item, body=item.body.model_copy(update={"prediction": text}))
        yield item
