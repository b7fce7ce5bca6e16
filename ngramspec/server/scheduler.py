"""Slots and the scheduler thread: the only thread that touches the Engine.

Invariants:
- Slot i is llama.cpp sequence i of the one context. A slot holds at most one
  job; `engine.finish` is called exactly once for every started job (done,
  stopped by a stop string, cancelled or failed), so the slot's KV entries,
  per-sequence drafter state and sampler never outlive the request.
- Each loop turn: admit waiting jobs into free slots (prompt + first token),
  release cancelled ones, then ONE `engine.step` for every active slot (one
  llama_decode: every slot's last token + draft), and deliver each slot's
  tokens to its request's asyncio.Queue with `call_soon_threadsafe`.
- Jobs beyond the free slots wait in FIFO order (`requests_deferred`); only a
  full queue refuses a request (503). Idle, the thread sleeps on a condition.
- An exception never kills the thread: a failing start fails that request, a
  failing step fails the requests in that step; the slots are released.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ..config import SpecConfig
from ..engine import Engine, SeqState, StepOutput, TextStream
from ..sampling import SamplingParams
from ..stats import timings
from .errors import APIError

log = logging.getLogger("ngramspec.server")
_ids = itertools.count(1)


@dataclass
class Result:
    """Final statistics of one request (llama.cpp's `timings` and our headers)."""

    slot_id: int
    n_prompt: int
    n_generated: int
    prompt_ms: float
    predicted_ms: float
    draft_n: int
    draft_n_accepted: int
    steps: int
    speculative: bool
    truncated: bool

    def timings(self) -> dict:
        return timings(self.n_prompt, self.prompt_ms, self.n_generated, self.predicted_ms,
                       self.draft_n, self.draft_n_accepted)

    @property
    def acceptance_rate(self) -> float:
        return self.draft_n_accepted / self.draft_n if self.draft_n else 0.0

    @property
    def effective_speedup(self) -> float:
        """Tokens per target decode: (tokens after the first) / verify steps."""
        return (self.n_generated - 1) / self.steps if self.steps else 1.0


@dataclass
class Event:
    """What the scheduler tells a request: a text delta, the end, or an error."""

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length"
    stop_type: str = "none"  # llama.cpp: none | eos | limit | word
    stopping_word: str = ""
    result: Result | None = None  # on the final event
    error: BaseException | None = None
    started: bool = False  # the first event: the prompt is evaluated
    speculative: bool = False
    slot_id: int = -1

    @property
    def final(self) -> bool:
        return self.result is not None or self.error is not None


@dataclass
class Job:
    prompt: np.ndarray
    sampling: SamplingParams
    n_predict: int  # already clamped to the slot's context
    speculative: bool
    spec: SpecConfig | None
    stop: list[str]
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    truncate_at_length: bool = False  # n_predict was clamped: "length" means the slot is full
    id: int = field(default_factory=lambda: next(_ids))
    cancelled: bool = False
    finished: bool = False
    t_queued: float = field(default_factory=time.perf_counter)


@dataclass
class Slot:
    id: int
    job: Job | None = None
    st: SeqState | None = None
    text: TextStream | None = None
    raw: bytearray = field(default_factory=bytearray)
    has_new_line: bool = False
    n_tasks: int = 0


@dataclass
class Counters:
    """Monotonic counters (written by the scheduler thread only)."""

    requests_total: int = 0
    requests_finished: int = 0
    requests_cancelled: int = 0
    requests_failed: int = 0
    requests_deferred_total: int = 0
    requests_rejected: int = 0
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    predicted_tokens: int = 0
    predicted_seconds: float = 0.0
    n_decode: int = 0
    n_busy_slots: int = 0
    n_tokens_max: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)


class Scheduler:
    def __init__(self, engine: Engine, n_slots: int, queue_size: int, n_ctx_slot: int):
        self.engine, self.n_ctx_slot, self.queue_size = engine, n_ctx_slot, queue_size
        self.slots = [Slot(i) for i in range(n_slots)]
        self.pending: collections.deque[Job] = collections.deque()
        self.counters = Counters()
        self.cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="ngramspec-scheduler", daemon=True)

    # ------------------------------------------------------------ called from the event loop
    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        with self.cv:
            self._stop = True
            self.cv.notify_all()
        if self._thread.is_alive():
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
                raise APIError("the server is shutting down", "unavailable_error")
            free = sum(1 for s in self.slots if s.job is None) - len(self.pending)
            if free <= 0:
                if len(self.pending) >= self.queue_size:
                    self.counters.requests_rejected += 1
                    raise APIError(f"server busy: all {len(self.slots)} slots are processing and "
                                   f"{len(self.pending)} requests are queued (--queue-size)",
                                   "unavailable_error")
                self.counters.requests_deferred_total += 1
            self.counters.requests_total += 1
            self.pending.append(job)
            self.cv.notify()

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
                while not self._stop and not self.pending and not any(s.job for s in self.slots):
                    self.cv.wait()
                if self._stop:
                    break
                admitted = []
                for s in self.slots:
                    if s.job is None and self.pending:
                        s.job = self.pending.popleft()
                        admitted.append(s)
            try:
                self._turn(admitted)
            except Exception as e:  # a bug: fail what is running, keep serving
                log.exception("scheduler turn failed")
                for s in self.slots:
                    if s.job is not None:
                        self._fail(s, e)
        for s in self.slots:  # shutting down
            if s.job is not None:
                self._fail(s, APIError("the server is shutting down", "unavailable_error"))

    def _turn(self, admitted: list[Slot]) -> None:
        for s in admitted:
            self._start(s)
        for s in self.slots:
            if s.job is not None and s.job.cancelled:
                self.counters.requests_cancelled += 1
                self._release(s)
        active = [s for s in self.slots if s.st is not None and not s.st.done]
        if not active:
            return
        try:
            outs = self.engine.step([s.st for s in active])
        except Exception as e:
            log.exception("llama_decode step failed")
            for s in active:
                self._fail(s, e)
            return
        c = self.counters
        c.n_decode += 1
        c.n_busy_slots += len(active)
        for s, out in zip(active, outs):
            self._deliver(s, out)

    def _start(self, s: Slot) -> None:
        job = s.job
        if job.cancelled:
            self.counters.requests_cancelled += 1
            self._release(s)
            return
        s.n_tasks += 1
        try:
            st = self.engine.start(s.id, job.prompt, job.sampling, job.n_predict,
                                   job.speculative, job.spec)
        except Exception as e:
            self._fail(s, e)
            return
        s.st, s.text, s.raw, s.has_new_line = st, TextStream(self.engine.model, job.stop), bytearray(), False
        c = self.counters
        c.prompt_tokens += st.n_prompt
        c.prompt_seconds += st.t_prompt_done - st.t_start
        self._post(job, Event(started=True, speculative=st.speculative, slot_id=s.id))
        self._deliver(s, self.engine.first_output(st))

    def _deliver(self, s: Slot, out: StepOutput) -> None:
        job, st, c = s.job, s.st, self.counters
        if out.drafted:
            c.num_drafts += 1
            c.num_draft_tokens += out.drafted
            c.num_accepted_tokens += out.accepted
            if len(c.accepted_per_pos) < out.drafted:
                c.accepted_per_pos.extend([0] * (out.drafted - len(c.accepted_per_pos)))
            for i in range(out.accepted):
                c.accepted_per_pos[i] += 1
        finish = out.finish_reason
        for t in out.tokens:
            s.raw += self.engine.model.piece(t)
        delta = s.text.push(out.tokens, final=finish is not None)
        if "\n" in delta:
            s.has_new_line = True
        stop_type, word = "none", ""
        if s.text.stopped:
            finish = st.finish_reason = "stop"
            stop_type, word = "word", self._stop_word(s)
        elif finish == "stop":
            stop_type = "eos"
        elif finish == "length":
            stop_type = "limit"
        if finish is None:
            self._post(job, Event(delta, list(out.tokens)))
            return
        c.n_tokens_max = max(c.n_tokens_max, st.n_prompt + st.n_generated)
        result = Result(slot_id=s.id, n_prompt=st.n_prompt, n_generated=st.n_generated,
                        prompt_ms=(st.t_prompt_done - st.t_start) * 1e3,
                        predicted_ms=(st.t_last - st.t_prompt_done) * 1e3,
                        draft_n=st.draft_n, draft_n_accepted=st.draft_n_accepted, steps=st.steps,
                        speculative=st.speculative,
                        truncated=finish == "length" and job.truncate_at_length)
        c.predicted_tokens += st.n_generated
        c.predicted_seconds += st.t_last - st.t_prompt_done
        c.requests_finished += 1
        self._post(job, Event(delta, list(out.tokens), finish, stop_type, word, result))
        self._release(s)

    def _stop_word(self, s: Slot) -> str:
        raw = bytes(s.raw).decode("utf-8", errors="replace")
        at = len(s.text.text)
        for w in s.job.stop:
            if w and raw.startswith(w, at):
                return w
        return next((w for w in s.job.stop if w and w in raw), "")

    def _fail(self, s: Slot, exc: BaseException) -> None:
        self.counters.requests_failed += 1
        if s.job is not None:
            self._post(s.job, Event(error=exc))
        self._release(s)

    def _release(self, s: Slot) -> None:
        if s.st is not None:
            try:
                self.engine.finish(s.st)
            except Exception:  # pragma: no cover - never leave the slot taken
                log.exception("engine.finish failed")
                self.engine.ctx.clear(s.id)
        elif s.job is not None:
            self.engine.ctx.clear(s.id)  # a start that failed half-way
        with self.cv:
            if s.job is not None:
                s.job.finished = True
            s.job, s.st, s.text = None, None, None

    @staticmethod
    def _post(job: Job, ev: Event) -> None:
        try:
            job.loop.call_soon_threadsafe(job.queue.put_nowait, ev)
        except RuntimeError:  # the event loop is closed (shutdown)
            pass
