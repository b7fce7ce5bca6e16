"""llama.cpp's ubatch split, reproduced in Python, on hand-written batches (no model)."""
from __future__ import annotations

import itertools

import pytest

from ngramspec.llama.ubatch import invariant_violation, pads_needed, split


def split_equal_tokenwise(lengths, n_ubatch):
    """llama-batch.cpp's split_equal(n_ubatch, sequential=true), token by token."""
    seqs = [s for s, n in lengths for _ in range(n)]
    used = [False] * len(seqs)
    by_seq = {}
    for i, s in enumerate(seqs):
        by_seq.setdefault(s, []).append(i)
    cursor = {s: 0 for s in by_seq}
    out = []
    while not all(used):
        cur = []
        for i, s in enumerate(seqs):
            if used[i] or s in cur or (cur and s != cur[-1] + 1):
                continue
            cur.append(s)
            if len(cur) > n_ubatch:
                break
        taken = {s: 0 for s in cur}
        while all(cursor[s] < len(by_seq[s]) for s in cur):
            for s in cur:
                used[by_seq[s][cursor[s]]] = True
                cursor[s] += 1
                taken[s] += 1
            if (taken[cur[0]] + 1) * len(cur) > n_ubatch:
                break
        out.append(taken)
    return out


def test_length_split_equals_the_tokenwise_port():
    rng = __import__("random").Random(7)
    for _ in range(500):
        ids = sorted(rng.sample(range(10), rng.randint(1, 6)))
        lengths = [(s, rng.choice([1, 2, 3, 5, 8, 63])) for s in ids]
        n_ubatch = rng.choice([4, 16, 512])
        assert takes(lengths, n_ubatch=n_ubatch) == split_equal_tokenwise(lengths, n_ubatch)


def takes(lengths, streams=True, n_ubatch=512):
    return [dict(ub.take) for ub in split(lengths, n_ubatch, streams)]


def test_equal_lengths_make_one_ubatch():
    assert takes([(s, 2) for s in range(8)]) == [{s: 2 for s in range(8)}]
    assert takes([(s, 1) for s in range(4)]) == [{0: 1, 1: 1, 2: 1, 3: 1}]


def test_a_longer_sequence_is_finished_alone():
    # issue 12: sequence 0's third token is evaluated alone
    assert takes([(0, 3), (1, 2), (2, 2), (3, 2)]) == [{0: 2, 1: 2, 2: 2, 3: 2}, {0: 1}]
    assert takes([(0, 1), (1, 5)]) == [{0: 1, 1: 1}, {1: 4}]


def test_only_consecutive_sequence_ids_share_a_ubatch():
    assert takes([(0, 2), (1, 2), (3, 2)]) == [{0: 2, 1: 2}, {3: 2}]
    assert takes([(0, 2), (1, 3), (2, 2), (3, 4)]) == [{0: 2, 1: 2, 2: 2, 3: 2}, {1: 1}, {3: 2}]


def test_n_ubatch_bounds_tokens_per_ubatch():
    assert takes([(0, 5), (1, 5)], n_ubatch=4) == [{0: 2, 1: 2}, {0: 2, 1: 2}, {0: 1, 1: 1}]
    assert takes([(0, 10)], streams=False, n_ubatch=4) == [{0: 4}, {0: 4}, {0: 2}]


def test_one_stream_is_one_ubatch_in_batch_order():
    assert takes([(0, 3), (1, 2)], streams=False) == [{0: 3, 1: 2}]


def test_violations():
    assert invariant_violation(split([(0, 1)], 512, False)) is not None
    assert invariant_violation(split([(0, 3), (1, 2)], 512, True)) is not None
    assert invariant_violation(split([(0, 64)], 512, False)) is not None
    assert invariant_violation(split([(0, 63), (1, 63)], 512, True)) is None  # per stream
    assert invariant_violation(split([(0, 1), (1, 1), (2, 1)], 512, True)) is None
    assert invariant_violation(split([(0, 2), (1, 1), (2, 1)], 512, True)) is not None


def test_pads_only_where_a_token_would_be_alone():
    assert pads_needed([(0, 1)], 512, False) == {0: 1}
    assert pads_needed([(s, 1) for s in range(8)], 512, True) == {}
    assert pads_needed([(0, 3), (1, 2), (2, 2), (3, 2)], 512, True) == {0: 1}
    assert pads_needed([(0, 2), (1, 3), (2, 2), (3, 4)], 512, True) == {1: 1}


@pytest.mark.parametrize("streams", [True, False])
def test_padding_always_yields_an_invariant_split(streams):
    for lens in itertools.product([0, 1, 2, 3, 5, 17], repeat=4):
        lengths = [(s, n) for s, n in enumerate(lens) if n]
        if not lengths:
            continue
        pads = pads_needed(lengths, 512, streams)
        padded = [(s, n + pads.get(s, 0)) for s, n in lengths]
        assert invariant_violation(split(padded, 512, streams)) is None, (lengths, pads)
        assert sum(pads.values()) <= len(lengths)


def test_layout_evens_out_logit_rows():
    from ngramspec.llama.ubatch import layout

    one = layout([(0, 5, 5)], 512, False)  # single stream: a padding row with logits
    assert one.pads == {0: 1} and one.pad_logits == {0: 1} and one.logits == (6,)
    assert layout([(0, 4, 4)], 512, False).pads == {}
    assert layout([(0, 1, 1)], 512, False).logits == (1,)  # one logit row: the pad stays plain
    assert layout([(0, 63, 63)], 512, False).pads == {}  # no room under the 64-row limit
    # streams: [3, 2, 2, 2] pads sequence 0's lone token; that pad row evens the last ubatch?
    lay = layout([(0, 3, 3), (1, 2, 2), (2, 2, 2), (3, 2, 2)], 512, True)
    assert lay.pads == {0: 1} and lay.logits == (8, 1)
    # [3, 3, 3]: one ubatch of 9 logit rows and no padding row to give logits: priced, not padded
    lay = layout([(0, 3, 3), (1, 3, 3), (2, 3, 3)], 512, True)
    assert lay.pads == {} and lay.logits == (9,)
    # prefill-like entry: logits on the last token only
    assert layout([(0, 10, 1)], 512, False).logits == (1,)


def test_layout_rounds_logit_rows_to_the_sgemm_quantum():
    """With 32 vector registers (AVX-512) llamafile's sgemm takes 4 logit columns per
    pass over the output layer: a ragged count (5-7, 9-11, ...) is padded up."""
    from ngramspec.llama.ubatch import layout, ragged

    assert [n for n in range(1, 14) if ragged(n, 4)] == [5, 6, 7, 9, 10, 11, 13]
    assert [n for n in range(1, 8) if ragged(n, 2)] == [3, 5, 7]
    for n in range(2, 61):
        lay = layout([(0, n, n)], 512, False, quantum=4)
        assert not ragged(lay.logits[0], 4) and lay.logits[0] - n < 4
        assert lay.pads.get(0, 0) == lay.pad_logits.get(0, 0) == lay.logits[0] - n
    assert layout([(0, 3, 3)], 512, False, quantum=4).pads == {}  # one pass already
    assert layout([(0, 62, 62)], 512, False, quantum=4).pads == {}  # would reach 64 rows
    assert layout([(0, 7, 7)], 8, False, quantum=4).logits == (8,)  # fits the ubatch
    assert layout([(0, 7, 7)], 7, False, quantum=4).pads == {}  # would split it


def test_logit_padding_stays_inside_the_slot():
    """Near the end of a slot's cells there is no room for padding rows: priced, not padded."""
    from ngramspec.llama.ubatch import layout

    assert layout([(0, 5, 5)], 512, False, quantum=4, room=3).logits == (8,)
    assert layout([(0, 5, 5)], 512, False, quantum=4, room=2).pads == {}


def test_a_layout_no_longer_depends_on_the_room_from_room_bound():
    """`Context.layout_for` memoises a layout under min(room, room_bound(entries)): every
    room from the bound on gives the layout of an unlimited room, on single-stream and
    per-sequence-stream contexts, for every quantum."""
    from ngramspec.llama.ubatch import layout, room_bound

    shapes = [[(0, 1, 1)], [(0, 3, 3)], [(0, 5, 5), (1, 1, 1)], [(0, 1, 1), (1, 1, 1), (2, 7, 7)],
              [(s, 1 + (s % 3), 1 + (s % 3)) for s in range(8)]]
    for entries, streams, quantum in itertools.product(shapes, (False, True), (1, 2, 4)):
        free = layout(entries, 512, streams, True, quantum, None)
        for room in range(room_bound(entries), room_bound(entries) + 40):
            assert layout(entries, 512, streams, True, quantum, room) == free, (entries, room)
