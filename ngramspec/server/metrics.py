"""Prometheus text for GET /metrics: llama-server's metrics under its `llamacpp:` prefix
(so that a llama-server dashboard works unchanged), its speculative-decoding counters
(`spec_decode_*`, as llama.cpp's server has them), and ours (requests, slots, the n-gram
pool, each drafter's proposals: `spec_drafter_*{drafter="..."}`) under the same prefix."""
from __future__ import annotations

from ..speculative.stats import total

PREFIX = "llamacpp:"


def _fmt(v: float) -> str:
    if isinstance(v, bool):
        v = int(v)
    if isinstance(v, int):
        return str(v)
    return repr(float(v))


def render(sched, engine) -> str:
    c = sched.counters
    stats = engine.stats()
    t = total(stats)
    counters = [
        ("requests_total", "Requests accepted (started or queued)", c.requests_total),
        ("requests_finished_total", "Requests that finished generating", c.requests_finished),
        ("requests_cancelled_total", "Requests whose client disconnected", c.requests_cancelled),
        ("requests_failed_total", "Requests that failed after being accepted", c.requests_failed),
        ("requests_rejected_total", "Requests refused because the queue was full", c.requests_rejected),
        ("requests_deferred_total", "Requests that waited for a free slot", c.requests_deferred_total),
        ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens",
         c.prompt_tokens),
        ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache",
         c.prompt_tokens_cached),
        ("prompt_seconds_total", "Total time spent processing prompts", c.prompt_seconds),
        ("tokens_predicted_total", "Number of generation tokens processed", c.predicted_tokens),
        ("tokens_predicted_seconds_total", "Total time spent generating tokens", c.predicted_seconds),
        ("n_decode_total", "llama_decode() calls: prompt chunks and batched generation steps",
         c.n_decode),
        ("n_tokens_max", "Largest observed sequence length (prompt + generation)", c.n_tokens_max),
        ("spec_decode_num_drafts_total", "Speculative: verification steps with a draft",
         t.n_gen_drafts),
        ("spec_decode_num_draft_tokens_total", "Speculative: total draft tokens generated",
         t.n_gen_tokens),
        ("spec_decode_num_accepted_tokens_total",
         "Speculative: total draft tokens accepted by the target model", t.n_acc_tokens),
        ("spec_rested_steps_total", "Sequence steps (a slot in a generation step) in which "
         "the draft policy proposed nothing: proposing had not paid for that slot's host time "
         "lately", engine.policy.n_rested),
    ]
    pool = engine.pool
    gauges = [
        ("prompt_tokens_seconds", "Average prompt throughput in tokens/s",
         c.prompt_tokens / c.prompt_seconds if c.prompt_seconds else 0.0),
        ("predicted_tokens_seconds", "Average generation throughput in tokens/s",
         c.predicted_tokens / c.predicted_seconds if c.predicted_seconds else 0.0),
        ("requests_processing", "Number of requests processing (busy slots)", sched.n_busy()),
        ("slots_busy", "Busy slots", sched.n_busy()),
        ("slots_total", "Slots (-np/--parallel)", len(sched.slots)),
        ("requests_deferred", "Requests waiting for a free slot", sched.n_deferred()),
        ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
         c.n_busy_slots / max(c.n_decode, 1)),
        ("spec_pool_bytes", "Bytes of the shared n-gram hash pool", pool.nbytes),
        ("spec_pool_used_entries", "Occupied entries of the shared n-gram hash pool", pool.used),
        ("spec_pool_occupancy", "Fraction of the shared n-gram hash pool in use", pool.occupancy),
        ("spec_pool_resets", "Times the shared pool was cleared", getattr(pool, "resets", 0)),
    ]
    lines = []
    for kind, items in (("counter", counters), ("gauge", gauges)):
        for name, help_, value in items:
            lines += [f"# HELP {PREFIX}{name} {help_}", f"# TYPE {PREFIX}{name} {kind}",
                      f"{PREFIX}{name} {_fmt(value)}"]
    lines += _per_drafter(stats)
    name = f"{PREFIX}spec_decode_num_accepted_tokens_per_pos_total"
    lines += [f"# HELP {name} Speculative: accepted tokens per draft position",
              f"# TYPE {name} counter"]
    for i, v in enumerate(t.acc_per_pos):
        lines.append(f'{name}{{position="{i}"}} {v}')
    return "\n".join(lines) + "\n"


#: per-drafter counter families: (name, help, DrafterStats field)
DRAFTER_COUNTERS = (
    ("spec_drafter_proposed_drafts_total", "Drafts this drafter proposed (verified or not)",
     "n_prop_drafts"),
    ("spec_drafter_declined_drafts_total", "Of them, drafts the policy did not verify",
     "n_declined"),
    ("spec_drafter_drafts_total", "Drafts of this drafter verified", "n_gen_drafts"),
    ("spec_drafter_draft_tokens_total", "Draft tokens of this drafter verified", "n_gen_tokens"),
    ("spec_drafter_accepted_tokens_total", "Of them, tokens the target model accepted",
     "n_acc_tokens"),
)


def _per_drafter(stats: dict) -> list[str]:
    """Each drafter's counters (`Engine.stats()`), labelled by its name; the
    spec_decode_* totals are their sums."""
    lines = []
    for name, help_, key in DRAFTER_COUNTERS:
        lines += [f"# HELP {PREFIX}{name} {help_}", f"# TYPE {PREFIX}{name} counter"]
        lines += [f'{PREFIX}{name}{{drafter="{d}"}} {getattr(st, key)}'
                  for d, st in sorted(stats.items())]
    return lines
