"""Fixed-shape decodes (llama/fixed_shape.py), the layout that makes -ngl N exact on a
device, run here on the CPU backend: the same code, the same shape, the same checks
(the device's own run: tests/vulkan_check.sh over lavapipe, and CUDA where a GPU is at
hand, docs/exactness.md "Exact decoding on a device").

Checked on the real model: the start-up check passes; every decode has `rows` rows and
the slot's cells sit at cells = positions; a decode never spans two KV views, and after
a context shift the sentinel gives every decode the whole cache's; greedy
spec-on equals spec-off at one slot and at four slots together (each prompt alone);
a prompt-cache hit equals a miss; a slot file round-trips; the cost model prices a
draft that fits as free; load_engine opens this context where asked and the planner
drafts at most rows - 1 tokens."""
from __future__ import annotations

import numpy as np
import pytest

from ngramspec import SpecConfig
from ngramspec.engine.engine import Engine
from ngramspec.engine.generate import generate
from ngramspec.engine.runtime import load_engine
from ngramspec.settings.engine import EngineSettings, LoadOptions
from ngramspec.llama.context import ContextParams
from ngramspec.llama.fixed_shape import ROWS, FixedShapeContext
from ngramspec.speculative.cost import DecodeCost, Shape
from test_kv_types import GREEDY, OFF, ON, PROMPTS  # the same prompts and spec types
from together import run_together

pytestmark = pytest.mark.model
N = 64


@pytest.fixture(scope="module")
def fixed(model, threads):
    made = {}

    def get(n_seq: int) -> FixedShapeContext:
        if n_seq not in made:
            made[n_seq] = FixedShapeContext(model, ContextParams(
                n_ctx=1024 * n_seq, n_seq_max=n_seq, n_threads=threads, flash_attn=None))
        made[n_seq].clear()
        return made[n_seq]
    yield get
    for ctx in made.values():
        ctx.close()


def test_the_start_up_check_passes_and_the_layout_holds(fixed):
    ctx = fixed(1)
    check = ctx.self_check()
    assert check.passed and check.rows == ctx.rows == ROWS, check.reason
    slot = ctx.slots[0]
    lc = slot.lc
    assert lc.llama_memory_seq_pos_max(slot.memory, 2) == -1  # no sentinel: natural views
    rows = ctx.decode([(0, list(range(100, 140)), 0, False)])  # 40 tokens: several decodes
    assert len(rows[0]) == 1 and ctx.positions(0) == (0, 39)
    assert lc.llama_memory_seq_pos_max(slot.memory, 1) == -1  # no padding row left
    ctx.truncate(0, 30)
    assert ctx.positions(0) == (0, 29)


def test_a_decode_never_spans_two_kv_views(fixed):
    """llama.cpp's view of a decode at p is the highest used cell padded to 256; a row
    decoded alone at q sees view(q). So a decode holds only rows of its first row's view."""
    slot = fixed(1).slots[0]
    R = slot.rows
    assert slot.view(0) == 256 and slot.view(256 - R) == 256 and slot.view(257 - R) == 512
    assert slot.take(0, 100) == R and slot.take(256 - R - 2, R) == 3 and slot.take(256 - R, R) == 1
    assert slot.take(257 - R, R) == R
    for p in range(0, slot.n_ctx - 2 * R):
        k = slot.take(p, R)
        assert 1 <= k <= R and all(slot.view(p + j) == slot.view(p) for j in range(k))
        assert k == R or slot.view(p + k) > slot.view(p)


def test_a_shift_gives_the_whole_view_until_the_slot_is_cut_back(fixed):
    ctx = fixed(1)
    slot = ctx.slots[0]
    lc = slot.lc
    ctx.decode([(0, list(range(100, 400)), 0, False)])
    ctx.shift(0, 10, 100, 300)
    assert ctx.positions(0) == (0, 199) and slot.kept == 10
    assert lc.llama_memory_seq_pos_max(slot.memory, 2) >= 0 and slot.view(0) == slot.n_ctx
    assert slot.take(250, 100) == ROWS  # one view: no split
    ctx.decode([(0, list(range(5, 25)), 200, False)])  # the freed cells taken again
    ctx.truncate(0, 205)
    assert slot.kept == 10 and lc.llama_memory_seq_pos_max(slot.memory, 2) >= 0
    ctx.truncate(0, 10)  # back to unshifted cells: no sentinel
    assert slot.kept == -1 and lc.llama_memory_seq_pos_max(slot.memory, 2) == -1
    assert slot.view(0) == 256 and ctx.positions(0) == (0, 9)


def test_spec_on_equals_spec_off_at_one_and_four_slots(model, fixed):
    solo = []
    for p in PROMPTS:
        off = generate(Engine(model, fixed(1), OFF), p, GREEDY, N, speculative=False)
        on = generate(Engine(model, fixed(1), ON), p, GREEDY, N)
        assert on.text == off.text, p[:30]
        solo.append(off.text)
    eng = Engine(model, fixed(4), ON)
    toks, states = run_together(eng, [model.tokenize(p) for p in PROMPTS], [GREEDY] * 4, N)
    assert [model.detokenize(t) for t in toks] == solo
    assert sum(st.draft_n for st in states) > 0
    assert max(st.draft_n for st in states) <= (ROWS - 1) * N  # drafts of at most rows - 1


def test_a_cache_hit_equals_a_miss_and_a_slot_file_round_trips(model, fixed, tmp_path):
    from ngramspec.engine import slot_state

    eng = Engine(model, fixed(1), ON)
    first = generate(eng, PROMPTS[0], GREEDY, N).text
    assert generate(eng, PROMPTS[0], GREEDY, N).text == first  # the slot's cells reused
    slot_state.save(eng, 0, tmp_path / "slot.bin")
    eng.forget(0)
    slot_state.restore(eng, 0, tmp_path / "slot.bin")
    assert eng.reusable_prefix(0, model.tokenize(PROMPTS[0])) > 0
    assert generate(eng, PROMPTS[0], GREEDY, N).text == first


def test_a_draft_that_fits_costs_nothing_more():
    cost = DecodeCost(per_ubatch=1e-3, per_token=1e-5, per_logit=1e-5, per_multi=1e-4,
                      per_kv=1e-6, fixed_rows=16)
    one = cost.seconds([Shape(0, 1, 1, 500)])
    assert cost.seconds([Shape(0, 16, 16, 900)]) == one
    assert cost.seconds([Shape(0, 17, 17, 500)]) == 2 * one
    assert cost.seconds([Shape(0, 1, 1), Shape(1, 5, 5)]) == 2 * one
    fit = DecodeCost.fit([([Shape(0, n, n, 100 * n)], 2e-3 * (1 + (n > 16)))
                          for n in (1, 4, 16, 17, 30)], fixed_rows=16)
    assert np.isclose(fit.seconds([Shape(0, 9, 9)]), 2e-3)


def test_load_engine_opens_it_where_asked(fast_model_path):
    eng = load_engine(EngineSettings(model=fast_model_path, n_ctx=512, n_seq=2,
                                     spec=SpecConfig(types=("ngram-mod",)),
                                     options=LoadOptions(fixed_shape=True)))
    try:
        assert isinstance(eng.ctx, FixedShapeContext) and eng._limits() == (ROWS, 2 * ROWS)
        assert eng.ctx.kernels.cell_mode == f"device-{ROWS}-rows"
        prompt = "one two three four five six seven eight " * 6
        on = generate(eng, prompt, GREEDY, 48).text
        assert on == generate(eng, prompt, GREEDY, 48, speculative=False).text
    finally:
        eng.ctx.close()
        eng.model.close()


def test_a_device_build_decodes_in_the_fixed_shape_at_ngl_n(monkeypatch):
    """-ngl N on a build with a device: fixed-shape decodes (its note says so); -ngl 0:
    the CPU's rules, no op offload; --no-batch-invariance: llama.cpp's way."""
    from ngramspec.engine import runtime
    from ngramspec.llama.kernels import guard

    monkeypatch.setattr(guard, "devices", lambda: [("CUDA0", "GPU"), ("CPU", "CPU")])
    offload, note, fixed = runtime.device_policy(99, True)
    assert fixed and "fixed shape" in note and "CUDA0" in note
    assert runtime.device_policy(0, True)[::2] == (False, False)
    assert runtime.device_policy(99, False) == (True, None, False)
    params, _ = runtime.context_params(4096, 4, 2, LoadOptions(n_gpu_layers=99), True)
    assert params.fixed_rows == ROWS and params.n_seq_max == 4
    params, _ = runtime.context_params(4096, 4, 2, LoadOptions(n_gpu_layers=99), False)
    assert params.fixed_rows == 0


def test_the_device_decides_before_the_cpus_rules(monkeypatch):
    """-ngl N on a device: the CPU's exactness rules and their notes do not apply (the
    shape has its own batch sizes and KV layout; -fa is the user's), and a quantized V
    cache with -fa off is refused as llama.cpp would fail it; -ngl 0: the CPU's rules."""
    from ngramspec.engine import runtime
    from ngramspec.errors import ConfigError
    from ngramspec.llama.kernels import guard

    monkeypatch.setattr(guard, "devices", lambda: [("CUDA0", "GPU"), ("CPU", "CPU")])
    odd = dict(flash_attn="off", kv_unified=True, n_batch=32, n_ubatch=32)
    params, notes = runtime.context_params(4096, 4, 2, LoadOptions(n_gpu_layers=99, **odd), True)
    assert params.fixed_rows == ROWS and params.flash_attn is False
    assert len(notes) == 1 and "fixed shape" in notes[0], notes
    with pytest.raises(ConfigError, match="-ctv q8_0 needs flash attention"):
        runtime.context_params(4096, 1, 2, LoadOptions(n_gpu_layers=99, flash_attn="off",
                                                       cache_type_v="q8_0"), True)
    params, notes = runtime.context_params(4096, 4, 2, LoadOptions(n_gpu_layers=0, **odd), True)
    assert params.fixed_rows == 0 and params.flash_attn is True and params.n_ubatch == 64
    assert [n.split()[0] for n in notes] == ["llama.cpp", "-fa", "--kv-unified", "-b/-ub"], notes


def test_a_failed_start_up_check_refuses_with_its_reason(fast_model_path, monkeypatch):
    from ngramspec.errors import ConfigError
    from ngramspec.llama.fixed_shape import CheckResult

    monkeypatch.setattr(FixedShapeContext, "self_check",
                        lambda self, window=8: CheckResult(False, self.rows, 3, 0.5, 0.0))
    with pytest.raises(ConfigError, match=r"not exact in fixed-shape decodes \(3 logit rows "
                                          r"differ.*max \|diff\| 0.5\).*-ngl 0"):
        load_engine(EngineSettings(model=fast_model_path, n_ctx=512,
                                   options=LoadOptions(fixed_shape=True)))


def test_doctor_reports_the_check_and_the_shape(fast_model_path, monkeypatch):
    from ngramspec import doctor
    from ngramspec.llama.kernels import guard

    assert doctor.device_report(fast_model_path)["exact"] is None  # a CPU build: nothing to check
    monkeypatch.setattr(guard, "devices", lambda: [("Vulkan0", "GPU"), ("CPU", "CPU")])
    d = doctor.device_report(fast_model_path)
    assert d["exact"] is True and d["rows"] == ROWS and d["devices"] == ["Vulkan0"], d
    assert d["max_diff"] == 0.0 and "bit for bit" in d["reason"]
