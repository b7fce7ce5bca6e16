"""Records over a Ray cluster: one actor per engine, chunks pulled as actors free up.

Only `ngramspec batch --ray` imports this module (Ray is the optional extra
`ngramspec[ray]`). No protocol of our own: records go to actors as method
arguments, results come back through Ray's object store as a streaming
generator (one object per finished record), and `ray.wait` tells the driver
which actor has something.

Invariants:
- Every record the driver pulls is, at any moment, in exactly one of: the retry
  queue, one in-flight chunk's `pending`, or yielded. A result is yielded once:
  it leaves `pending` as it is yielded, and results of records no longer pending
  are dropped.
- An actor that dies (killed, node lost) is dropped; the records still pending
  in its chunks go to the front of the retry queue and run on another actor.
  Results it already streamed back were yielded and are not run again.
- Each actor keeps two chunks in flight (`max_concurrency=2`), so its slots are
  refilled from the second chunk while the first drains.
- If every actor is gone, the run raises; what was yielded is in OUTPUT and a
  re-run resumes from there.
- One kernel mode per job: every actor computes KV cells the same way (its
  `Context.kernels.cell_mode`, e.g. own attention or llama.cpp's), checked when the pool
  starts; actors of mixed modes (no compiler on one node, another CPU,
  NGRAMSPEC_OWN_ATTENTION=0 on one) are refused, since a record's output would then
  depend on the node that ran it.
"""
from __future__ import annotations

import collections
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import ray
from ray.exceptions import RayActorError

from ..errors import NgramSpecError
from ..llama import library
from .records import BadRecord, Record
from .results import BatchResult
from .runner import EngineRunner
from .speed import SpeedStats

CHUNKS_IN_FLIGHT = 2


class BatchWorker:
    """A Ray actor: one engine and its slots (an EngineRunner) on one node."""

    def __init__(self, load: dict):
        self.runner = EngineRunner.load(**load)

    def run(self, records: list[Record]) -> Iterator[BatchResult]:
        yield from self.runner.run(records)

    def speed(self) -> SpeedStats:
        return self.runner.speed()

    def where(self) -> tuple[str, int]:
        return socket.gethostname(), os.getpid()

    def kernels(self) -> tuple[str, str]:
        """(cell mode, kernel line) of this actor's engine."""
        ctx = self.runner.engine.ctx
        return ctx.kernels.cell_mode, ctx.kernels.line()


@dataclass
class _Chunk:
    actor: Any
    pending: dict[str, Record] = field(default_factory=dict)  # key -> record not yet back


class RayPool:
    """`n_actors` BatchWorkers on the cluster at `address` (None: found or started)."""

    def __init__(self, load: dict, address: str | None = None, n_actors: int | None = None,
                 chunk_size: int | None = None):
        self._own = not ray.is_initialized()
        if self._own:
            ray.init(address=address, include_dashboard=False, logging_level="WARNING",
                     configure_logging=True)
        alive = [n for n in ray.nodes() if n.get("Alive")]
        self.n_actors = n_actors or len(alive)
        if self.n_actors < 1:
            raise ValueError(f"--actors must be >= 1, got {self.n_actors}")
        self.chunk_size = chunk_size or load["settings"].n_seq
        self.threads = load["settings"].threads
        cls = ray.remote(num_cpus=self.threads or 1, max_concurrency=CHUNKS_IN_FLIGHT)(BatchWorker)
        # llama.cpp's library mapped before the worker's own numpy (library.preload_env)
        env = {"env_vars": library.preload_env()}
        self.actors = [cls.options(scheduling_strategy="SPREAD", runtime_env=env).remote(load)
                       for _ in range(self.n_actors)]
        try:  # every engine loaded before the job's clock starts
            self.where()
        except RayActorError as e:
            self.close()
            raise RuntimeError(f"a Ray actor could not load its engine: {e}") from None
        self.mode, self.kernel_line = self._one_mode()
        self.retried = 0  # records re-sent after their actor died
        self.lost_actors = 0
        self.last_error = ""

    def _one_mode(self) -> tuple[str, str]:
        """(the actors' cell mode, their kernel line), if all compute KV cells in one mode;
        else the pool is closed and NgramSpecError names each actor's mode."""
        got = ray.get([a.kernels.remote() for a in self.actors])
        modes = {mode for mode, _ in got}
        if len(modes) == 1:
            return got[0][0], f"{len(got)} Ray actors, each {got[0][1]}"
        where = self.where()
        each = "; ".join(f"{h} pid {p}: {line}" for (h, p), (_, line) in zip(where, got))
        self.close()
        raise NgramSpecError(f"the Ray actors compute KV cells in different kernel modes "
                         f"({', '.join(sorted(modes))}), so outputs would depend on the node "
                         f"that ran a record; give every node the same kernels "
                         f"(`ngramspec doctor` on each). {each}")

    def describe(self) -> str:
        return (f"{self.n_actors} Ray actors ({self.lost_actors} lost, {self.retried} records "
                f"retried), chunks of {self.chunk_size}, KV cells: {self.mode}")

    def where(self) -> list[tuple[str, int]]:
        """(host, pid) of every live actor, in actor order."""
        return ray.get([a.where.remote() for a in self.actors])

    def run(self, items: Iterable[Record | BadRecord]) -> Iterator[BatchResult]:
        """One result per item, as each finishes on whichever actor ran it."""
        feed = _Feed(iter(items), self.chunk_size)
        flights: dict[Any, _Chunk] = {}
        self._top_up(feed, flights)
        while True:
            yield from feed.drain_bad()
            if not flights:
                if feed.empty:
                    return
                raise RuntimeError(f"every Ray actor is gone ({self.lost_actors} lost; last "
                                   f"error: {self.last_error}); the records not in OUTPUT run "
                                   "when the job is re-run")
            [gen], _ = ray.wait(list(flights), num_returns=1)
            result = self._next(gen, flights, feed)
            if result is not None:
                yield result
            self._top_up(feed, flights)

    def _next(self, gen, flights: dict, feed: "_Feed") -> BatchResult | None:
        """The next result of a ready chunk, or None (chunk finished, or its actor died)."""
        chunk = flights[gen]
        try:
            result = ray.get(next(gen))
        except StopIteration:
            del flights[gen]
            feed.retry(chunk.pending.values())  # none, unless an actor broke its word
            return None
        except RayActorError as e:
            self.last_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            self._lost(chunk.actor, flights, feed)
            return None
        if chunk.pending.pop(result.key, None) is None:
            return None  # already yielded (never expected: one result per record)
        return result

    def _lost(self, actor, flights: dict, feed: "_Feed") -> None:
        """Drop a dead actor; its pending records go back to the front of the queue."""
        if actor in self.actors:
            self.actors.remove(actor)
            self.lost_actors += 1
        for gen in [g for g, c in flights.items() if c.actor is actor]:
            pending = flights.pop(gen).pending.values()
            self.retried += len(pending)
            feed.retry(pending)

    def _top_up(self, feed: "_Feed", flights: dict) -> None:
        """Give every live actor chunks until it has CHUNKS_IN_FLIGHT (or input runs out)."""
        for actor in self.actors:
            while sum(c.actor is actor for c in flights.values()) < CHUNKS_IN_FLIGHT:
                records = feed.take()
                if not records:
                    return
                gen = actor.run.options(num_returns="streaming").remote(records)
                flights[gen] = _Chunk(actor, {r.key: r for r in records})

    def speed(self) -> SpeedStats:
        """Verify-step stats summed over the live actors (a lost actor's are lost with it)."""
        total = SpeedStats()
        try:
            for s in ray.get([a.speed.remote() for a in self.actors]):
                total = total + s
        except RayActorError:
            pass
        return total

    def close(self) -> None:
        for a in self.actors:
            ray.kill(a)
        self.actors = []
        if self._own:
            ray.shutdown()


class _Feed:
    """Input items for chunks: retried records first, then new ones; bad items aside."""

    def __init__(self, source: Iterator[Record | BadRecord], chunk_size: int):
        self.source, self.chunk_size = source, chunk_size
        self.again: collections.deque[Record] = collections.deque()
        self.bad: list[BatchResult] = []
        self.exhausted = False

    @property
    def empty(self) -> bool:
        return self.exhausted and not self.again and not self.bad

    def retry(self, records: Iterable[Record]) -> None:
        self.again.extendleft(sorted(records, key=lambda r: r.index, reverse=True))

    def take(self) -> list[Record]:
        out: list[Record] = []
        while self.again and len(out) < self.chunk_size:
            out.append(self.again.popleft())
        while not self.exhausted and len(out) < self.chunk_size:
            item = next(self.source, None)
            if item is None:
                self.exhausted = True
            elif isinstance(item, BadRecord):
                self.bad.append(BatchResult.bad(item))
            else:
                out.append(item)
        return out

    def drain_bad(self) -> Iterator[BatchResult]:
        while self.bad:
            yield self.bad.pop(0)
