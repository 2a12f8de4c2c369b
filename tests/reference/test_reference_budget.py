"""PackConfig and the metadata budget against a plain reference: bytes counted from the arrays.

The budget of :func:`exactpack.materialize` is what it allocates: the plan's
four int64 arrays per example, every model call's cells and occurrence
records (their arrays' item sizes), and the transient int64 gather indices of
the largest call. The reference counts those from the batches actually built
and from the dtypes, so a mis-stated constant or a call counted twice shows
up. Checked arithmetic refuses anything past a 64-bit byte count.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactpack import BudgetExceeded, InvalidInput, PackConfig, Split, pack_examples
from exactpack.core import config as budget
from exactpack.core.binding import INT32_MAX
from exactpack.core.config import check_segment_namespace, plan_metadata_bytes
from exactpack.core.policies import plan_rows

from support.strategies import BINDING, example_lists

INT64 = np.dtype(np.int64).itemsize


def reference_bytes(epoch) -> int:
    """Bytes of the batches built, the plan, and one call's gather indices."""
    plan_arrays = 4  # lengths, row_of, start_of, storage order
    gather = 4  # owner, local, destination, source: int64 per real cell while filling
    largest = max((int(b.valid.sum()) for b in epoch.batches), default=0)
    cells = sum(b.nbytes for b in epoch.batches)
    return cells + plan_arrays * INT64 * epoch.occurrence_count + gather * INT64 * largest


@given(example_lists(max_capacity=10, max_examples=12), st.integers(1, 5))
def test_the_metadata_peak_is_what_materialize_allocates(case, rows):
    examples, capacity = case
    epoch = pack_examples(Split.TRAIN, examples, BINDING, PackConfig(capacity, rows))
    assert epoch.metadata_peak == reference_bytes(epoch)
    assert plan_metadata_bytes(epoch.plan, PackConfig(capacity, rows)) == epoch.metadata_peak
    # One byte short is refused before anything is allocated; the exact budget packs.
    with pytest.raises(BudgetExceeded) as err:
        pack_examples(
            Split.TRAIN,
            examples,
            BINDING,
            PackConfig(capacity, rows, max_metadata_bytes=epoch.metadata_peak - 1),
        )
    assert str(err.value) == (
        f"packing metadata needs {epoch.metadata_peak:,} bytes but max_metadata_bytes is"
        f" {epoch.metadata_peak - 1:,} — raise the budget or pack fewer examples per call"
    )
    config = PackConfig(capacity, rows, max_metadata_bytes=epoch.metadata_peak)
    assert pack_examples(Split.TRAIN, examples, BINDING, config).row_count == epoch.row_count


def test_cells_and_records_per_byte_follow_the_dtypes():
    batch = pack_examples(Split.TRAIN, [], BINDING, PackConfig(4, 1))
    assert batch.batches == [] and batch.metadata_peak == 0
    assert 4 * np.dtype(np.int32).itemsize + 3 * np.dtype(np.bool_).itemsize == budget.CELL_BYTES
    assert budget.PLAN_BYTES == budget.GATHER_BYTES == 4 * INT64
    refs = np.dtype(object).itemsize  # source and example id references
    assert 6 * INT64 + np.dtype(np.int32).itemsize + 2 * refs == budget.OCCURRENCE_BYTES


def test_a_call_over_max_cells_is_named_before_anything_is_built():
    lengths = [3, 3, 3]
    plan = plan_rows(lengths, 4)
    with pytest.raises(BudgetExceeded) as err:
        plan_metadata_bytes(plan, PackConfig(4, 3, max_cells=8))
    assert str(err.value) == (
        "model call of 3 rows x 4 columns = 12 cells exceeds max_cells 8 — lower max_rows_per_batch"
    )
    # The last, shorter call is measured by its real row count: 2 rows fit 8 cells.
    assert plan_metadata_bytes(plan_rows([3, 3], 4), PackConfig(4, 3, max_cells=8)) > 0


@pytest.mark.parametrize(("a", "b"), [(2**62, 2), (2**63 - 1, 2), (2**32, 2**31 + 1)])
def test_checked_multiplication_refuses_past_64_bits(a, b):
    assert a * b > budget.MAX_BYTES
    with pytest.raises(BudgetExceeded) as err:
        budget.checked_mul(a, b)
    assert str(err.value) == f"metadata size {a} * {b} overflows a 64-bit byte count"


def test_checked_arithmetic_at_the_edge():
    assert np.iinfo(np.int64).max == budget.MAX_BYTES
    assert budget.checked_mul(2**62 - 1, 2) == 2**63 - 2
    assert budget.checked_mul(budget.MAX_BYTES, 1) == budget.MAX_BYTES
    assert budget.checked_add(budget.MAX_BYTES - 1, 1) == budget.MAX_BYTES
    assert budget.checked_add() == 0 and budget.checked_add(3, 4, 5) == 12
    with pytest.raises(BudgetExceeded) as err:
        budget.checked_add(budget.MAX_BYTES, 1)
    assert str(err.value) == "metadata size overflows a 64-bit byte count"
    # An intermediate past the limit is refused even if a later term would bring it back.
    with pytest.raises(BudgetExceeded):
        budget.checked_add(budget.MAX_BYTES, 1, -5)


def test_enforce_names_the_need_the_limit_and_the_fix():
    budget.enforce(10, None)
    budget.enforce(10, 10)
    with pytest.raises(BudgetExceeded) as err:
        budget.enforce(1_234_567, 1_000, "the plan", "use fewer rows")
    assert str(err.value) == (
        "the plan needs 1,234,567 bytes but max_metadata_bytes is 1,000"
        " — raise the budget or use fewer rows"
    )


@given(st.integers(1, 64), st.integers(1, 64))
def test_a_config_defaults_max_cells_to_one_full_call(capacity, rows):
    config = PackConfig(capacity, rows)
    assert config.max_cells == capacity * rows and config.max_metadata_bytes is None
    assert type(config.capacity) is int and type(config.max_rows_per_batch) is int


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 2), f"capacity must be an integer in [1, {INT32_MAX:,}], got 0"),
        ((True, 2), f"capacity must be an integer in [1, {INT32_MAX:,}], got True"),
        (
            (INT32_MAX + 1, 2),
            f"capacity must be an integer in [1, {INT32_MAX:,}], got {INT32_MAX + 1}",
        ),
        ((6, 0), f"max_rows_per_batch must be an integer in [1, {INT32_MAX:,}], got 0"),
        ((6, 2.0), f"max_rows_per_batch must be an integer in [1, {INT32_MAX:,}], got 2.0"),
        (
            (6, 2, 5),
            "max_cells 5 is smaller than one row of capacity 6"
            " — no model call could hold a row; raise max_cells",
        ),
        ((6, 2, 0), f"max_cells must be an integer in [1, {budget.MAX_BYTES:,}], got 0"),
        (
            (6, 2, None, 0),
            f"max_metadata_bytes must be an integer in [1, {budget.MAX_BYTES:,}], got 0",
        ),
    ],
)
def test_bad_configs_are_named_with_the_range(args, message):
    with pytest.raises(InvalidInput) as err:
        PackConfig(*args)
    assert str(err.value).startswith(message)


def test_edge_configs_are_accepted():
    assert PackConfig(INT32_MAX, 1, max_cells=INT32_MAX).capacity == INT32_MAX
    assert PackConfig(6, 2, 6).max_cells == 6  # exactly one row per call
    assert PackConfig(6, 2, None, 1).max_metadata_bytes == 1
    numpy_ints = PackConfig(np.int64(6), np.int32(2))
    assert numpy_ints.max_cells == 12
    assert type(numpy_ints.capacity) is int and type(numpy_ints.max_rows_per_batch) is int
    assert type(numpy_ints.max_cells) is int


def test_the_segment_namespace_is_int32():
    check_segment_namespace(INT32_MAX + 1)  # ids 0 .. 2**31 - 1
    with pytest.raises(InvalidInput) as err:
        check_segment_namespace(INT32_MAX + 2)
    assert str(err.value) == (
        f"{INT32_MAX + 2:,} occurrences do not fit int32 segment ids (at most {INT32_MAX + 1:,})"
        " — pack the corpus in several calls"
    )
