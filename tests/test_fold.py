"""Folded steps (engine/fold.py, native/fold.c): plain greedy steps made in one C call give
what the same steps give one `Engine.step` at a time: tokens, history, KV, finish reasons,
counters, and a resting sequence's watch (its calls, its proposals, where it stops)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ngramspec import SpecConfig
from ngramspec.engine import fold as F
from ngramspec.engine.request import Request
from ngramspec.settings.sampling import SamplingParams

FIXTURES = Path(__file__).resolve().parents[1] / "ngramspec" / "bench" / "fixtures" / "prompts"
GREEDY = SamplingParams(temperature=0.0)


def _lib():
    lib = F.library()
    if lib is None:
        pytest.skip("fold.c is not built here (no C compiler)")
    return lib


def test_argmax_is_numpys_on_ties_nans_infinities_and_every_length():
    lib, rng = _lib(), np.random.default_rng(7)
    for n in [*range(1, 70), 127, 128, 129, 1000, 49152, 262144]:
        for kind in ("random", "ties", "nan", "inf", "flat"):
            x = rng.standard_normal(n).astype(np.float32)
            if kind == "ties":
                x = np.round(x).astype(np.float32)
            elif kind == "nan":
                x[rng.integers(n, size=2)] = np.nan
            elif kind == "inf":
                x[rng.integers(n, size=2)] = np.inf
            elif kind == "flat":
                x[:] = -0.0
                x[rng.integers(n)] = 0.0  # equal to -0.0: the first index wins
            assert lib.ngs_fold_argmax(x.ctypes.data, n) == int(np.argmax(x)), (n, kind)


def test_llama_batch_and_the_mirrors_have_the_layout_fold_c_reads():
    import llama_cpp

    from ngramspec.llama.kernels import build

    assert F.batch_matches(llama_cpp)
    lib = build.library(build.FOLD, build.GENERIC).lib
    if lib is None:
        pytest.skip("fold.c is not built here (no C compiler)")
    assert F.layout(lib) == F.mirrored()


@pytest.fixture(scope="module")
def fast(fast_model_path, threads):
    from ngramspec.engine.runtime import load_engine
    from ngramspec.settings.engine import EngineSettings

    eng = load_engine(EngineSettings(model=fast_model_path, threads=threads, n_ctx=4096, n_seq=2,
                                     spec=SpecConfig(types=())))
    if eng.fold is None:
        pytest.skip("no folded steps on this build")
    if eng.ctx.head is not None:
        eng.ctx.head.one_row = False  # one-row decodes take llama.cpp's layer (a run's rows)
    return eng


def _generate(eng, prompts, n_predict, fold: bool):
    """Greedy generations of `prompts` side by side (one slot each), with or without
    folding; (tokens, finish reasons, KV histories, steps) per prompt."""
    kept, eng.fold = eng.fold, (eng.fold if fold else None)
    try:
        eng.ctx.clear()
        sts = [eng.start(i, Request(prompt=eng.model.tokenize(p), sampling=GREEDY,
                                    n_predict=n_predict, cache_prompt=False))
               for i, p in enumerate(prompts)]
        toks = [[] for _ in sts]
        for i, st in enumerate(sts):
            out = None
            while out is None:
                out = eng.prefill(st)
            toks[i] += out.tokens
        while not all(st.done for st in sts):
            for i, o in enumerate(eng.step(sts)):
                toks[i] += o.tokens
        result = ([t for t in toks], [st.finish_reason for st in sts],
                  [st.tokens[:st.n_hist].tolist() for st in sts], [st.steps for st in sts],
                  [eng.ctx.positions(st.seq_id) for st in sts])
        for st in sts:
            eng.finish(st)
        return result
    finally:
        eng.fold = kept


@pytest.mark.parametrize("one_row", [False, True])
def test_folded_steps_equal_engine_steps_at_one_and_two_slots(fast, one_row):
    """At one slot with llama.cpp's layer (one_row False) or ours, and at two slots (ours
    where the start-up check turned it on: fold.c's own check of its rows)."""
    prompts = [(FIXTURES / "story.txt").read_text()[:1500], (FIXTURES / "refactor.txt").read_text()[:1500]]
    head = fast.ctx.head
    if one_row and head is None:
        pytest.skip("our output layer is off here")
    if head is not None:
        head.one_row = one_row
    try:
        for group in (prompts[:1], prompts):
            before = fast.fold.n_folded
            ref = _generate(fast, group, 90, fold=False)
            got = _generate(fast, group, 90, fold=True)
            assert got == ref
            assert fast.fold.n_folded - before >= 60  # most of the 89 steps folded
            assert all(r == "length" for r in got[1])
    finally:
        if head is not None:
            head.one_row = False


def test_a_run_whose_kept_rows_are_not_the_sequences_fails_before_any_token(fast, monkeypatch):
    """fold.c checks our output layer's kept rows as Hook.fill does: rows read at other
    positions than the sequences' (here: the check reads a buffer of zeros) end the run
    at its first step with no token taken, the step's cells dropped, and the engine's
    step raises as a decode that failed does."""
    head = fast.ctx.head
    if head is None or fast.fold._head_fn is None:
        pytest.skip("our output layer is off here")
    zeros = np.zeros(16, np.int32)
    monkeypatch.setattr(fast.fold.run_, "row_pos", zeros.ctypes.data)
    prompts = [(FIXTURES / "story.txt").read_text()[:600], (FIXTURES / "refactor.txt").read_text()[:600]]
    fast.ctx.clear()
    sts = [fast.start(i, Request(prompt=fast.model.tokenize(p), sampling=GREEDY, n_predict=20,
                                 cache_prompt=False)) for i, p in enumerate(prompts)]
    try:
        for st in sts:
            while fast.prefill(st) is None:
                pass
        hist = [st.n_hist for st in sts]
        with pytest.raises(RuntimeError, match="output layer's rows"):
            fast.step(sts)
        assert [st.n_hist for st in sts] == hist
        assert [fast.ctx.positions(st.seq_id)[1] for st in sts] == [h - 1 for h in hist]
    finally:
        fast.fold._wire_head(head)
        for st in sts:
            fast.finish(st)


def test_a_run_stops_at_an_end_of_generation_token(fast, monkeypatch):
    """An end-of-generation token sampled inside a run ends it there: the same tokens,
    finish reason, history and KV as step by step."""
    prompt = (FIXTURES / "story.txt").read_text()[:1200]
    free = _generate(fast, [prompt], 40, fold=False)[0][0]
    eog = free[17]
    monkeypatch.setattr(fast.model, "is_eog", lambda t: t == eog)
    fast.fold._eog[eog] = 1
    try:
        ref = _generate(fast, [prompt], 40, fold=False)
        got = _generate(fast, [prompt], 40, fold=True)
    finally:
        fast.fold._eog[eog] = fast.model._eog[eog]
    assert got == ref
    assert got[1] == ["stop"] and len(got[0][0]) == free.index(eog)


@pytest.mark.parametrize("case", ["auto-resting", "auto-active", "ngram-map-k", "ngram-mod",
                                  "ngram-mod-2", "auto-resting-2"])
def test_the_drafters_looks_in_a_run_are_the_engines(case, fast_model_path, threads, monkeypatch):
    """The looks a run makes before its steps (a resting sequence's watch, every drafter of
    an active one or of a fixed type) are the ones `Engine.step` makes: the same calls,
    proposals, drafts and tokens, a look that finds a draft ending the run before its step
    (and resumed there, not asked again: ngram-map-k counts hits per call). auto is made
    deterministic: its Rests kept resting (watching every step) or active, every plan
    declined; the fixed types are deterministic as they are. "-2": two slots side by side
    (their two-row decodes folded through our output layer where it is on)."""
    from ngramspec.engine.runtime import load_engine
    from ngramspec.settings.engine import EngineSettings
    from ngramspec.speculative import policy as P
    from ngramspec.speculative.rest import Rest, Rests

    slots = 2 if case.endswith("-2") else 1
    case = case.removesuffix("-2")
    spec = SpecConfig(types=(case.split("-")[0] if case.startswith("auto") else case,),
                      policy="cost" if case.startswith("auto") else "fixed")
    if case.startswith("auto"):
        monkeypatch.setattr(Rest, "decode", lambda self, *a: None)  # never changes its mind
        of = Rests.of

        def fixed(self, seq_id):
            r = of(self, seq_id)
            r.active = case == "auto-active"
            return r

        monkeypatch.setattr(Rests, "of", fixed)
        monkeypatch.setattr(P.CostPolicy, "plan", lambda self, options, *a: [0] * len(options))

    def engine():  # a fresh pool each time: ngram-mod's table remembers earlier outputs
        eng = load_engine(EngineSettings(model=fast_model_path, threads=threads,
                                         n_ctx=4096 * slots, n_seq=slots, spec=spec))
        if eng.fold is None:
            pytest.skip("no folded steps on this build")
        if eng.ctx.head is not None:
            eng.ctx.head.one_row = False
        return eng

    prompts = [(FIXTURES / "refactor.txt").read_text(), (FIXTURES / "story.txt").read_text()]
    runs = []
    orig = F.Fold.run

    def recorded(self, *a):
        out = orig(self, *a)
        runs.append((F.WHY[self.run_.why], self.seqs[0].n_watch + self.seqs[0].n_all))
        return out

    monkeypatch.setattr(F.Fold, "run", recorded)

    def stats(eng):
        return {k: (v.n_call_draft, v.n_prop_drafts, v.n_prop_tokens, v.n_gen_drafts,
                    v.n_gen_tokens, v.n_acc_tokens) for k, v in eng.stats().items()}

    ref_eng, eng = engine(), engine()
    ref = _generate(ref_eng, prompts[:slots], 150, fold=False)
    got = _generate(eng, prompts[:slots], 150, fold=True)
    assert got == ref
    assert stats(eng) == stats(ref_eng)
    assert eng.fold.n_folded > 20
    assert "look" in {w for w, _ in runs}  # a draft found in C ended a run before its step
    assert sum(n for _, n in runs) > 10  # and the looks in C found nothing elsewhere


def test_a_runs_looks_are_what_each_rest_decides_at_two_slots(fast_model_path, threads,
                                                              monkeypatch):
    """The looks a run schedules (`Fold._schedule`: each sequence's Rest copied and stepped
    through the run's decodes) are what the sequence's own Rest decides at each of those
    steps as the run's decodes are replayed into it, at two slots too, where a declined
    period step waits for the decline gap (rest.py: crowded decodes); a copy stepped as
    if alone looked at steps its Rest rested in, each look that found a draft ending the
    run for nothing. Deterministic: every plan declined, the period fixed."""
    from ngramspec.engine.runtime import load_engine
    from ngramspec.settings.engine import EngineSettings
    from ngramspec.speculative import policy as P
    from ngramspec.speculative.rest import Rest

    plan = P.CostPolicy.plan
    monkeypatch.setattr(P.CostPolicy, "plan",  # declined, as seen by the Rests (`proposed`)
                        lambda self, options, *a: [0 for _ in plan(self, options, *a)])
    monkeypatch.setattr(Rest, "period", lambda self: 3)
    eng = load_engine(EngineSettings(model=fast_model_path, threads=threads, n_ctx=8192,
                                     n_seq=2, spec=SpecConfig(types=("auto",), policy="cost")))
    if eng.fold is None:
        pytest.skip("no folded steps on this build")
    checked, orig = [], F.Fold._replay

    def replay(self, engine, active, hist0, seconds, toks, observed):
        policy, step = engine.policy, [0]
        observe = policy.observe_decode

        def observed_decode(shapes, sec):
            s = step[0]
            for j, st in enumerate(active):
                rest, watch = policy.rest_of(st.seq_id), st.speculation.chain._watch
                want = (F.ALL if rest.active else
                        F.WATCH if rest.watching and watch is not None else F.NONE)
                if s > 0:
                    checked.append((int(self.look[j, s]), want))
            step[0] += 1
            observe(shapes, sec)

        policy.observe_decode = observed_decode
        try:
            return orig(self, engine, active, hist0, seconds, toks, observed)
        finally:
            del policy.observe_decode

    monkeypatch.setattr(F.Fold, "_replay", replay)
    prompts = [(FIXTURES / "refactor.txt").read_text(), (FIXTURES / "story.txt").read_text()]
    _generate(eng, prompts, 200, fold=True)
    assert len(checked) > 100 and {w for _, w in checked} >= {F.NONE, F.ALL}
    assert [g for g, _ in checked] == [w for _, w in checked]
