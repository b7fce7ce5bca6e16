"""-ctk/-ctv (issue 25): quantized KV caches keep the exactness promise on the real model.

Each cell is quantized when it is written, from that token's own K/V rows, so a cell's
bytes do not depend on the batch that wrote it; flash attention reads the quantized
cells through the same kernels whatever the batch (rules U1/U2/T, docs/exactness.md).
Checked: greedy spec-on at one slot and at four slots together equals each prompt alone
spec-off, and a prompt-cache hit equals a miss, for q8_0 and q4_0 K and V."""
from __future__ import annotations

import pytest

from ngramspec import NgramModParams, SpecConfig
from ngramspec.engine.engine import Engine
from ngramspec.engine.generate import generate
from ngramspec.llama.context import ContextParams
from ngramspec.settings.sampling import SamplingParams
from ngramspec.llama.twin import open_context
from together import run_together

pytestmark = pytest.mark.model
OFF = SpecConfig(types=())
ON = SpecConfig(types=("ngram-simple", "ngram-mod"),
                ngram_mod=NgramModParams(n_match=8, n_min=2, n_max=64))
GREEDY = SamplingParams(temperature=0.0)
N = 48
PROMPTS = ["class Stack:\n    def __init__(self):\n        self.items = []\n\n"
           "    def push(self, x):\n        self.items.append(x)\n\n" * 3
           + "Rewrite the class above with type hints:\n",
           "Write a short story about a lighthouse keeper.\n",
           "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n" * 4
           + "Explain the function above:\n",
           "List ten colours, one per line:\n"]


@pytest.fixture(scope="module")
def contexts(model, twin_model, threads):
    made = {}

    def get(kv: str, n_seq: int):
        key = (kv, n_seq)
        if key not in made:
            made[key] = open_context(model, ContextParams(n_ctx=2048 * n_seq, n_seq_max=n_seq,
                                                          n_threads=threads, type_k=kv,
                                                          type_v=kv), twin_model)
        made[key].clear()
        return made[key]
    yield get
    for ctx in made.values():
        ctx.close()


@pytest.mark.parametrize("kv", ["q8_0", "q4_0"])
def test_quantized_kv_spec_on_equals_spec_off_at_one_and_four_slots(model, contexts, kv):
    solo = []
    for p in PROMPTS:
        off = generate(Engine(model, contexts(kv, 1), OFF), p, GREEDY, N, speculative=False)
        on = generate(Engine(model, contexts(kv, 1), ON), p, GREEDY, N)
        assert on.text == off.text, (kv, p[:30])
        solo.append(off.text)
    eng = Engine(model, contexts(kv, 4), ON)
    toks, states = run_together(eng, [model.tokenize(p) for p in PROMPTS], [GREEDY] * 4, N)
    assert [model.detokenize(t) for t in toks] == solo and sum(st.draft_n for st in states) > 0


def test_quantized_kv_differs_from_f16_and_a_cache_hit_equals_a_miss(model, contexts):
    """q4_0 is really applied (its output differs from f16's on some prompt), and a
    second request on the same slot (a prompt-cache hit) gives the miss's text."""
    f16 = [generate(Engine(model, contexts("f16", 1), OFF), p, GREEDY, N, speculative=False).text
           for p in PROMPTS]
    eng = Engine(model, contexts("q4_0", 1), ON)
    q4 = [generate(eng, p, GREEDY, N).text for p in PROMPTS]
    assert q4 != f16
    again = [generate(eng, p, GREEDY, N).text for p in PROMPTS[:1] * 2]
    assert again == [q4[0], q4[0]]
