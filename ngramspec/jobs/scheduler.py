"""Slots and the scheduler thread: the only thread that touches the Engine.

Invariants:
- Slot i is llama.cpp sequence i of the one context. A slot holds at most one
  job; `engine.finish` is called exactly once for every started job (done,
  stopped by a stop string, cancelled or failed), so per-sequence drafter state
  and the sampler never outlive the request. The slot's KV stays behind as its
  prompt cache; a job goes to the free slot whose cache covers the longest
  prefix of its prompt (least recently used on a tie).
- Each loop turn: admit waiting jobs into free slots (no decode), release
  cancelled ones, evaluate ONE prompt chunk of the oldest slot still in prefill
  (its own llama_decode: a long prompt never stalls the running slots for more
  than a chunk), then ONE `engine.step` for every generating slot (one
  llama_decode: every slot's last token + draft, lengths planned together), and
  deliver each slot's output through its `Generation` to the job's sink. A job's
  last event (final output or error) is sent after its slot is released, so a
  client that has its answer never sees the slot busy in /metrics or /slots.
- Jobs beyond the free slots wait in FIFO order (`requests_deferred`); only a
  full queue refuses a request (503). A job that names its slot (`id_slot`)
  waits for that slot; the jobs behind it may pass it. Idle, the thread sleeps
  on a condition.
- Slot actions (`call`: save/restore/erase a slot's KV) run on this thread, at
  the start of a turn, once their slot has no job (deferred while it has one,
  as llama-server).
- An exception never kills the thread: a failing start fails that request, a
  failing decode fails the requests in it; the slots are released. An error of a
  request's own input found while sampling (its grammar at a dead end or too
  costly: engine StepOutput.error) fails that request alone; its neighbours go on.
"""
from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

from ..engine.engine import Engine, SeqState, StepOutput
from ..errors import NgramSpecError, Unavailable
from ..engine.generate import Generation, GenerationResponse
from ..engine.request import Request

log = logging.getLogger("ngramspec.server")
_ids = itertools.count(1)


@dataclass
class Event:
    """What the scheduler tells a job: the start, a response (text delta; final with totals), or an error."""

    response: GenerationResponse | None = None
    error: BaseException | None = None
    started: bool = False  # the first event: the job has a slot
    speculative: bool = False
    slot_id: int = -1
    progress: dict | None = None  # prompt progress: total, cache, processed, time_ms

    @property
    def final(self) -> bool:
        return self.error is not None or (self.response is not None and self.response.final)

    @property
    def text(self) -> str:
        return self.response.text if self.response is not None else ""

    @property
    def tokens(self) -> list[int]:
        return self.response.tokens if self.response is not None else []


@dataclass(kw_only=True)
class Job(Request):
    """An engine Request (prompt, sampling, n_predict already clamped to the slot's
    context, speculation, prediction, context shift) and what the scheduler needs."""

    sink: Callable[[Event], None]  # called from the scheduler thread; must not block
    truncate_at_length: bool = False  # n_predict was clamped: "length" means the slot is full
    return_progress: bool = False  # send a progress event at the start and per prompt chunk
    id_slot: int = -1  # the slot this job must run in (-1: any)
    # a job's own state: fresh in every job, also in one made by dataclasses.replace
    id: int = field(default_factory=lambda: next(_ids), init=False)
    cancelled: bool = field(default=False, init=False)
    finished: bool = field(default=False, init=False)
    t_queued: float = field(default_factory=time.perf_counter, init=False)


@dataclass
class Slot:
    id: int
    job: Job | None = None
    st: SeqState | None = None
    gen: Generation | None = None
    n_tasks: int = 0
    last_used: float = 0.0
    prev_job: Job | None = None  # the last job that left the slot (/slots shows it when idle)

    @property
    def has_new_line(self) -> bool:
        return self.gen is not None and "\n" in self.gen.stream.text


@dataclass
class Counters:
    """Monotonic counters of requests and decodes (written by the scheduler thread
    only). Draft counts are not here: the drafters count them (`Engine.stats`)."""

    requests_total: int = 0
    requests_finished: int = 0
    requests_cancelled: int = 0
    requests_failed: int = 0
    requests_deferred_total: int = 0
    requests_rejected: int = 0
    prompt_tokens: int = 0
    prompt_tokens_cached: int = 0
    prompt_seconds: float = 0.0
    predicted_tokens: int = 0
    predicted_seconds: float = 0.0
    n_decode: int = 0
    n_busy_slots: int = 0
    n_tokens_max: int = 0


@dataclass
class SlotAction:
    """Work on one idle slot's KV, run on the scheduler thread (`Scheduler.call`)."""

    slot_id: int
    fn: Callable[[], Any]
    future: Future = field(default_factory=Future)


class Scheduler:
    def __init__(self, engine: Engine, n_slots: int, queue_size: int, n_ctx_slot: int):
        self.engine, self.n_ctx_slot, self.queue_size = engine, n_ctx_slot, queue_size
        self.slots = [Slot(i) for i in range(n_slots)]
        self.pending: collections.deque[Job] = collections.deque()
        self.actions: list[SlotAction] = []
        self.counters = Counters()
        self.cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="ngramspec-scheduler", daemon=True)

    # ------------------------------------------------------------ called from other threads
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to stop without waiting: after its current decode it fails every
        running and waiting job with 503 "shutting down", so their requests end at once
        (safe from a signal handler on the event loop)."""
        with self.cv:
            self._stop = True
            self.cv.notify_all()

    def shutdown(self, timeout: float = 10.0, wait: bool = True) -> None:
        """stop(), then (wait=True) join the thread."""
        self.stop()
        if wait and self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def n_busy(self) -> int:
        return sum(1 for s in self.slots if s.job is not None)

    def n_deferred(self) -> int:
        return len(self.pending)

    def submit(self, job: Job) -> None:
        """Queue a job; deferred when no slot is free, 503 only when the queue is full."""
        with self.cv:
            if self._stop or not self._thread.is_alive():
                raise Unavailable("the server is shutting down")
            free = sum(1 for s in self.slots if s.job is None) - len(self.pending)
            if free <= 0:
                if len(self.pending) >= self.queue_size:
                    self.counters.requests_rejected += 1
                    raise Unavailable(f"server busy: all {len(self.slots)} slots are processing "
                                      f"and {len(self.pending)} requests are queued (--queue-size)")
                self.counters.requests_deferred_total += 1
            self.counters.requests_total += 1
            self.pending.append(job)
            self.cv.notify()

    def call(self, slot_id: int, fn: Callable[[], Any]) -> Future:
        """Run fn() on the scheduler thread once slot `slot_id` has no job; the future
        gets its result or exception."""
        action = SlotAction(slot_id, fn)
        with self.cv:
            if self._stop or not self._thread.is_alive():
                raise Unavailable("the server is shutting down")
            self.actions.append(action)
            self.cv.notify()
        return action.future

    def _run_actions(self) -> None:
        """Run the queued actions whose slot is free (in order); the others wait."""
        with self.cv:
            ready = [a for a in self.actions if self.slots[a.slot_id].job is None]
            self.actions = [a for a in self.actions if a not in ready]
        for a in ready:
            if not a.future.set_running_or_notify_cancel():
                continue
            try:
                a.future.set_result(a.fn())
            except BaseException as e:
                a.future.set_exception(e)

    def cancel(self, job: Job) -> None:
        """The client went away: drop it from the queue, or free its slot next turn."""
        with self.cv:
            if job.finished:
                return
            job.cancelled = True
            try:
                self.pending.remove(job)
                job.finished = True
                self.counters.requests_cancelled += 1
            except ValueError:
                pass
            self.cv.notify()

    # ------------------------------------------------------------ the scheduler thread
    def _run(self) -> None:
        while True:
            with self.cv:
                while (not self._stop and not self.pending and not self.actions
                       and not any(s.job for s in self.slots)):
                    self.cv.wait()
                if self._stop:
                    break
            self._run_actions()
            with self.cv:
                admitted = self._assign()
            try:
                self._turn(admitted)
            except Exception as e:  # a bug: fail what is running, keep serving
                log.exception("scheduler turn failed")
                for s in self.slots:
                    if s.job is not None:
                        self._fail(s, e)
        bye = Unavailable("the server is shutting down")
        for s in self.slots:  # shutting down
            if s.job is not None:
                self._fail(s, bye)
        with self.cv:
            waiting, self.pending = list(self.pending), collections.deque()
        for job in waiting:
            job.finished = True
            job.sink(Event(error=bye))
        with self.cv:
            actions, self.actions = self.actions, []
        for a in actions:
            a.future.set_exception(bye)

    def _assign(self) -> list[Slot]:
        """Pending jobs -> free slots, each to its `id_slot` or else to the slot caching
        most of its prompt."""
        admitted = []
        for job in list(self.pending):
            free = [s for s in self.slots if s.job is None]
            if not free:
                break
            if job.id_slot >= 0:
                s = self.slots[job.id_slot]
                if s.job is not None:
                    continue  # waits for its slot
            else:
                s = max(free, key=lambda s: (self.engine.reusable_prefix(s.id, job.prompt)
                                             if job.cache_prompt else 0, -s.last_used))
            self.pending.remove(job)
            s.job = job
            admitted.append(s)
        return admitted

    def _turn(self, admitted: list[Slot]) -> None:
        for s in admitted:
            self._start(s)
        for s in self.slots:
            if s.job is not None and s.job.cancelled:
                self.counters.requests_cancelled += 1
                self._release(s)
        generating = [s for s in self.slots if s.st is not None and not s.st.done
                      and not s.st.prefilling]
        filling = [s for s in self.slots if s.st is not None and s.st.prefilling]
        if filling:
            s = min(filling, key=lambda s: s.job.t_queued)
            self._guard([s], lambda: self._prefill(s, self.engine.ctx.prefill_chunk))
        if generating:  # folded steps (engine/fold.py) only while no prompt waits for a turn
            self._guard(generating, lambda: self._step(generating, fold=not filling))

    def _guard(self, slots: list[Slot], work: Callable[[], None]) -> None:
        try:
            work()
        except Exception as e:
            if isinstance(e, NgramSpecError):  # the request's own input (its grammar): a 4xx
                log.info("request failed: %s", e)
            else:
                log.exception("llama_decode failed")
            for s in slots:
                if s.job is not None:
                    self._fail(s, e)

    def _prefill(self, s: Slot, chunk: int) -> None:
        st = s.st
        out = self.engine.prefill(st, chunk)
        c = self.counters
        c.n_decode += 1  # a prompt chunk is one llama_decode of this slot alone
        c.n_busy_slots += 1
        self._progress(s)
        if out is None:
            return
        c.prompt_tokens += st.n_prompt - st.n_cached
        c.prompt_tokens_cached += st.n_cached
        c.prompt_seconds += st.t_prompt_done - st.t_start
        self._deliver(s, out)

    def _step(self, slots: list[Slot], fold: bool = True) -> None:
        outs = self.engine.step([s.st for s in slots], fold)
        c = self.counters
        decodes = max((o.decodes for o in outs), default=1)  # a folded run: several
        c.n_decode += decodes
        c.n_busy_slots += len(slots) * decodes
        for s, out in zip(slots, outs):
            if out.error is not None:  # this job's own input failed it (a grammar dead end)
                self._fail(s, out.error)
            else:
                self._deliver(s, out)

    def _start(self, s: Slot) -> None:
        job = s.job
        if job.cancelled:
            self.counters.requests_cancelled += 1
            self._release(s)
            return
        s.n_tasks += 1
        try:
            st = self.engine.start(s.id, job)
        except Exception as e:
            self._fail(s, e)
            return
        s.st = st
        s.gen = Generation(self.engine.model, st, job.stop, job.truncate_at_length)
        job.sink(Event(started=True, speculative=st.speculative, slot_id=s.id))
        self._progress(s)

    def _progress(self, s: Slot) -> None:
        """The prompt's progress, for a job that asked for it (llama-server's
        prompt_progress: `processed` counts the cached tokens too)."""
        st = s.st
        if s.job.return_progress:
            t = (st.t_prompt_done or time.perf_counter()) - st.t_start if st.n_hist > st.n_cached else 0.0
            s.job.sink(Event(slot_id=s.id, progress={
                "total": st.n_prompt, "cache": st.n_cached, "processed": st.n_hist,
                "time_ms": t * 1e3}))

    def _deliver(self, s: Slot, out: StepOutput) -> None:
        """Send a step's output to its job. A final output frees the slot (and
        updates the counters) BEFORE it is sent, so a client that has its answer
        sees the slot idle in /metrics and /slots."""
        r, job = s.gen.push(out), s.job
        if r.final:
            st, c = s.st, self.counters
            c.n_tokens_max = max(c.n_tokens_max, st.n_prompt + st.n_generated)
            c.predicted_tokens += st.n_generated
            c.predicted_seconds += max(st.t_last - st.t_prompt_done, 0.0)
            c.requests_finished += 1
            self._release(s)
        job.sink(Event(r, slot_id=s.id))

    def _fail(self, s: Slot, exc: BaseException) -> None:
        """End a slot's job with an error; the slot is free before the error is sent."""
        self.counters.requests_failed += 1
        job = s.job
        try:
            if s.st is not None:  # whatever its KV holds now is not a usable cache
                self.engine.finish(s.st)
                s.st = None
            self.engine.forget(s.id)
        finally:
            self._release(s)
            if job is not None:
                job.sink(Event(error=exc, slot_id=s.id))

    def _release(self, s: Slot) -> None:
        if s.st is not None:
            try:
                self.engine.finish(s.st)
            except Exception:  # pragma: no cover - never leave the slot taken
                log.exception("engine.finish failed")
                self.engine.forget(s.id)
        with self.cv:
            if s.job is not None:
                s.job.finished = True
                s.prev_job = s.job
            s.job, s.st, s.gen = None, None, None
            s.last_used = time.perf_counter()
