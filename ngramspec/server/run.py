"""Running a request's jobs on the scheduler from the event loop, and noticing the
client leave.

A request runs one job per prompt (OpenAI's batch form gives several); all its jobs'
events land, in order, in ONE inbox as (index, Event). Invariants:
- the scheduler thread wakes the event loop only when the request can act on an event:
  every event of a streaming request, but a non-streaming request's text deltas wait in
  the inbox until its final event (or a start, or an error) wakes it. A wake-up is
  Python work on the loop's thread, and on a small CPU that work competes with
  llama.cpp's compute threads during the next decode (measured: 8 slots, 8 clients);
- the client's disconnect is watched concurrently with the jobs (`Disconnect`), so a
  job that keeps producing events is cancelled as soon as its client is gone: its slot
  is freed at the scheduler's next turn;
- however a request ends (done, error, disconnect, server shutdown), `Run.close()`
  cancels every job it submitted (a no-op for finished ones).
"""
from __future__ import annotations

import asyncio
import collections
import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse

from ..engine.generate import TokenOutput
from .prepare import Prepared, make_job
from ..jobs.scheduler import Event, Job, Scheduler
from .state import ServerState


@dataclass
class Collected:
    """One job's whole output: its text, tokens, per-token probabilities (requests with
    n_probs > 0) and final event."""

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    probs: list[TokenOutput] = field(default_factory=list)
    final: Event | None = None


class Disconnect:
    """Watches the request's ASGI receive channel for `http.disconnect`. The body has been
    read, so the next message on it is the disconnect (uvicorn also sends one once the
    response is complete). `stop()` before anything else reads the channel (a
    StreamingResponse watches it itself)."""

    def __init__(self, request: Request):
        self.watching = True
        self.task = asyncio.ensure_future(self._watch(request.receive))

    @staticmethod
    async def _watch(receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    @property
    def happened(self) -> bool:
        return self.watching and self.task.done()

    def stop(self) -> None:
        self.watching = False
        if not self.task.done():
            self.task.cancel()


class Run:
    """One request's jobs on the scheduler; their events in submission order per job."""

    def __init__(self, scheduler: Scheduler, request: Request, stream: bool = False):
        self.scheduler = scheduler
        self.stream = stream
        self.inbox: collections.deque = collections.deque()  # appended by the scheduler thread
        self.ready = asyncio.Event()
        self.jobs: list[Job] = []
        self.gone = Disconnect(request)
        self._held: collections.deque = collections.deque()
        self._loop = asyncio.get_running_loop()
        self._wake_pending = False

    def _wake(self) -> None:
        self._wake_pending = False
        self.ready.set()

    def _sink(self, index: int):
        def sink(ev: Event) -> None:  # called from the scheduler thread
            self.inbox.append((index, ev))
            urgent = self.stream or ev.final or ev.started or ev.error is not None
            if urgent and not self._wake_pending:
                self._wake_pending = True
                try:
                    self._loop.call_soon_threadsafe(self._wake)
                except RuntimeError:  # the event loop is closed (shutdown)
                    pass
        return sink

    def submit(self, make_job) -> Job:
        """Queue `make_job(sink)`; a refused job (queue full) cancels the ones before it."""
        job = make_job(self._sink(len(self.jobs)))
        try:
            self.scheduler.submit(job)
        except BaseException:
            self.close()
            raise
        self.jobs.append(job)
        return job

    async def next(self) -> tuple[int, Event] | None:
        """The next (job index, event); None as soon as the client has disconnected."""
        if self._held:
            return self._held.popleft()
        while True:
            if self.gone.happened:
                return None
            if self.inbox:
                return self.inbox.popleft()
            self.ready.clear()
            if self.inbox:  # appended between the check and the clear
                continue
            get = asyncio.ensure_future(self.ready.wait())
            waits = {get, self.gone.task} if self.gone.watching else {get}
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not get.done():
                    get.cancel()

    async def start(self) -> list[Event] | None:
        """Wait until every job has its slot and its prompt is accepted; the first error
        (a bad grammar, ...) is raised so that it becomes a 4xx before any byte is sent.
        None if the client left. Later events are kept for `next`."""
        firsts: list[Event | None] = [None] * len(self.jobs)
        later = []
        try:
            while any(f is None for f in firsts):
                got = await self.next()
                if got is None:
                    self.close()
                    return None
                i, ev = got
                if ev.error is not None:
                    raise ev.error
                if ev.started and firsts[i] is None:
                    firsts[i] = ev
                else:
                    later.append(got)
        except BaseException:
            self.close()
            raise
        self._held.extend(later)
        return firsts  # type: ignore[return-value]

    async def collect(self) -> list[Collected] | None:
        """Every job's whole output, by job index; None if the client left. The jobs are
        cancelled on return either way."""
        outs = [Collected() for _ in self.jobs]
        parts: list[list[str]] = [[] for _ in self.jobs]
        try:
            while any(o.final is None for o in outs):
                got = await self.next()
                if got is None:
                    return None
                i, ev = got
                if ev.error is not None:
                    raise ev.error
                parts[i].append(ev.text)
                outs[i].tokens.extend(ev.tokens)
                if ev.response is not None:
                    outs[i].probs.extend(ev.response.probs)
                if ev.final:
                    outs[i].final = ev
        finally:
            self.close()
        for o, p in zip(outs, parts):
            o.text = "".join(p)
        return outs

    async def events(self) -> AsyncIterator[tuple[int, Event]]:
        """(index, event) until every job has its final event (errors included)."""
        left = len(self.jobs)
        while left:
            got = await self.next()
            if got is None:
                return
            if got[1].final:
                left -= 1
            yield got

    def close(self) -> None:
        self.gone.stop()
        for job in self.jobs:
            self.scheduler.cancel(job)


class RunStreamingResponse(StreamingResponse):
    """SSE response that closes its run however the response ends."""

    def __init__(self, content, run: Run, **kw):
        super().__init__(content, media_type="text/event-stream", **kw)
        self.run = run

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.run.close()


async def start_run(state: ServerState, request: Request, preps: list[Prepared],
                    stream: bool) -> tuple[Run, list[Event]] | None:
    """Submit one job per prepared prompt and wait until all have started; None if the
    client left meanwhile (the jobs are cancelled)."""
    run = Run(state.scheduler, request, stream)
    for prep in preps:
        run.submit(lambda sink, prep=prep: make_job(prep, sink))
    firsts = await run.start()
    if firsts is None:
        return None
    if stream:
        run.gone.stop()  # the streaming response watches the connection itself
    return run, firsts


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
