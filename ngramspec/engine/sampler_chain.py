"""llama.cpp's sampler chain, as llama-server builds it (common/sampling.cpp).

Order: the logit biases; the grammar; then, without mirostat, each sampler of
`SamplingParams.samplers` in its order (default `DEFAULT_ORDER`: penalties, dry,
top_n_sigma, top_k, typ_p, top_p, min_p, xtc, temperature) and the final draw
(`dist`, or `greedy` when temperature <= 0: llama.cpp's temperature sampler then
keeps the top token alone, so the samplers that always keep the top token,
`KEEP_TOP`, change nothing and are left out); with mirostat 1 or 2, temperature and
the mirostat sampler instead. A sampler whose settings make it a no-op is left out.

Invariants:
- The chain's samplers that keep history (penalties, dry) are returned in `parts`
  as well, so the sequence's prompt can be accepted into them alone (llama-server
  accepts the prompt into every sampler but the grammar; the others keep nothing).
- Every sampler with a random draw (xtc, dist, mirostat) draws once per apply, and
  the chain is applied once per emitted token (sampling.py), so a fixed seed gives
  the same tokens with speculation on and off.
"""
from __future__ import annotations

import ctypes

from ..settings.sampling import KEEP_TOP, active


def _sampler(lc, ctx, p, name: str):
    """One llama.cpp sampler of the chain, or None where it is not `active`
    (settings/sampling.py)."""
    if not active(p, name):
        return None
    if name == "penalties":
        return lc.llama_sampler_init_penalties(ctx.n_vocab, p.repeat_last_n, p.repeat_penalty,
                                               p.frequency_penalty, p.presence_penalty)
    if name == "dry":
        raw = [b.encode() for b in p.dry_sequence_breakers]
        arr = (ctypes.c_char_p * len(raw))(*raw)
        last_n = p.dry_penalty_last_n if p.dry_penalty_last_n >= 0 else ctx.n_ctx_seq  # -1: all
        return lc.llama_sampler_init_dry(ctx.model.vocab, p.dry_multiplier, p.dry_base,
                                         p.dry_allowed_length, last_n, arr, len(raw))
    if name == "top_n_sigma":
        return lc.llama_sampler_init_top_n_sigma(p.top_n_sigma)
    if name == "top_k":
        return lc.llama_sampler_init_top_k(p.top_k)
    if name == "typ_p":
        return lc.llama_sampler_init_typical(p.typical_p, p.min_keep)
    if name == "top_p":
        return lc.llama_sampler_init_top_p(p.top_p, max(p.min_keep, 1))
    if name == "min_p":
        return lc.llama_sampler_init_min_p(p.min_p, max(p.min_keep, 1))
    if name == "xtc":
        return lc.llama_sampler_init_xtc(p.xtc_probability, p.xtc_threshold, p.min_keep,
                                         p.seed & 0xFFFFFFFF)
    return lc.llama_sampler_init_temp_ext(p.temperature, p.dynatemp_range, p.dynatemp_exponent)


def add_samplers(lc, chain, ctx, p) -> dict[str, object]:
    """Add the samplers after the biases and the grammar (module docstring) to `chain`;
    returns the history-keeping ones by name ("penalties", "dry")."""
    parts: dict[str, object] = {}
    if p.mirostat:  # temperature <= 0: llama.cpp's temp sampler keeps the top token alone
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(p.temperature))
        seed = p.seed & 0xFFFFFFFF
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_mirostat(
            ctx.n_vocab, seed, p.mirostat_tau, p.mirostat_eta, 100) if p.mirostat == 1
            else lc.llama_sampler_init_mirostat_v2(seed, p.mirostat_tau, p.mirostat_eta))
        return parts
    for name in p.samplers:
        if p.greedy and name in KEEP_TOP:
            continue
        s = _sampler(lc, ctx, p, name)
        if s is not None:
            lc.llama_sampler_chain_add(chain, s)
            if name in ("penalties", "dry"):
                parts[name] = s
    final = lc.llama_sampler_init_greedy() if p.greedy else lc.llama_sampler_init_dist(
        p.seed & 0xFFFFFFFF)
    lc.llama_sampler_chain_add(chain, final)
    return parts
