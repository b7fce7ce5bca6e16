"""llama-server's shapes, without a model: --alias/--tags as a std::set (the id is the
first alias in sort order), the /slots entry of a slot before and after a task, and
`generation_settings.logit_bias` (ignore_eos's EOG tokens at -inf, rendered null)."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np

from ngramspec.settings.config import SpecConfig
from ngramspec.settings.sampling import SamplingParams
from ngramspec.server import render
from ngramspec.jobs.scheduler import Job, Slot
from ngramspec.settings.server import ServerSettings


def test_alias_and_tags_are_a_sorted_set():
    s = ServerSettings(alias="tinyllama-2,fim,code, fim", tags="chat,fim,small")
    assert s.alias == ("code", "fim", "tinyllama-2") and s.model_id("m.gguf") == "code"
    assert s.tags == ("chat", "fim", "small")
    assert ServerSettings().alias == () and ServerSettings().model_id("m.gguf") == "m.gguf"


class FakeModel:
    """What params_json needs of a model: its end-of-generation tokens."""

    def eog_tokens(self):
        return [1, 106]


def test_logit_bias_renders_the_chain_biases():
    model = FakeModel()
    plain = render.params_json(SamplingParams(), 8, [], SpecConfig(), True, model=model)
    assert plain["logit_bias"] == [] and plain["ignore_eos"] is False
    sp = SamplingParams(logit_bias=((42, 2.5), (7, -math.inf)), ignore_eos=True)
    got = render.params_json(sp, 8, [], SpecConfig(), True, model=model)
    assert got["ignore_eos"] is True
    assert got["logit_bias"] == [{"bias": 2.5, "token": 42}, {"bias": None, "token": 7},
                                 {"bias": None, "token": 1}, {"bias": None, "token": 106}]
    json.dumps(got, allow_nan=False)  # what the JSON response does: no inf may be left


def _job(n_predict: int = 8) -> Job:
    return Job(prompt=np.arange(5, dtype=np.int32), sampling=SamplingParams(temperature=0.5),
               n_predict=n_predict, speculative=True, spec=None, stop=["\n"], sink=lambda ev: None)


def test_slot_entry_before_during_and_after_a_task():
    idle = render.params_json(SamplingParams(), -1, [], SpecConfig(), True)
    slot = Slot(id=1)
    fresh = render.slot_json(slot, 256, idle, SpecConfig(), FakeModel())
    # a slot that never ran a task: no task fields (llama-server: no task, no task_prev)
    assert {"params", "id_task", "next_token"}.isdisjoint(fresh)
    assert fresh["id"] == 1 and fresh["n_ctx"] == 256 and fresh["is_processing"] is False

    job = _job()
    slot.job, slot.st = job, SimpleNamespace(n_generated=3, draft_n=4, draft_n_accepted=2)
    slot.gen = SimpleNamespace(stream=SimpleNamespace(text="a\nb"))
    busy = render.slot_json(slot, 256, idle, SpecConfig(), FakeModel())
    assert busy["is_processing"] is True and busy["id_task"] == job.id
    assert busy["params"]["temperature"] == 0.5 and busy["params"]["stop"] == ["\n"]
    assert busy["next_token"] == [{"has_next_token": True, "has_new_line": True,
                                   "n_remain": 5, "n_decoded": 3}]
    assert busy["n_prompt_tokens"] == 5 and busy["draft_n_accepted"] == 2

    slot.prev_job, slot.job, slot.st, slot.gen = job, None, None, None  # as Scheduler._release
    done = render.slot_json(slot, 256, idle, SpecConfig(), FakeModel())
    # idle after a task: that task's id and params, the budget reset
    assert done["is_processing"] is False and done["id_task"] == job.id
    assert done["params"]["temperature"] == 0.5
    assert done["next_token"] == [{"has_next_token": False, "has_new_line": False,
                                   "n_remain": -1, "n_decoded": 0}]
