"""`ngramspec batch --ray`: a local Ray cluster, 2 actors of 1 thread each (slow: the
cluster and two engines start; needs `pip install -e '.[ray]'`, run with -m slow)."""
from __future__ import annotations

import os
import signal
import subprocess

import pytest

from test_batch import N, PROMPTS, cli, read_output, write_input

pytestmark = [pytest.mark.model, pytest.mark.slow]


def test_two_actors_give_the_single_process_output_and_survive_a_killed_actor(tmp_path):
    ray = pytest.importorskip("ray")  # here, so collecting the default suite imports no Ray
    from ngramspec import SpecConfig
    from ngramspec.batch.ray_backend import RayPool
    from ngramspec.batch.records import parse_records
    from ngramspec.batch.runner import Defaults, EngineRunner

    records = [{"id": f"doc-{i}", "prompt": p} for i, p in enumerate(PROMPTS * 3)]
    from ngramspec.settings.engine import EngineSettings

    spec = SpecConfig(types=("ngram-mod", "ngram-simple"), policy="fixed")
    load = dict(settings=EngineSettings(n_ctx=2048, threads=1, n_seq=2, spec=spec),
                defaults=Defaults(n_predict=N))
    single = EngineRunner.load(**load)
    try:
        expected = {r.id: r.text for r in single.run(parse_records(enumerate(records, 1)))}
    finally:
        single.close()

    ctx = ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        # the command, on this cluster
        inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        write_input(inp, records)
        flags = ["-np", "2", "-c", "2048", "-n", str(N), "-t", "1", "--spec-type",
                 "ngram-mod,ngram-simple", "--draft-policy", "fixed"]
        done = subprocess.run(cli(str(inp), "-o", str(out), "--ray", ctx.address_info["address"],
                                  "--actors", "2", *flags),
                              env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}, timeout=600,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert "2 Ray actors" in done.stderr
        lines = read_output(out)
        assert sorted(x["id"] for x in lines) == sorted(expected)
        assert {x["id"]: x["text"] for x in lines} == expected

        # an actor SIGKILLed mid-job: its records run on the other one
        pool = RayPool(load, n_actors=2)
        (_, pid0), _ = pool.where()
        got = []
        for r in pool.run(parse_records(enumerate(records, 1))):
            got.append(r)
            if len(got) == 2:
                os.kill(pid0, signal.SIGKILL)
        pool.close()
        assert pool.lost_actors == 1 and pool.retried > 0
        assert sorted(r.id for r in got) == sorted(expected)
        assert all(r.error is None for r in got), [r.error for r in got if r.error]
        assert {r.id: r.text for r in got} == expected
    finally:
        ray.shutdown()
