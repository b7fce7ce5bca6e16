"""A batch job over files: INPUT lines in, OUTPUT lines out, resumable.

    run_job(lines, output, output.recover(), run, tally, ordered)

`run` is a backend (`EngineRunner.run` on this machine, `RayPool.run` across
machines): items in, one BatchResult per item out, as they finish.

Invariants (with output.py and records.py): OUTPUT is repaired first; an input
item whose key is already in OUTPUT is skipped, every other item reaches the
backend once and its one result is appended the moment it arrives (or, with
`ordered`, as soon as every earlier input item's result is written). So
however often the job is killed and re-run, each input line ends up in OUTPUT
exactly once.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

from .output import OutputFile
from .progress import Tally
from .records import BadRecord, Record, parse_records, read_lines
from .results import BatchResult, in_order

Backend = Callable[[Iterable[Record | BadRecord]], Iterator[BatchResult]]


def run_job(lines: Iterable[str], output: OutputFile, done: dict[str, bool], run: Backend,
            tally: Tally, ordered: bool = False,
            on_result: Callable[[], None] = lambda: None) -> None:
    """`done`: what `output.recover()` found ({key: failed}), recovered before this call."""
    skipped: set[int] = set()

    def todo() -> Iterator[Record | BadRecord]:
        for item in parse_records(read_lines(lines)):
            failed = done.get(item.key)
            if failed is None:
                yield item
            else:
                skipped.add(item.index)
                tally.skip(failed)
                on_result()

    results = run(todo())
    if ordered:
        results = in_order(results, skipped)
    for r in results:
        output.append(r)
        tally.add(r)
        on_result()


def count_records(path: str) -> int:
    """Non-blank lines of a file (the progress total)."""
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())
