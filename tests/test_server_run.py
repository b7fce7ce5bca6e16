"""Run: how the scheduler thread's events reach a request on the event loop.

A non-streaming request is woken only by events it acts on (start, final, error);
its text deltas wait in the inbox and arrive, in order, with the final event. A
streaming request is woken for every event (coalesced while a wake-up is pending).
No model: a fake scheduler and request, the sink called from a real second thread.
"""
from __future__ import annotations

import asyncio
import threading

from ngramspec.engine.generate import GenerationResponse
from ngramspec.server.run import Run
from ngramspec.jobs.scheduler import Event


class FakeScheduler:
    def __init__(self):
        self.jobs, self.cancelled = [], []

    def submit(self, job):
        self.jobs.append(job)

    def cancel(self, job):
        self.cancelled.append(job)


class FakeRequest:
    """A client that never disconnects."""

    async def receive(self):
        await asyncio.Event().wait()


def delta(text: str, final: bool = False) -> Event:
    return Event(GenerationResponse(text, [len(text)], "length" if final else None, 3, 0,
                                    1, 1.0, 1.0, 0, 0, 1))


def run_thread(sink, events):
    t = threading.Thread(target=lambda: [sink(ev) for ev in events])
    t.start()
    return t


def counting(run: Run) -> list[int]:
    wakes = [0]
    orig = run._wake

    def wake():
        wakes[0] += 1
        orig()
    run._wake = wake
    return wakes


async def _collect(stream: bool, events: list[Event]):
    sched = FakeScheduler()
    run = Run(sched, FakeRequest(), stream)
    wakes = counting(run)
    run.submit(lambda sink: sink)  # the "job" is its sink
    sink = sched.jobs[0]
    t = run_thread(sink, [Event(started=True)])
    firsts = await run.start()
    t.join()
    await asyncio.sleep(0.02)  # a wake-up still pending runs now
    n_before = wakes[0]
    t = run_thread(sink, events)
    t.join()
    await asyncio.sleep(0.02)
    return run, firsts, wakes, wakes[0] - n_before


def test_non_streaming_is_woken_by_start_and_final_only():
    async def main():
        events = [delta(f"t{i} ") for i in range(50)]
        run, firsts, wakes, by_deltas = await _collect(False, events)
        assert firsts[0].started
        assert by_deltas == 0 and len(run.inbox) == 50  # the deltas wait, nothing woke
        sink = run.scheduler.jobs[0]
        got_task = asyncio.ensure_future(run.collect())
        await asyncio.sleep(0.02)
        assert not got_task.done()  # collect waits for the final event
        t = run_thread(sink, [delta("end", final=True)])
        got = await asyncio.wait_for(got_task, 5)
        t.join()
        assert got[0].text == "".join(f"t{i} " for i in range(50)) + "end"
        assert got[0].final is not None and got[0].final.final
        assert run.scheduler.cancelled  # collect closes the run
    asyncio.run(main())


def test_streaming_gets_every_event_in_order():
    async def main():
        events = [delta(f"t{i} ") for i in range(20)]
        run, _, wakes, by_deltas = await _collect(True, events)
        assert 1 <= by_deltas <= 20  # woken (wake-ups coalesce while one is pending)
        seen = [(await run.next())[1].text for _ in range(20)]
        assert seen == [f"t{i} " for i in range(20)]
        sink = run.scheduler.jobs[0]
        for i in range(3):  # a waiting streaming request is woken by each delta
            waiting = asyncio.ensure_future(run.next())
            await asyncio.sleep(0.01)
            t = run_thread(sink, [delta(f"u{i}", final=i == 2)])
            got = await asyncio.wait_for(waiting, 5)
            t.join()
            assert got[1].text == f"u{i}"
    asyncio.run(main())


def test_error_wakes_a_non_streaming_request():
    async def main():
        run, _, wakes, by_deltas = await _collect(False, [delta("a "), delta("b ")])
        assert by_deltas == 0
        sink = run.scheduler.jobs[0]
        t = run_thread(sink, [Event(error=ValueError("boom"))])
        try:
            await run.collect()
        except ValueError as e:
            assert str(e) == "boom"
        else:
            raise AssertionError("the error was not raised")
        t.join()
    asyncio.run(main())
