"""The Python API of batch jobs, layered generators as in mlx-lm:

    batch(engine_or_path, records, parallel=4)     BatchResult per record, as they finish
      EngineRunner.run(items)                      the same over parsed items (runner.py)
        Scheduler                                  slots, continuous batching (server)
          Engine.start/prefill/step                one llama_decode each

    for rec in batch(None, [{"id": 1, "prompt": "..."}], parallel=4):
        print(rec.id, rec.text, rec.error)

`records` are dicts (or JSON strings) in the input format of `ngramspec batch`;
bad ones come back as results with `error` set, as in the command.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator

from ..settings.config import AUTO, SpecConfig
from ..settings.sampling import SamplingParams
from .previous import load_previous, with_previous
from .records import parse_records
from .results import BatchResult, in_order
from .runner import Defaults, EngineRunner


def batch(engine_or_path: Any, records: Iterable[dict | str], parallel: int = 4, *,
          n_predict: int = 256, sampling: SamplingParams | None = None,
          spec: SpecConfig | None = None, n_ctx: int = 4096, threads: int | None = None,
          ordered: bool = False, cache_prompt: bool = True,
          previous: Iterable[str] = ()) -> Iterator[BatchResult]:
    """Run `records` on an Engine (with at least `parallel` sequences), or on the model
    at a path (None: the embedded one, loaded with `parallel` slots sharing `n_ctx`).
    Yields one BatchResult per record, in completion order (`ordered`: input order).
    `sampling`, `n_predict`: defaults of records that do not set them (greedy, 256).
    `spec`: the loaded model's speculation (None: auto, as the command's default).
    `previous`: results files of earlier runs, as `ngramspec batch --previous`."""
    from ..engine.engine import Engine
    from ..settings.engine import EngineSettings

    defaults = Defaults(sampling or SamplingParams(temperature=0.0), n_predict, cache_prompt)
    texts = load_previous(list(previous))  # before the model loads: a bad file stops here
    if isinstance(engine_or_path, Engine):
        runner = EngineRunner(engine_or_path, parallel, defaults)
    else:
        settings = EngineSettings(engine_or_path, n_ctx=n_ctx, threads=threads, n_seq=parallel,
                                  spec=spec or SpecConfig().with_types(AUTO))
        runner = EngineRunner.load(settings, defaults)
    try:
        results = runner.run(with_previous(parse_records(enumerate(records, 1)), texts))
        yield from in_order(results) if ordered else results
    finally:
        runner.close()
