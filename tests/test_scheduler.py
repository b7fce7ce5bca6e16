"""The scheduler frees a slot before it tells the job its last event: a client that
has its answer (or its error) and then asks /metrics or /slots sees the slot idle
(regression: CI saw llamacpp:requests_processing 1 right after a response, once the
server's sockets had Nagle off and the answer reached the client sooner)."""
import queue

import numpy as np
import pytest

from ngramspec.settings.config import SpecConfig
from ngramspec.settings.sampling import SamplingParams
from ngramspec.jobs.scheduler import Job, Scheduler

pytestmark = pytest.mark.model


def _job(model, sched: Scheduler, seen: queue.Queue, prompt: str) -> Job:
    """A greedy 4-token job whose sink records, at its final event, how many slots
    are busy and whether the job counts as finished."""
    def sink(ev):
        if ev.final:
            seen.put((ev.error, sched.n_busy(), job.finished, sched.counters.requests_finished))

    job = Job(prompt=np.asarray(model.tokenize(prompt), dtype=np.int32),
              sampling=SamplingParams(), n_predict=4, speculative=True,
              spec=SpecConfig(types=("ngram-simple",)), stop=[], sink=sink)
    return job


@pytest.fixture
def sched(make_engine):
    s = Scheduler(make_engine(SpecConfig(types=("ngram-simple",)), n_seq=2, n_ctx=1024),
                  n_slots=2, queue_size=8, n_ctx_slot=512)
    s.start()
    yield s
    s.shutdown()


def test_the_slot_is_free_when_the_final_event_is_sent(model, sched):
    seen = queue.Queue()
    sched.submit(_job(model, sched, seen, "one two three four one two three four"))
    error, busy, finished, n_finished = seen.get(timeout=60)
    assert error is None
    assert (busy, finished, n_finished) == (0, True, 1)


def test_the_slot_is_free_when_an_error_is_sent(model, sched, monkeypatch):
    def fail(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(sched.engine, "step", fail)
    seen = queue.Queue()
    sched.submit(_job(model, sched, seen, "one two three four one two three four"))
    error, busy, finished, _ = seen.get(timeout=60)
    assert isinstance(error, RuntimeError)
    assert (busy, finished) == (0, True)
    monkeypatch.undo()  # the scheduler serves again after a failed decode
    sched.submit(_job(model, sched, seen, "five six seven"))
    assert seen.get(timeout=60)[:3] == (None, 0, True)
