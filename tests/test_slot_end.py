"""Decodes up to the last cell of a slot: padding rows (logit rows rounded up to the
sgemm quantum) never go past the slot's cells (regression: llama.cpp's
test_slot_ctx_not_exceeded, a 249-token prompt in a 256-cell context with drafts,
failed with "llama_decode failed" once logit rows were rounded up to 4)."""
import pytest

from ngramspec.llama.context import Context, ContextParams

pytestmark = pytest.mark.model


@pytest.mark.parametrize("n_verify", [3, 5, 6, 7])
def test_a_verify_that_ends_at_the_last_cell_is_not_padded_past_it(model, threads, n_verify):
    ctx = Context(model, ContextParams(n_ctx=256, n_threads=threads))
    try:
        toks = list(model.tokenize("Hello " * 300))
        end = ctx.n_ctx_seq
        ctx.prefill(0, toks[:end - n_verify], 0)
        rows = ctx.decode([(0, toks[end - n_verify:end], end - n_verify, True)])[0]
        assert len(rows) == n_verify and ctx.positions(0)[1] == end - 1
    finally:
        ctx.close()
