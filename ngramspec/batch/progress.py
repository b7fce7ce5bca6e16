"""A batch job's counters, its live progress line and the summary table.

Invariants: `done + failed` counts the results of this run; `skipped` the input
records already in OUTPUT (of which `skipped_failed` were errors); with a known
`total`, remaining = total - skipped - done - failed. Rates are per wall second
of this run, from the first record pulled to now (model loading excluded).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

from .results import BatchResult
from .speed import SpeedStats
from ..speculative.stats import tokens_per_step


@dataclass
class Tally:
    total: int | None = None  # input records, when known in advance
    skipped: int = 0
    skipped_failed: int = 0
    done: int = 0
    failed: int = 0
    generated: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    predicted_ms: float = 0.0  # generation time, summed over records
    prediction_accepted: int = 0  # of drafted / accepted: a record's prediction's tokens
    prediction_rejected: int = 0
    with_prediction: int = 0  # records that drafted from a prediction
    seq_steps: float = 0.0  # per-record verify steps, summed
    after_first: int = 0  # generated tokens after each record's first (which the prompt gives)
    t0: float = field(default_factory=time.perf_counter)
    t_end: float | None = None

    def add(self, r: BatchResult) -> None:
        if r.failed:
            self.failed += 1
            return
        self.done += 1
        t = r.timings
        self.generated += t.get("predicted_n", 0)
        self.prompt_tokens += t.get("prompt_n", 0)
        self.cached_tokens += t.get("cache_n", 0)
        self.drafted += t.get("draft_n", 0)
        self.accepted += t.get("draft_n_accepted", 0)
        self.predicted_ms += t.get("predicted_ms", 0.0)
        if "prediction_n_accepted" in t:
            self.with_prediction += 1
            self.prediction_accepted += t["prediction_n_accepted"]
            self.prediction_rejected += t["prediction_n_rejected"]
        n = max(t.get("predicted_n", 0) - 1, 0)
        self.after_first += n
        if r.tokens_per_step > 0:
            self.seq_steps += n / r.tokens_per_step

    def skip(self, failed: bool) -> None:
        self.skipped += 1
        self.skipped_failed += failed

    @property
    def wall(self) -> float:
        return (self.t_end or time.perf_counter()) - self.t0

    @property
    def tok_per_s(self) -> float:
        return self.generated / self.wall if self.wall > 0 else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_step(self) -> float:
        return tokens_per_step(self.after_first, self.seq_steps)

    @property
    def remaining(self) -> int | None:
        if self.total is None:
            return None
        return max(self.total - self.skipped - self.done - self.failed, 0)

    @property
    def eta(self) -> float | None:
        finished = self.done + self.failed
        if self.remaining is None or not finished:
            return None
        return self.remaining * self.wall / finished

    @property
    def any_failed(self) -> bool:
        return bool(self.failed or self.skipped_failed)

    def line(self) -> str:
        """The progress line: done, failed, remaining, tok/s, acceptance, ETA."""
        rem = "?" if self.remaining is None else str(self.remaining)
        acc = "-" if self.acceptance is None else f"{self.acceptance:.0%}"
        eta = "-" if self.eta is None else _hms(self.eta)
        return (f"{self.done} done, {self.failed} failed, {rem} remaining · "
                f"{self.tok_per_s:.1f} tok/s · acceptance {acc} · ETA {eta}")

    def as_dict(self, speed: SpeedStats | None = None) -> dict:
        d = {k: getattr(self, k) for k in ("total", "skipped", "skipped_failed", "done", "failed",
                                            "generated", "prompt_tokens", "cached_tokens",
                                            "drafted", "accepted", "predicted_ms",
                                            "with_prediction", "prediction_accepted",
                                            "prediction_rejected", "wall", "tok_per_s",
                                            "acceptance", "tokens_per_step")}
        if speed is not None:
            d.update(verify_steps=speed.steps, undrafted_steps=speed.undrafted,
                     verify_seconds=speed.seconds, plain_seconds_estimate=speed.plain_seconds,
                     plain_priced_by_undrafted_steps=speed.plain_measured,
                     speedup_over_plain=speed.speedup)
        return d


def _hms(s: float) -> str:
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress:
    """The live line on a terminal (rich); elsewhere a plain line every `every` seconds."""

    def __init__(self, console: Console, tally: Tally, every: float = 30.0):
        self.console, self.tally, self.every = console, tally, every
        self._status = None
        self._last = time.perf_counter()

    def __enter__(self) -> "Progress":
        if self.console.is_terminal:
            self._status = self.console.status(self.tally.line())
            self._status.__enter__()
        return self

    def update(self) -> None:
        if self._status is not None:
            self._status.update(self.tally.line())
        elif time.perf_counter() - self._last >= self.every:
            self._last = time.perf_counter()
            self.console.print(f"batch: {self.tally.line()}", highlight=False)

    def __exit__(self, *exc) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)


def summary_table(t: Tally, speed: SpeedStats | None, output: str, workers: str) -> Table:
    """The table printed on stderr when the job ends."""
    tab = Table(title=f"ngramspec batch: {output}", show_header=False)
    tab.add_column("what")
    tab.add_column("value", justify="right")
    total = "?" if t.total is None else str(t.total)
    tab.add_row("records in INPUT", total)
    tab.add_row("already in OUTPUT (skipped)", f"{t.skipped} ({t.skipped_failed} failed)")
    tab.add_row("done / failed this run", f"{t.done} / {t.failed}")
    if t.remaining:
        tab.add_row("not run (re-run to resume)", str(t.remaining))
    tab.add_row("engines", workers)
    tab.add_row("generated tokens", str(t.generated))
    tab.add_row("prompt tokens (cached)", f"{t.prompt_tokens} ({t.cached_tokens})")
    tab.add_row("wall time", f"{t.wall:.1f} s")
    tab.add_row("aggregate tok/s", f"{t.tok_per_s:.1f}")
    tab.add_row("draft acceptance",
                "-" if t.acceptance is None else f"{t.acceptance:.1%} ({t.accepted}/{t.drafted})")
    if t.with_prediction:
        tab.add_row("prediction tokens accepted / rejected",
                    f"{t.prediction_accepted} / {t.prediction_rejected} "
                    f"({t.with_prediction} records)")
    tab.add_row("generation time (summed per record)", f"{t.predicted_ms / 1e3:.1f} s")
    tab.add_row("tokens per verify step", f"{t.tokens_per_step:.2f}")
    tab.add_row("speedup over plain decoding", _speedup_text(speed))
    return tab


def _speedup_text(speed: SpeedStats | None) -> str:
    if speed is None or speed.speedup is None:
        return "- (too few verify steps to measure)"
    m = speed.plain_measured
    how = (f"priced by this run's {speed.undrafted} undrafted steps" if m >= 0.9995 else
           "priced by a cost fit on this run's steps" if m == 0 else
           f"priced {m:.0%} by this run's {speed.undrafted} undrafted steps, the rest by a "
           "cost fit on its steps")
    return (f"{speed.speedup:.2f}x ({speed.seconds:.1f} s of {speed.steps} verify steps vs "
            f"{speed.plain_seconds:.1f} s plain, {how})")
