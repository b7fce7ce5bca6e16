"""The repacked prefill twin (ngramspec/twin.py): padding rule, CPU guard, and on the
real model, that a prompt's cells move into the main context whole and come out the
same whatever the chunking."""
from __future__ import annotations

import pytest

from ngramspec.model import TILED_PREFILL_MIN, ContextParams
from ngramspec.twin import GEMM_ROWS, open_context, repack_is_safe, twin_pads

X86 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma avx512f\n"


def test_twin_pads_make_every_chunk_64_rows_or_more_and_a_multiple_of_4():
    for n in range(1, 600):
        rows = n + twin_pads(n)
        assert rows >= TILED_PREFILL_MIN and rows % GEMM_ROWS == 0
        assert rows - GEMM_ROWS < max(n, TILED_PREFILL_MIN)  # the fewest such rows


def test_repack_only_on_avx2_cpus_that_do_not_advertise_amx():
    assert repack_is_safe(X86)
    assert not repack_is_safe(X86.replace("avx512f", "avx512f amx_tile amx_int8"))
    assert not repack_is_safe("flags\t\t: fpu sse2\n")
    assert not repack_is_safe("Features\t: fp asimd\n")  # ARM: not checked, not used


def test_no_repack_flag_reaches_the_load_options():
    from ngramspec import flags

    kw = flags.defaults("serve")
    assert flags.load_options(dict(kw)).repack is True
    kw["repack"] = False
    assert flags.load_options(kw).repack is False


@pytest.mark.model
def test_prompt_cells_move_whole_and_do_not_depend_on_the_chunking(model, twin_model, threads):
    if twin_model is None:
        pytest.skip("this CPU does not repack (no AVX2, or it advertises AMX)")
    prompt = model.tokenize("def repeat(x):\n    return [x for _ in range(3)]\n" * 40)
    assert len(prompt) > 600
    params = ContextParams(n_ctx=4096, n_seq_max=2, n_threads=threads)
    ctx = open_context(model, params, twin_model)
    states, logits = [], []
    for chunk in (512, 200, 96):
        ctx.clear(1)
        ctx.begin_prompt(1, 0)
        for i in range(0, len(prompt), chunk):
            part = prompt[i:i + chunk]
            src, rows = ctx.prefill(1, part, i, last=i + chunk >= len(prompt))
        assert src is ctx.twin.ctx and ctx.positions(1)[1] == len(prompt) - 1
        assert ctx.twin.held[1] == len(prompt)  # the twin keeps them for the prompt cache
        logits.append(src.logits_at(rows[-1]).copy())
        states.append(bytes(ctx.seq_state(1)))
    assert states[0] == states[1] == states[2]
    assert (logits[0] == logits[1]).all() and (logits[0] == logits[2]).all()
    ctx.close()
