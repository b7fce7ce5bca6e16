"""The repacked prefill twin (ngramspec/twin.py): padding rule, CPU guard, and on the
real model, that a prompt's cells move into the main context whole and come out the
same whatever the chunking."""
from __future__ import annotations

import mmap
import os
import sys

import pytest

from ngramspec.model import TILED_PREFILL_MIN, ContextParams
from ngramspec.twin import GEMM_ROWS, drop_file_pages, open_context, repack_is_safe, twin_pads

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
        # the twin computes no logits: the main context re-evaluates the last token
        assert src is ctx and ctx.positions(1)[1] == len(prompt) - 1
        assert ctx.twin.held[1] == len(prompt)  # the twin keeps them for the prompt cache
        logits.append(src.logits_at(rows[-1]).copy())
        states.append(bytes(ctx.seq_state(1)))
    assert states[0] == states[1] == states[2]
    assert (logits[0] == logits[1]).all() and (logits[0] == logits[2]).all()
    ctx.close()


def _rss_file_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and madvise: Linux")
def test_drop_file_pages_unmaps_a_file_and_keeps_its_bytes(tmp_path):
    path = tmp_path / "weights.bin"
    data = os.urandom(16 << 20)
    path.write_bytes(data)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert m[:] == data  # every page of the mapping resident
        before = _rss_file_kib()
        assert drop_file_pages(path) >= len(data)
        assert before - _rss_file_kib() >= 15 << 10  # 16 MiB left the resident set
        assert m[:] == data  # and fault back in unchanged
    assert drop_file_pages(tmp_path / "missing.bin") == 0


def _gguf_maps(path: str) -> dict[str, int]:
    """{address range: resident KiB} of this process's mappings of `path` (smaps)."""
    out, cur = {}, None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and len(parts) >= 5:
                cur = parts[0] if line.rstrip("\n").endswith(" " + path) else None
            elif cur is not None and parts[0] == "Rss:":
                out[cur] = int(parts[1])
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: Linux")
def test_the_twin_maps_no_output_layer(twin_model, threads):
    """An engine's model and twin map the GGUF once each; after a prompt on the twin
    and a few tokens, the two mappings together hold well under two copies (the twin
    computes no logits, so its mapping never holds the 170 MiB output layer)."""
    if twin_model is None:
        pytest.skip("this CPU does not repack (no AVX2, or it advertises AMX)")
    from ngramspec.runtime import EngineSettings, load_engine
    from ngramspec.sampling import SamplingParams

    path = str(twin_model.path.resolve())
    before = set(_gguf_maps(path))
    engine = load_engine(EngineSettings(n_ctx=2048, threads=threads))
    prompt = engine.model.tokenize("def twice(x):\n    return 2 * x\n" * 20)
    assert len(prompt) >= TILED_PREFILL_MIN
    list(engine.generate_step(prompt, SamplingParams(temperature=0), n_predict=4,
                              speculative=False))
    mine = {span: kib for span, kib in _gguf_maps(path).items() if span not in before}
    assert len(mine) == 2
    size_kib = os.path.getsize(path) >> 10
    assert max(mine.values()) > 0.9 * size_kib  # the main model reads all of it
    assert sum(mine.values()) < 1.5 * size_kib
    engine.ctx.close()
