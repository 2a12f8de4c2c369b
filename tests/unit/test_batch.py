import numpy as np
import pytest
from hypothesis import given

from exactpack import (
    BudgetExceeded,
    InvalidInput,
    OversizedExample,
    PackConfig,
    SequenceExample,
    Split,
    SplitMismatch,
    pack_examples,
)
from exactpack.core.batch import NO_SEGMENT, PAD_CELL
from exactpack.core.config import check_segment_namespace
from exactpack.verify.fixture import (
    FIXTURE_DOCUMENTS,
    fixture_binding,
    fixture_epoch,
    fixture_examples,
)

from support.strategies import BINDING, example_lists, packed_epochs


def expected_fixture_rows():
    """Derive the seed's rows from the documents by hand-rolled next-fit."""
    docs = list(FIXTURE_DOCUMENTS.values())
    rows, row, used = [], [], 0
    for seg, doc in enumerate(docs):
        n = len(doc) - 1
        if n > 6 - used:
            rows.append(row)
            row, used = [], 0
        row.extend((doc[j], doc[j + 1], seg, j) for j in range(n))
        used += n
    rows.append(row)
    return [r + [(PAD_CELL, PAD_CELL, NO_SEGMENT, 0)] * (6 - len(r)) for r in rows]


def test_fixture_layout_matches_the_seed():
    epoch = fixture_epoch()
    assert epoch.row_count == 2 and epoch.occurrence_count == 3 and len(epoch.batches) == 1
    b = epoch.batches[0]
    rows = expected_fixture_rows()
    for field, k in (("inputs", 0), ("targets", 1), ("segments", 2), ("positions", 3)):
        assert getattr(b, field).tolist() == [[c[k] for c in r] for r in rows], field
    # The seed's literal rows, as an independent cross-check of the derivation.
    assert b.inputs.tolist()[0] == [0, 99, 100, 0, 101, -1]
    assert b.targets.tolist()[1] == [102, 103, 104, 1, -1, -1]
    assert b.positions.tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 0]]
    for field in ("input_valid", "target_valid", "loss_mask"):
        assert getattr(b, field).tolist() == [[True] * 5 + [False], [True] * 4 + [False] * 2]
    assert b.inputs.size == 12 and int(b.target_valid.sum()) == 9
    ranges = b.key_ranges()
    assert ranges.get(0, 3) == (3, 4) and ranges.get(0, 4) == (3, 5)
    assert ranges.get(0, 5) is None


def test_fixture_occurrence_records():
    recs = fixture_epoch().batches[0].occurrences.records()
    assert [(r["ordinal"], r["row"], r["columns"], r["segment"]) for r in recs] == [
        (0, 0, [0, 3], 0),
        (1, 0, [3, 5], 1),
        (2, 1, [0, 4], 2),
    ]
    assert [r["source_id"] for r in recs] == ["A", "B", "C"]
    assert [r["range"] for r in recs] == [[0, len(d)] for d in FIXTURE_DOCUMENTS.values()]


def test_last_model_call_keeps_its_real_row_count():
    epoch = fixture_epoch(max_rows_per_batch=1)
    assert [b.shape for b in epoch.batches] == [(1, 6), (1, 6)]
    assert epoch.batches[1].first_row == 1
    assert epoch.batches[1].occurrences.row.tolist() == [0]
    three = pack_examples("train", fixture_examples() * 2, fixture_binding(), PackConfig(6, 3))
    assert three.row_count == 4  # [A B] [C] [A B] [C]: A never fits after C
    assert [b.shape[0] for b in three.batches] == [3, 1]


def test_exact_fill_makes_no_empty_row():
    ex = SequenceExample.from_document([1] * 7, source_id="x", partition="train", binding=BINDING)
    epoch = pack_examples("train", [ex, ex], BINDING, PackConfig(6, 4))
    assert epoch.row_count == 2
    assert epoch.batches[0].input_valid.all()
    assert epoch.batches[0].segments.tolist() == [[0] * 6, [1] * 6]


def test_duplicates_get_distinct_segments():
    ex = SequenceExample.from_document([0, 5, 1], source_id="x", partition="train", binding=BINDING)
    b = pack_examples("train", [ex, ex, ex], BINDING, PackConfig(6, 1)).batches[0]
    assert b.segments.tolist() == [[0, 0, 1, 1, 2, 2]]
    assert not b.allowed_key(0, 2, 1)
    assert set(b.occurrences.example_ids) == {"x[0:3]"}


def test_oversized_example_names_index_id_length_and_capacity():
    exs = fixture_examples()
    with pytest.raises(OversizedExample) as err:
        pack_examples("train", exs, fixture_binding(), PackConfig(3, 2))
    assert str(err.value) == (
        "example 2 ('C'[0:5]) has 4 prediction pairs; capacity is 3"
        " — raise --max-length or cut it with --cut-long"
    )


def test_validation_example_never_enters_a_training_batch():
    b = fixture_binding()
    val = SequenceExample.from_document([0, 9, 1], source_id="v", partition="validation", binding=b)
    with pytest.raises(SplitMismatch, match="belongs to partition 'validation'"):
        pack_examples(Split.TRAIN, [*fixture_examples(), val], b, PackConfig(6, 2))


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((0, 2), "capacity must be an integer in [1, 2,147,483,647], got 0"),
        ((6, 0), "max_rows_per_batch"),
        ((True, 2), "capacity"),
        ((6, 2, 5), "max_cells 5 is smaller than one row of capacity 6"),
        ((6, 2, None, 0), "max_metadata_bytes"),
        ((2**31, 2), "capacity"),
    ],
)
def test_pack_config_validation(args, needle):
    with pytest.raises(InvalidInput) as err:
        PackConfig(*args)
    assert needle in str(err.value)


def test_model_call_over_max_cells_is_an_error():
    with pytest.raises(BudgetExceeded, match="2 rows x 6 columns = 12 cells exceeds max_cells 6"):
        pack_examples("train", fixture_examples(), fixture_binding(), PackConfig(6, 2, max_cells=6))


def test_metadata_budget_is_enforced_before_allocating_and_counts_real_bytes():
    exs, b = fixture_examples(), fixture_binding()
    epoch = pack_examples("train", exs, b, PackConfig(6, 2))
    plan = epoch.plan
    # + the plan's int64 arrays: lengths, row_of, start_of and the storage order
    per_example = sum(a.itemsize for a in (plan.lengths, plan.row_of, plan.start_of))
    per_example += plan.row_order().itemsize
    allocated = sum(x.nbytes for x in epoch.batches) + per_example * len(exs)
    # fill_cells' transient int64 indices per real cell: owner, local, destination, source
    gather = 4 * np.dtype(np.int64).itemsize * int(epoch.batches[0].valid.sum())
    assert epoch.metadata_peak == allocated + gather
    with pytest.raises(BudgetExceeded) as err:
        pack_examples("train", exs, b, PackConfig(6, 2, max_metadata_bytes=epoch.metadata_peak - 1))
    assert f"needs {epoch.metadata_peak:,} bytes but max_metadata_bytes is" in str(err.value)
    ok = pack_examples("train", exs, b, PackConfig(6, 2, max_metadata_bytes=epoch.metadata_peak))
    assert ok.row_count == 2


def test_segment_namespace_must_fit_int32():
    check_segment_namespace(2**31)
    with pytest.raises(InvalidInput, match="do not fit int32 segment ids"):
        check_segment_namespace(2**31 + 1)


@given(example_lists())
def test_next_fit_every_occurrence_once_whole_in_order(data):
    examples, capacity = data
    epoch = pack_examples("train", examples, BINDING, PackConfig(capacity, 3))
    seen = []
    prev = (-1, -1)
    for batch in epoch.batches:
        occ = batch.occurrences
        for i in range(len(occ)):
            o = int(occ.ordinal[i])
            ex = examples[o]
            r, s, e = int(occ.row[i]), int(occ.col_start[i]), int(occ.col_end[i])
            assert e - s == len(ex) and e <= capacity
            assert batch.inputs[r, s:e].tolist() == ex.inputs.tolist()
            assert batch.targets[r, s:e].tolist() == ex.targets.tolist()
            assert batch.loss_mask[r, s:e].tolist() == ex.loss_mask.tolist()
            assert batch.positions[r, s:e].tolist() == list(range(len(ex)))
            assert (batch.segments[r, s:e] == o).all()
            here = (batch.first_row + r, s)
            assert here > prev  # supplied order is storage order
            prev = here
            seen.append(o)
        # No row is empty; padding is inert storage.
        assert batch.input_valid.any(axis=1).all()
        pad = ~batch.input_valid
        assert (batch.inputs[pad] == PAD_CELL).all() and (batch.segments[pad] == NO_SEGMENT).all()
        assert (batch.positions[pad] == 0).all() and not batch.loss_mask[pad].any()
        assert batch.shape[0] <= 3
    assert seen == list(range(len(examples)))
    # Next-fit never leaves room for the next example in the previous row.
    lens = [len(e) for e in examples]
    rows = epoch.plan.row_of
    for i in range(1, len(lens)):
        if rows[i] != rows[i - 1]:
            used = sum(lens[j] for j in range(i) if rows[j] == rows[i - 1])
            assert used + lens[i] > capacity


@given(packed_epochs())
def test_metadata_peak_matches_allocated_bytes(data):
    examples, _capacity, epoch = data
    int64 = np.dtype(np.int64).itemsize
    plan_arrays = 4  # lengths, row_of, start_of, storage order
    gather_indices = 4  # owner, local, destination, source: per real cell of one call
    allocated = sum(b.nbytes for b in epoch.batches) + plan_arrays * int64 * len(examples)
    largest = max(int(b.input_valid.sum()) for b in epoch.batches)
    assert epoch.metadata_peak == allocated + gather_indices * int64 * largest
