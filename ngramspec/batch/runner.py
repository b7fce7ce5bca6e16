"""Records through one engine: the server's in-process Scheduler, no HTTP.

`EngineRunner.run(items)` is a generator: it pulls items lazily, keeps at most
`inflight` records submitted (every slot busy plus as many waiting, so a slot
that frees up is refilled within the same scheduler turn), and yields a
`BatchResult` for every item as it finishes, in completion order.

Invariants:
- Every item pulled yields exactly one result: a `BadRecord` its error at once;
  a record that cannot be prepared (prompt over the slot's context, bad
  parameter) an error; a submitted record its text or its error event.
- A record runs exactly as a server request with the same fields would (same
  Scheduler, same Generation path), so greedy output does not depend on which
  slot ran it or what ran beside it.
- If the consumer stops early, the records still running are cancelled.
"""
from __future__ import annotations

import queue
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from ..errors import ConfigError
from ..settings.sampling import SamplingParams
from ..jobs.chat import chat_prompt
from ..jobs.build import JobDefaults, build_job, request_sampling
from ..jobs.scheduler import Event, Job, Scheduler
from ..speculative.stats import calibration_line
from .records import BadRecord, Record
from .results import BatchResult
from .speed import SpeedStats, StepTimer

UNBOUNDED = 1 << 30  # the runner bounds what it submits; concurrent `run` calls add up


@dataclass(frozen=True)
class Defaults:
    """What a record gets for a field it does not set (the command's flags)."""

    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    n_predict: int = 256  # -1: until end of text or the slot is full
    cache_prompt: bool = True


@dataclass
class _Running:
    record: Record
    parts: list[str] = field(default_factory=list)


class EngineRunner:
    """One engine with `n_slots` slots and its scheduler thread."""

    def __init__(self, engine, n_slots: int, defaults: Defaults = Defaults()):
        n_seq = engine.ctx.params.n_seq_max
        if not 1 <= n_slots <= n_seq:
            raise ConfigError(f"parallel must be between 1 and the engine's {n_seq} sequences, "
                              f"got {n_slots}")
        self.engine, self.defaults = engine, defaults
        self.timer = StepTimer(engine)
        self.n_ctx_slot = engine.ctx.n_ctx_seq
        self.inflight = 2 * n_slots  # per `run` call; the scheduler's queue is unbounded
        self.scheduler = Scheduler(self.timer, n_slots, UNBOUNDED, self.n_ctx_slot)
        self.scheduler.start()

    @classmethod
    def load(cls, settings, defaults: Defaults = Defaults(),
             notify: Callable[[str], None] = lambda line: None) -> "EngineRunner":
        """Load the engine of `settings` (settings/engine.EngineSettings); its n_seq sequences
        are the slots."""
        from ..engine.runtime import load_engine

        return cls(load_engine(settings, notify), settings.n_seq, defaults)

    def close(self) -> None:
        self.scheduler.shutdown()

    def describe(self) -> str:
        cal = self.engine.calibration
        return (f"1 engine, {len(self.scheduler.slots)} slots, "
                f"{self.engine.ctx.params.n_threads} thread(s)"
                + (f"; {calibration_line(cal)}" if cal is not None else ""))

    def speed(self) -> SpeedStats:
        return self.timer.summary()

    def run(self, items: Iterable[Record | BadRecord]) -> Iterator[BatchResult]:
        """A result per item, as each finishes (see the module docstring)."""
        events: queue.Queue = queue.Queue()
        live: dict[int, tuple[Job, _Running]] = {}
        source, more = iter(items), True
        try:
            while True:
                while more and len(live) < self.inflight:
                    item = next(source, None)
                    if item is None:
                        more = False
                    elif isinstance(item, BadRecord):
                        yield BatchResult.bad(item)
                    else:
                        running = _Running(item)
                        try:
                            job = self._job(item, running, events)
                        except Exception as e:
                            yield BatchResult.from_exception(item, e)
                            continue
                        live[job.id] = (job, running)
                        self.scheduler.submit(job)
                if not live:
                    return
                job_id, ev = events.get()
                if job_id in live:  # always: a job sends one final event, then nothing
                    yield self._result(live.pop(job_id)[1], ev)
        finally:
            for job, _ in live.values():
                self.scheduler.cancel(job)

    @staticmethod
    def _sink(run: _Running, events: queue.Queue, job_id: int):
        """The job's sink (scheduler thread): text deltas are kept in `run.parts`;
        only the final event crosses to the consumer's thread, so the consumer
        wakes once per record, not once per step."""
        def sink(ev: Event) -> None:
            run.parts.append(ev.text)
            if ev.final:
                events.put((job_id, ev))
        return sink

    @staticmethod
    def _result(run: _Running, ev: Event) -> BatchResult:
        """A record's result from its final event (every delta is in `run.parts`)."""
        rec, r = run.record, ev.response
        if ev.error is not None:
            return BatchResult.from_exception(rec, ev.error)
        return BatchResult(rec.id, rec.line, rec.index, "".join(run.parts), r.finish_reason,
                           r.timings(), r.tokens_per_step)

    def _job(self, rec: Record, run: _Running, events: queue.Queue) -> Job:
        """The scheduler job of a record (raises what is wrong with it): the server's
        path (`jobs.build.build_job`) with the command's defaults."""
        b, model = rec.body, self.engine.model
        text = chat_prompt(model, b.messages) if b.messages is not None else b.prompt
        if not text:
            raise ConfigError("the prompt is empty")
        tokens = model.tokenize(text, add_special=True, parse_special=True)
        defaults = JobDefaults(self.n_ctx_slot, self.defaults.n_predict, self.engine.spec,
                               self.defaults.cache_prompt)
        job = build_job(self.engine, defaults, b, tokens, lambda: self._sampling(b),
                        lambda ev: None, n_predict=b.n_predict)
        job.sink = self._sink(run, events, job.id)
        return job

    def _sampling(self, b) -> SamplingParams:
        """`request_sampling` (jobs/build.py): the server's builder, on a record."""
        return request_sampling(self.defaults.sampling, b, self.n_ctx_slot)