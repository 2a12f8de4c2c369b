"""Every view of a packed batch against a per-cell reference rebuilt from the occurrence records.

The reference (``tests/support/reference.py``) starts from the records alone (row,
start and end columns, ordinal) and the examples supplied, places each
occurrence cell by cell and answers the permission as "same occurrence, key
at or before the query" — it never reads ``segments``/``positions`` and
never calls ``allowed_key``. So a bug that mislabels cells (every cell of a
batch the batch-local index as its segment, a whole row one segment, a
position off by one) shows up as a difference in the cells or in a view.
"""

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exactpack import (
    Binding,
    BindingMismatch,
    ExampleTable,
    InvalidInput,
    PackConfig,
    Split,
    SplitMismatch,
    materialize,
    pack_examples,
    plan_rows,
)
from exactpack.core import config as budget
from exactpack.core.batch import CELL_FIELDS, PackedBatch, fill_cells
from exactpack.core.permission import tiled_edges
from exactpack.core.policies import POLICIES
from exactpack.training.packed_data import PackedCollator, empty_batch
from exactpack.verify.fixture import fixture_batch, fixture_binding, fixture_examples

from support.reference import Layout, placed_from_records, reference_next_fit, stream_plan
from support.strategies import BINDING, example_lists, scaled


@st.composite
def packings(draw):
    examples, capacity = draw(example_lists(max_capacity=10, max_examples=10))
    policy = draw(st.sampled_from(sorted(POLICIES)))
    rows = draw(st.integers(1, 4))
    epoch = pack_examples(Split.TRAIN, examples, BINDING, PackConfig(capacity, rows), policy=policy)
    return examples, capacity, rows, epoch


def layout_of(batch, examples) -> Layout:
    return Layout.build(placed_from_records(batch.occurrences, examples), *batch.shape)


def assert_cells(batch, layout):
    want = layout.cells()
    for name, cells in want.items():
        got = getattr(batch, name)
        assert got.tolist() == cells, name
    assert batch.inputs.dtype == batch.targets.dtype == np.int32
    assert batch.segments.dtype == batch.positions.dtype == np.int32
    assert batch.valid.tolist() == want["input_valid"]
    assert batch.eligible_count == sum(map(sum, want["loss_mask"]))


def assert_views(batch, layout):
    dense = batch.dense_mask()
    assert dense.dtype == np.bool_ and dense.tolist() == layout.dense()
    edges = [tuple(e) for e in batch.edges().tolist()]
    assert edges == layout.edges()  # query order: (row, query, key) ascending
    assert sorted(map(tuple, tiled_edges(batch, 3).tolist())) == layout.edges()
    starts, ends, lengths = layout.key_ranges()
    ranges = batch.key_ranges()
    assert ranges.starts.tolist() == starts and ranges.ends.tolist() == ends
    assert ranges.row_lengths.tolist() == lengths
    assert ranges.starts.dtype == ranges.ends.dtype == ranges.row_lengths.dtype == np.int64
    for r in range(layout.rows):
        for q in range(layout.width):
            got = ranges.get(r, q)
            assert got == (None if starts[r][q] == ends[r][q] else (starts[r][q], ends[r][q]))
    cu, longest, valid, seg_rows = layout.cu_seqlens()
    got = batch.cu_seqlens()
    assert got.cu_seqlens.tolist() == cu and got.cu_seqlens.dtype == np.int32
    assert got.max_seqlen == longest
    assert got.valid_index.tolist() == valid and got.segment_rows.tolist() == seg_rows
    assert batch.position_ids().tolist() == layout.position_ids()
    assert batch.position_ids().dtype == np.int64


def assert_collated(batch, layout, pad_id):
    rows = PackedCollator(pad_id=pad_id, permission_mask=True)(batch)
    for key, want in layout.collated(pad_id).items():
        assert rows[key].dtype == torch.int64 and rows[key].tolist() == want, key
    cu, longest, valid, _ = layout.cu_seqlens()
    assert rows["cu_seq_lens_q"].tolist() == rows["cu_seq_lens_k"].tolist() == cu
    assert rows["max_length_q"] == rows["max_length_k"] == longest
    assert rows["valid_index"].tolist() == valid
    assert rows["permission_mask"][:, 0].tolist() == layout.dense()
    eligible = sum(map(sum, layout.cells()["loss_mask"]))
    assert rows["num_eligible"] == rows["num_items_in_batch"] == eligible
    flat = PackedCollator(pad_id=pad_id, flatten=True)(batch)
    for key, want in layout.flattened(pad_id).items():
        assert flat[key].tolist() == [want], key
    assert "valid_index" not in flat
    lengths = [b - a for a, b in itertools.pairwise(cu)]
    assert flat["seq_idx"].dtype == torch.int32
    assert flat["seq_idx"].tolist() == [[i for i, n in enumerate(lengths) for _ in range(n)]]


@settings(max_examples=scaled(60))
@given(packings(), st.integers(0, 265))
def test_cells_views_and_collated_tensors_equal_the_per_cell_reference(case, pad_id):
    examples, _, _, epoch = case
    for batch in epoch.batches:
        layout = layout_of(batch, examples)
        assert_cells(batch, layout)
        assert_views(batch, layout)
        assert_collated(batch, layout, pad_id)


@given(packings())
def test_every_occurrence_once_whole_with_its_provenance(case):
    examples, capacity, rows_per, epoch = case
    seen = []
    first = 0
    for i, batch in enumerate(epoch.batches):
        rows, width = batch.shape
        assert width == capacity and batch.first_row == first
        # Every call but the last holds max_rows_per_batch rows; the last its real count.
        last = i == len(epoch.batches) - 1
        assert rows == rows_per if not last else 1 <= rows <= rows_per
        first += rows
        occ = batch.occurrences
        for rec in occ.records():
            ex = examples[rec["ordinal"]]
            assert rec["segment"] == rec["ordinal"]
            assert rec["source_id"] == ex.source_id and rec["example_id"] == ex.example_id
            assert tuple(rec["range"]) == ex.range
            assert rec["columns"][1] - rec["columns"][0] == len(ex)
            seen.append(rec["ordinal"])
        assert batch.partition is Split.TRAIN and batch.binding == BINDING
        # Storage order: (row, column) ascending.
        keys = list(zip(occ.row.tolist(), occ.col_start.tolist(), strict=True))
        assert keys == sorted(keys)
    assert sorted(seen) == list(range(len(examples)))
    assert epoch.row_count == first and epoch.occurrence_count == len(examples)
    # No row is empty.
    used = {(b.first_row + r) for b in epoch.batches for r in b.occurrences.row.tolist()}
    assert used == set(range(epoch.row_count))


@given(example_lists(max_capacity=10, max_examples=12), st.integers(1, 4))
def test_next_fit_places_as_the_plain_loop_does(case, rows_per):
    examples, capacity = case
    epoch = pack_examples(Split.TRAIN, examples, BINDING, PackConfig(capacity, rows_per))
    row_of, start_of = reference_next_fit(np.array([len(ex) for ex in examples]), capacity)
    want = list(zip(row_of, start_of, strict=True))
    got = {}
    for batch in epoch.batches:
        occ = batch.occurrences
        for o, r, c in zip(occ.ordinal, occ.row, occ.col_start, strict=True):
            got[int(o)] = (batch.first_row + int(r), int(c))
    assert [got[i] for i in range(len(examples))] == want


@given(packings())
def test_storage_adjacency_never_creates_a_target_or_an_edge(case):
    """A cell's target is its own window's next token; no edge joins two occurrences."""
    examples, _, _, epoch = case
    for batch in epoch.batches:
        layout = layout_of(batch, examples)
        for r, q, k in batch.edges().tolist():
            assert layout.owner[r][q] is layout.owner[r][k]
        for p in placed_from_records(batch.occurrences, examples):
            last = p.end - 1
            assert batch.targets[p.row, last] == p.window[-1]  # its own last token
            if p.end < batch.shape[1] and layout.owner[p.row][p.end] is not None:
                neighbour = layout.owner[p.row][p.end]
                assert not batch.dense_mask()[p.row, p.end, last]
                assert neighbour.window[0] == batch.inputs[p.row, p.end]


def test_fixture_acceptance_values_come_out_of_the_reference():
    """The seed's fixture, computed by the reference and by the library alike."""
    batch = fixture_batch()
    layout = layout_of(batch, fixture_examples())
    cells = layout.cells()
    assert cells["inputs"] == [[0, 99, 100, 0, 101, -1], [0, 102, 103, 104, -1, -1]]
    assert cells["targets"] == [[99, 100, 1, 101, 1, -1], [102, 103, 104, 1, -1, -1]]
    assert cells["segments"] == [[0, 0, 0, 1, 1, -1], [2, 2, 2, 2, -1, -1]]
    assert cells["positions"] == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 0]]
    starts, ends, _ = layout.key_ranges()
    assert (starts[0][3], ends[0][3]) == (3, 4) and (starts[0][4], ends[0][4]) == (3, 5)
    assert sum(map(len, cells["inputs"])) == 12 and sum(map(sum, cells["target_valid"])) == 9
    assert_cells(batch, layout)
    assert_views(batch, layout)


def test_batch_bytes_follow_from_the_cell_and_record_dtypes():
    """``nbytes`` and the budget's per-cell / per-record constants, from the dtypes."""
    batch = fixture_batch()
    cell_bytes = sum(getattr(batch, name).dtype.itemsize for name in CELL_FIELDS)
    occ = batch.occurrences
    record_bytes = (
        sum(
            getattr(occ, name).dtype.itemsize
            for name in ("ordinal", "row", "col_start", "col_end", "segment", "range_starts")
        )
        + occ.range_ends.dtype.itemsize
        + 2 * np.dtype(np.intp).itemsize
    )  # two id references
    assert cell_bytes == budget.CELL_BYTES
    assert record_bytes == budget.OCCURRENCE_BYTES
    rows, width = batch.shape
    assert batch.nbytes == rows * width * cell_bytes + len(occ) * record_bytes


def test_rows_as_dicts_are_the_reference_cells():
    batch = fixture_batch()
    cells = layout_of(batch, fixture_examples()).cells()
    dicts = batch.rows_as_dicts()
    assert [sorted(d) for d in dicts] == [sorted(cells)] * 2
    for r, d in enumerate(dicts):
        assert d == {k: v[r] for k, v in cells.items()}


# ----------------------------------------------------------------- the batch API


def test_materialize_refuses_a_plan_for_other_examples_or_another_width():
    table = ExampleTable.from_examples(fixture_examples(), "train", fixture_binding())
    with pytest.raises(InvalidInput) as err:
        materialize(table, plan_rows([3, 2], 6), PackConfig(6, 2))
    assert str(err.value) == "plan lengths do not match the examples supplied"
    with pytest.raises(InvalidInput) as err:
        materialize(table, plan_rows([3, 2, 5], 6), PackConfig(6, 2))
    assert str(err.value) == "plan lengths do not match the examples supplied"
    with pytest.raises(InvalidInput) as err:
        materialize(table, plan_rows(table.lengths, 6), PackConfig(7, 2))
    assert str(err.value) == "plan capacity 6 != config capacity 7"


def test_a_table_of_another_partition_or_binding_is_refused_by_name():
    table = ExampleTable.from_examples(fixture_examples(), "train", fixture_binding())
    with pytest.raises(SplitMismatch) as err:
        pack_examples("validation", table, fixture_binding(), PackConfig(6, 2))
    assert str(err.value) == (
        "examples belong to partition 'train', not 'validation'"
        " — a batch holds one partition only; pack them separately"
    )
    other = Binding(266, "another-tokenizer", fixture_binding().split_id)
    with pytest.raises(BindingMismatch) as err:
        pack_examples("train", table, other, PackConfig(6, 2))
    assert str(err.value).startswith("the example table has a different binding (tokenizer_id")


def test_a_table_and_its_examples_pack_alike_with_policy_options():
    examples = fixture_examples() * 3
    table = ExampleTable.from_examples(examples, "train", fixture_binding())
    options = {"policy": "stream-best-fit", "lookahead": 2, "max_open_rows": 1, "seed": 5}
    a = pack_examples("train", examples, fixture_binding(), PackConfig(6, 2), **options)
    b = pack_examples(Split.TRAIN, table, fixture_binding(), PackConfig(6, 2), **options)
    assert a.plan.to_dict() == b.plan.to_dict() and a.plan.policy == "stream-best-fit"
    want = stream_plan([len(ex) for ex in examples], 6, 2, 1, 5)
    got = zip(range(len(examples)), a.plan.row_of.tolist(), a.plan.start_of.tolist(), strict=True)
    assert sorted(got) == sorted(want)
    for x, y in zip(a.batches, b.batches, strict=True):
        for name in CELL_FIELDS:
            assert np.array_equal(getattr(x, name), getattr(y, name)), name


def test_validity_arrays_are_separate_and_the_shape_is_the_cells():
    batch = fixture_batch()
    assert batch.shape == (2, 6) and type(batch.shape[0]) is int
    assert not np.shares_memory(batch.input_valid, batch.target_valid)
    assert batch.target_valid.tolist() == batch.input_valid.tolist()
    # allowed_key checks its coordinates and answers like the reference
    layout = layout_of(batch, fixture_examples())
    for r in range(2):
        for q in range(6):
            for k in range(6):
                assert batch.allowed_key(r, q, k) == layout.allowed(r, q, k)
    for coords in ((2, 0, 0), (0, 6, 0), (0, 0, -1)):
        with pytest.raises(InvalidInput) as err:
            batch.allowed_key(*coords)
        assert "is outside this batch of shape (2, 6)" in str(err.value)


def test_fill_cells_with_flags_in_cell_order():
    """The compact path: flags already in cell order (no per-occurrence offsets)."""
    tokens = np.array([0, 9, 8, 1, 0, 7, 1], dtype=np.int32)
    cells = fill_cells(
        (1, 6),
        np.array([0, 0]),
        np.array([0, 3]),
        np.array([3, 2]),
        np.array([4, 1], dtype=np.int32),
        tokens,
        np.array([0, 4]),
        np.array([True, False, True, True, False]),
    )
    inputs, targets, segments, positions, valid, loss = (c.tolist()[0] for c in cells)
    assert inputs == [0, 9, 8, 0, 7, -1] and targets == [9, 8, 1, 7, 1, -1]
    assert segments == [4, 4, 4, 1, 1, -1] and positions == [0, 1, 2, 0, 1, 0]
    assert valid == [True] * 5 + [False] and loss == [True, False, True, True, False, False]


@given(packings())
def test_occurrence_records_have_their_documented_dtypes(case):
    _, _, _, epoch = case
    for batch in epoch.batches:
        occ = batch.occurrences
        for name in ("ordinal", "row", "col_start", "col_end", "range_starts", "range_ends"):
            assert getattr(occ, name).dtype == np.int64, name
        assert occ.segment.dtype == np.int32
        assert occ.source_ids.dtype == occ.example_ids.dtype == object


def test_a_batch_from_cells_starts_at_row_zero_unless_told():
    batch = fixture_batch()
    cells = tuple(getattr(batch, n) for n in ("inputs", "targets", "segments", "positions"))
    cells += (batch.input_valid, batch.loss_mask)
    again = PackedBatch.from_cells(cells, batch.occurrences, batch.partition, batch.binding)
    assert again.first_row == 0
    later = PackedBatch.from_cells(cells, batch.occurrences, batch.partition, batch.binding, 7)
    assert later.first_row == 7


@pytest.mark.parametrize(
    ("coords", "name", "value"),
    [((2, 0, 0), "row", 2), ((0, 6, 0), "query", 6), ((0, 0, -1), "key", -1)],
)
def test_a_coordinate_outside_the_batch_is_named(coords, name, value):
    with pytest.raises(InvalidInput) as err:
        fixture_batch().allowed_key(*coords)
    assert str(err.value) == (
        f"attention coordinate {name}={value} is outside this batch of shape (2, 6)"
    )


def test_the_tiled_traversal_visits_two_by_two_tiles_by_default():
    batch = fixture_batch()
    layout = layout_of(batch, fixture_examples())
    want = [
        (r, q, k)
        for r in range(2)
        for q0 in range(0, 6, 2)
        for k0 in range(0, 6, 2)
        for q in range(q0, q0 + 2)
        for k in range(k0, k0 + 2)
        if layout.allowed(r, q, k)
    ]
    assert [tuple(e) for e in tiled_edges(batch).tolist()] == want
    with pytest.raises(InvalidInput) as err:
        tiled_edges(batch, 0)
    assert str(err.value) == "tile_width must be positive, got 0"


def test_an_empty_call_has_empty_typed_views():
    batch = empty_batch(6, "train", fixture_binding())
    assert batch.shape == (0, 6)
    cu = batch.cu_seqlens()
    assert cu.cu_seqlens.tolist() == [0] and cu.max_seqlen == 0 and cu.valid_index.size == 0
    for edges in (batch.edges(), tiled_edges(batch)):
        assert edges.shape == (0, 3) and edges.dtype == np.int64
    assert batch.dense_mask().shape == (0, 6, 6)


@settings(max_examples=scaled(60))
@given(packings(), st.integers(1, 6))
def test_sliding_window_views_equal_the_per_cell_reference(case, window):
    """With ``window``, a query keeps only the keys fewer than ``window`` cells back."""
    examples, _, _, epoch = case
    for batch in epoch.batches:
        layout = layout_of(batch, examples)
        assert batch.dense_mask(window).tolist() == layout.dense(window)
        assert [tuple(e) for e in batch.edges(window).tolist()] == layout.edges(window)
        starts, ends, lengths = layout.key_ranges(window)
        ranges = batch.key_ranges(window)
        assert ranges.starts.tolist() == starts and ranges.ends.tolist() == ends
        assert ranges.row_lengths.tolist() == lengths
        rows, width = batch.shape
        for r in range(rows):
            for q in range(width):
                for k in range(width):
                    assert batch.allowed_key(r, q, k, window) == layout.allowed(r, q, k, window)
