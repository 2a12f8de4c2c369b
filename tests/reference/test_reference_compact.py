"""Compact rows against a plain reference built from the plan and the examples, row by row.

Row ``r`` of a packing holds its occurrences in column order, each as its
window (``len + 1`` tokens) and its flags; ``to_batch`` lays them out as the
per-cell reference does; labels are the window's tokens where supervised and
``-100`` elsewhere (and on every window's first token).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactpack import ExampleTable, InvalidInput, SequenceExample, Split, plan_rows
from exactpack.core import compact as compact_mod
from exactpack.core.compact import compact_rows, gather_segments, span_labels
from exactpack.core.policies import POLICIES
from exactpack.verify.fixture import fixture_binding, fixture_examples

from support.reference import Layout, Placed
from support.strategies import BINDING, example_lists


def reference_rows(examples, plan):
    """Per row: [(ordinal, start, window, flags, source id, example id, range)] by column."""
    rows = [[] for _ in range(plan.num_rows)]
    for i, ex in enumerate(examples):
        rows[int(plan.row_of[i])].append(
            (
                i,
                int(plan.start_of[i]),
                ex.window.tolist(),
                ex.loss_mask.tolist(),
                ex.source_id,
                ex.example_id,
                ex.range,
            )
        )
    return [sorted(row, key=lambda occ: occ[1]) for row in rows]


def labels_of(window, flags):
    return [-100] + [t if f else -100 for t, f in zip(window[1:], flags, strict=True)]


def assert_rows_equal(rows, want, first_row=0):
    flat = [occ for row in want for occ in row]
    assert rows.num_rows == len(want) and rows.first_row == first_row and len(rows) == len(flat)
    assert rows.tokens.tolist() == [t for occ in flat for t in occ[2]]
    assert rows.loss_mask.tolist() == [f for occ in flat for f in occ[3]]
    assert rows.lengths.tolist() == [len(occ[2]) - 1 for occ in flat]
    assert rows.starts.tolist() == [occ[1] for occ in flat]
    assert rows.ordinals.tolist() == [occ[0] for occ in flat]
    assert rows.source_ids.tolist() == [occ[4] for occ in flat]
    assert rows.example_ids.tolist() == [occ[5] for occ in flat]
    assert list(zip(rows.range_starts.tolist(), rows.range_ends.tolist(), strict=True)) == [
        occ[6] for occ in flat
    ]
    counts = [len(row) for row in want]
    assert rows.row_offsets.tolist() == [sum(counts[:r]) for r in range(len(counts) + 1)]
    assert rows.row_of.tolist() == [r for r, n in enumerate(counts) for _ in range(n)]
    sizes = [len(occ[2]) for occ in flat]
    assert rows.token_offsets.tolist() == [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    pairs = [len(occ[3]) for occ in flat]
    assert rows.target_offsets.tolist() == [sum(pairs[:i]) for i in range(len(pairs) + 1)]
    labels = [label for occ in flat for label in labels_of(occ[2], occ[3])]
    assert rows.labels().tolist() == labels and rows.labels(native=False).tolist() == labels
    assert rows.labels().dtype == np.int32


def assert_batch_is_reference(batch, want, capacity):
    placed = [
        Placed(occ[0], r, occ[1], occ[1] + len(occ[2]) - 1, occ[2], occ[3])
        for r, row in enumerate(want)
        for occ in row
    ]
    layout = Layout.build(placed, len(want), capacity)
    for name, cells in layout.cells().items():
        assert getattr(batch, name).tolist() == cells, name


@given(
    example_lists(max_capacity=10, max_examples=12),
    st.sampled_from(sorted(POLICIES)),
    st.integers(1, 4),
    st.booleans(),
)
def test_compact_rows_are_the_plain_row_by_row_layout(case, policy, per, native):
    examples, capacity = case
    table = ExampleTable.from_examples(examples, Split.TRAIN, BINDING)
    plan = plan_rows(table.lengths, capacity, policy)
    rows = compact_rows(table, plan, native=native)
    want = reference_rows(examples, plan)
    assert_rows_equal(rows, want)
    assert rows.capacity == capacity and rows.partition is Split.TRAIN
    assert rows.binding == BINDING
    first = 0
    for batch in rows.batches(per):
        stop = min(first + per, len(want))
        assert batch.first_row == first and batch.shape == (stop - first, capacity)
        assert_batch_is_reference(batch, want[first:stop], capacity)
        assert_rows_equal(rows.slice_rows(first, stop), want[first:stop], first)
        first = stop
    assert first == len(want)


def test_rows_in_supplied_order_share_the_tables_arrays():
    rng = np.random.default_rng(5)
    exs = [
        SequenceExample.from_document(
            rng.integers(0, 266, size=n), source_id=f"s{i}", partition="train", binding=BINDING
        )
        for i, n in enumerate([3, 6, 4, 5, 2, 7])
    ]
    table = ExampleTable.from_examples(exs, "train", BINDING)
    kept = compact_rows(table, plan_rows(table.lengths, 8, "next-fit"))
    assert np.shares_memory(kept.tokens, table.windows)
    assert np.shares_memory(kept.loss_mask, table.loss_mask)
    assert kept.ordinals.tolist() == list(range(6))
    moved = compact_rows(table, plan_rows(table.lengths, 8, "best-fit-decreasing"))
    assert not np.shares_memory(moved.tokens, table.windows)
    assert np.shares_memory(moved.loss_mask, table.loss_mask)  # uniform flags: shared
    masked = ExampleTable.from_examples(
        [
            SequenceExample.from_document(
                list(range(n + 1)), source_id=f"m{i}", partition="train", binding=BINDING,
                loss_mask=[j % 2 == 0 for j in range(n)],
            )
            for i, n in enumerate([2, 5, 3, 4])
        ],
        "train",
        BINDING,
    )  # fmt: skip
    gathered = compact_rows(masked, plan_rows(masked.lengths, 6, "best-fit-decreasing"))
    assert not np.shares_memory(gathered.loss_mask, masked.loss_mask)


def test_a_plan_for_other_examples_is_refused():
    table = ExampleTable.from_examples(fixture_examples(), "train", fixture_binding())
    for lengths in ([3, 2], [3, 2, 5]):
        with pytest.raises(InvalidInput) as err:
            compact_rows(table, plan_rows(lengths, 6))
        assert str(err.value) == "plan lengths do not match the examples supplied"


@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 6)), max_size=12), st.booleans())
def test_gather_segments_is_the_plain_concatenation(pairs, native):
    src = np.arange(100, 170, dtype=np.int32)
    starts = [s for s, _ in pairs]
    lengths = [n for _, n in pairs]
    out = gather_segments(src, np.array(starts), np.array(lengths), native)
    assert out.dtype == np.int32
    assert out.tolist() == [int(src[s + j]) for s, n in pairs for j in range(n)]


def test_the_numpy_gather_works_in_chunks(monkeypatch):
    monkeypatch.setattr(compact_mod, "GATHER_CHUNK", 3)
    src = np.arange(50, dtype=np.int64)
    starts, lengths = np.array([40, 0, 7, 20]), np.array([5, 2, 9, 1])
    want = [s + j for s, n in zip(starts.tolist(), lengths.tolist(), strict=True) for j in range(n)]
    assert gather_segments(src, starts, lengths, native=False).tolist() == want


@given(st.lists(st.lists(st.booleans(), min_size=1, max_size=5), max_size=6), st.booleans())
def test_window_labels_by_hand(flag_lists, native):
    windows = [[7 + k + j for j in range(len(flags) + 1)] for k, flags in enumerate(flag_lists)]
    tokens = np.array([t for w in windows for t in w], dtype=np.int32)
    mask = np.array([f for flags in flag_lists for f in flags], dtype=bool)
    lengths = np.array([len(f) for f in flag_lists], dtype=np.int64)
    want = [label for w, f in zip(windows, flag_lists, strict=True) for label in labels_of(w, f)]
    got = span_labels(tokens, mask, lengths, native)
    assert got.dtype == np.int32 and got.tolist() == want
