"""Several sequences of one engine decoded together, as the scheduler runs its slots."""
from __future__ import annotations

from ngramspec.engine.request import Request
from ngramspec.settings.sampling import SamplingParams


def run_together(engine, prompts, samplings, n_predict):
    """Prompt i (token ids) starts in slot i with samplings[i]; each prompt is prefilled,
    then every sequence steps in the same decodes until all are done. Returns the tokens
    per slot and the finished SeqStates (their samplers and draft counts)."""
    states = [engine.start(i, Request(prompt=p, sampling=sp, n_predict=n_predict))
              for i, (p, sp) in enumerate(zip(prompts, samplings))]
    toks = []
    for st in states:
        first = None
        while first is None:
            first = engine.prefill(st)
        toks.append(list(first.tokens))
    while not all(st.done for st in states):
        for i, out in enumerate(engine.step(states)):
            toks[i].extend(out.tokens)
    for st in states:
        engine.finish(st)
    return toks, states


def run_alone(engine, prompt, n_predict, seq_id=0, chunk=512, **request):
    """One sequence alone, greedy unless `request` gives a sampling: prefilled in chunks
    of `chunk`, stepped until done, finished. `request`: Request's other fields
    (speculative, prediction, cache_prompt, context_shift, ...). Returns the tokens and
    the finished SeqState."""
    request.setdefault("sampling", SamplingParams(temperature=0.0))
    st = engine.start(seq_id, Request(prompt=prompt, n_predict=n_predict, **request))
    try:
        first = None
        while first is None:
            first = engine.prefill(st, chunk)
        toks = list(first.tokens)
        while not st.done:
            toks += engine.step([st])[0].tokens
        return toks, st
    finally:
        engine.finish(st)
