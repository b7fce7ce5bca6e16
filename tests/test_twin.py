"""The repacked prefill twin (ngramspec/llama/twin.py): padding rule, CPU guard, and on the
real model, that a prompt's cells move into the main context whole and come out the
same whatever the chunking."""
from __future__ import annotations

import mmap
import os
import sys

import pytest

from ngramspec.llama.context import TILED_PREFILL_MIN, ContextParams
from ngramspec.llama import file_pages, seq_cells
from ngramspec.llama.twin import GEMM_ROWS, open_context, repack_is_safe, twin_pads

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
    from ngramspec.settings import flags
    from ngramspec.settings.typed import typed

    kw = flags.defaults("serve")
    assert typed(dict(kw)).engine.options.repack is True
    kw["repack"] = False
    assert typed(kw).engine.options.repack is False


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
        states.append(bytes(seq_cells.read(ctx, 1)))
    assert states[0] == states[1] == states[2]
    assert (logits[0] == logits[1]).all() and (logits[0] == logits[2]).all()
    ctx.close()


def _rss_file_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and madvise: Linux")
def test_file_pages_drop_unmaps_a_file_and_keeps_its_bytes(tmp_path):
    path = tmp_path / "weights.bin"
    data = os.urandom(16 << 20)
    path.write_bytes(data)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert m[:] == data  # every page of the mapping resident
        before = _rss_file_kib()
        assert file_pages.drop(path, (0, 1 << 20)) == 0  # not inside that range
        assert file_pages.drop(path) >= len(data)
        assert before - _rss_file_kib() >= 15 << 10  # 16 MiB left the resident set
        assert m[:] == data  # and fault back in unchanged
    assert file_pages.spans(tmp_path / "missing.bin") == set()
    assert file_pages.drop(tmp_path / "missing.bin") == 0


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
    from ngramspec.engine.runtime import load_engine
    from ngramspec.settings.engine import EngineSettings
    from ngramspec.settings.sampling import SamplingParams

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


def _prefill(ctx, seq: int, prompt, chunk: int = 512, cached: int = 0):
    """Prompt `prompt` into sequence `seq` of `ctx`, whose first `cached` tokens it
    holds already (a prefix hit), in chunks; the sequence's state bytes and the first
    token's logits."""
    ctx.truncate(seq, cached)
    ctx.begin_prompt(seq, cached)
    for i in range(cached, len(prompt), chunk):
        src, rows = ctx.prefill(seq, prompt[i:i + chunk], i, last=i + chunk >= len(prompt))
    return bytes(seq_cells.read(ctx, seq)), src.logits_at(rows[-1]).copy()


@pytest.mark.model
def test_a_twin_that_grows_gives_the_cells_of_one_of_full_size(model, twin_model, threads,
                                                               monkeypatch):
    """The twin starts small and grows when a prompt needs more cells (PrefillTwin._room):
    the main context's cells and the first token's logits equal those of a twin that
    had every cell from the start, for a prompt that makes it grow twice, another
    slot's prompt after it, and the first slot's next prompt that reuses 1,500 tokens
    of its first (its saved state loads into the grown twin)."""
    if twin_model is None:
        pytest.skip("this CPU does not repack (no AVX2, or it advertises AMX)")
    import numpy as np

    import ngramspec.llama.twin as T

    text = "class Stack:\n    def push(self, x):\n        self.items.append(x)\n"
    prompt = model.tokenize(text * 110)
    assert len(prompt) > 2 * (512 + GEMM_ROWS)
    tail = model.tokenize("def pop(self): return 1\n" * 8)
    again, early = (np.concatenate([prompt[:n], tail]) for n in (1500, 300))
    short = model.tokenize("x = [i * i for i in range(10)]\n" * 12)
    params = ContextParams(n_ctx=2 * 4096, n_seq_max=2, n_threads=threads)
    runs = []
    for start in (512, 10 ** 6):  # grows 516 -> 1032 -> 2064+; the whole slot at once
        monkeypatch.setattr(T, "TWIN_START_CELLS", start)
        ctx = open_context(model, params, twin_model)
        sizes = [ctx.twin.ctx.n_ctx]
        out = [_prefill(ctx, 0, prompt, chunk=300)]  # chunks that do not start at 512k
        sizes.append(ctx.twin.ctx.n_ctx)
        out += [_prefill(ctx, 1, short), _prefill(ctx, 0, again, cached=1500),
                _prefill(ctx, 1, short, cached=len(short) - 1),
                _prefill(ctx, 0, early, cached=300, chunk=200)]
        runs.append((sizes, out))
        ctx.close()
    (grown, a), (whole, b) = runs
    assert grown[0] < 1100 and grown[1] > 2 * grown[0] and whole[0] == whole[1] > 4096
    for (state_a, logits_a), (state_b, logits_b) in zip(a, b):
        assert state_a == state_b and (logits_a == logits_b).all()
    ctx = open_context(model, params, twin_model)  # the same prompts, no prefix reused
    for text, (state, logits) in ((again, a[2]), (early, a[4])):
        miss_state, miss_logits = _prefill(ctx, 0, text, chunk=200)
        assert miss_state == state and (miss_logits == logits).all()
    ctx.close()


@pytest.mark.model
def test_a_slot_reuses_a_prefix_shorter_than_the_window_from_its_saved_cells(model, twin_model,
                                                                             threads):
    """With two slots, slot 0's prompt cells wait as state bytes while slot 1's prompt
    is in the twin; slot 0's next prompt then reuses 300 of its 1,600 tokens, so the
    next chunk needs sliding-window cells far below the last prompt's window: the
    first token's logits equal a miss's (the saved state holds every cell: ALL_CELLS)."""
    if twin_model is None:
        pytest.skip("this CPU does not repack (no AVX2, or it advertises AMX)")
    import numpy as np

    prompt = model.tokenize("class Queue:\n    def put(self, x):\n        self.q.append(x)\n" * 100)
    early = np.concatenate([prompt[:300], model.tokenize("def get(self): return 0\n" * 6)])
    params = ContextParams(n_ctx=2 * 4096, n_seq_max=2, n_threads=threads)
    ctx = open_context(model, params, twin_model)
    miss = _prefill(ctx, 0, early)
    _prefill(ctx, 0, prompt)
    _prefill(ctx, 1, model.tokenize("y = 1\n" * 40))  # the twin now holds slot 1's cells
    hit = _prefill(ctx, 0, early, cached=300)
    ctx.close()
    assert hit[0] == miss[0] and (hit[1] == miss[1]).all()


@pytest.mark.model
def test_the_twin_loads_without_the_vocabulary_and_computes_the_same_cells(model, threads):
    """load_twin reads no vocabulary (tokenizer "none" with as many dummy tokens,
    twin.no_vocab): the same embedding shape, and a prompt's cells byte-identical to
    those of a twin loaded with its vocabulary."""
    from ngramspec.llama.gguf_types import vocab_size
    from ngramspec.llama.model import Model, ModelError
    from ngramspec.llama.twin import load_twin, no_vocab

    if not repack_is_safe():
        pytest.skip("this CPU does not repack (no AVX2, or it advertises AMX)")
    assert vocab_size(model.path) == (model.arch, model.n_vocab)
    assert no_vocab(model.path) == {"tokenizer.ggml.model": "none",
                                    f"{model.arch}.vocab_size": model.n_vocab}
    bare = load_twin(model.path)
    full = Model(model.path, use_extra_bufts=True)
    assert bare.n_vocab == full.n_vocab == model.n_vocab
    with pytest.raises(ModelError, match="without its vocabulary"):  # not llama.cpp's abort
        bare.tokenize("hello")
    with pytest.raises(ModelError, match="without its vocabulary"):
        bare.piece(5)
    prompt = model.tokenize("def area(r):\n    return 3.14159 * r * r\n" * 30)
    params = ContextParams(n_ctx=2048, n_threads=threads)
    out = []
    for twin in (bare, full):
        ctx = open_context(model, params, twin)
        out.append(_prefill(ctx, 0, prompt, chunk=256))
        ctx.close()
    assert out[0][0] == out[1][0] and (out[0][1] == out[1][1]).all()
    bare.close()
    full.close()


def test_vocab_size_reads_a_hand_written_header(tmp_path):
    """gguf_types.vocab_size stops at the architecture and the token list's length;
    None without a token list or for a file that is not GGUF."""
    import struct

    from ngramspec.llama.gguf_types import vocab_size

    def text(s: str) -> bytes:
        return struct.pack("<Q", len(s)) + s.encode()

    kv = (text("general.architecture") + struct.pack("<I", 8) + text("demo")
          + text("general.alignment") + struct.pack("<II", 4, 32)
          + text("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 3)
          + text("a") + text("bc") + text("d"))
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 3) + kv)
    assert vocab_size(path) == ("demo", 3)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv[:kv.index(text("general.alignment"))])
    assert vocab_size(path) is None
    path.write_bytes(b"not a model")
    assert vocab_size(path) is None


@pytest.mark.model
def test_a_main_context_reserved_for_generation_splits_decodes_and_keeps_every_logit(
        model, twin_model, threads):
    """Beside a twin the main context is reserved for GENERATION_UBATCH-token ubatches
    (smaller window-size SWA streams) while prompt chunks keep the twin's 512: a decode
    of 8 sequences x 40 tokens then splits where a 512-token ubatch would not, and
    every logit row is bit-identical to the one-ubatch decode's."""
    from ngramspec.llama.twin import GENERATION_UBATCH, PrefillTwin, TwinnedContext

    if twin_model is None:
        pytest.skip("this CPU does not repack (no AVX2, or it advertises AMX)")
    params = ContextParams(n_ctx=8 * 2048, n_seq_max=8, n_threads=threads)
    small = open_context(model, params, twin_model)
    big = TwinnedContext(model, params, PrefillTwin(twin_model, params))
    text = model.tokenize("class Queue:\n    def put(self, item):\n        self.q.append(item)\n" * 30)
    try:
        assert (small.n_ubatch, small.prefill_chunk, big.n_ubatch) == (GENERATION_UBATCH, 512, 512)
        assert small.swa_span == 512 + GENERATION_UBATCH < big.swa_span == 1024
        digests = []
        for ctx in (small, big):
            entries = []
            for s in range(8):
                prompt = text[7 * s:7 * s + 100]
                ctx.clear(s)
                ctx.begin_prompt(s, 0)
                ctx.prefill(s, prompt, 0, last=True)
                entries.append((s, text[7 * s + 100:7 * s + 140], 100, True))
            lay = ctx.layout_for([(s, len(t), len(t)) for s, t, _, _ in entries])
            assert len(lay.ubatches) == (1 if ctx is big else 2)
            rows = ctx.decode(entries)
            digests.append([ctx.logits_at(i).tobytes() for r in rows for i in r])
        assert digests[0] == digests[1]
    finally:
        small.close()
        big.close()
