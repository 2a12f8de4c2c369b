"""Model calls as rows: select, stack, and the explicitly empty call."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace

import numpy as np

from seqpack.core.batch import CELL_FIELDS, Occurrences, PackedBatch
from seqpack.core.binding import Binding, Partition
from seqpack.core.compact import CompactRows
from seqpack.core.errors import InvalidInput


def _occurrences_take(occ: Occurrences, index: np.ndarray, rows: np.ndarray) -> Occurrences:
    """Occurrences ``index`` with their rows replaced by ``rows``."""
    values = {f.name: getattr(occ, f.name)[index] for f in fields(Occurrences)}
    return Occurrences(**(values | {"row": rows.astype(np.int64)}))


def distinct_rows(rows: Sequence[int] | np.ndarray, count: int) -> np.ndarray:
    """``rows`` as int64 [k], checked to be distinct indices in ``0..count-1``."""
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= count):
        raise InvalidInput(f"row selection {rows.tolist()} lies outside 0..{count - 1}")
    if np.unique(rows).shape[0] != rows.shape[0]:
        raise InvalidInput(f"row selection {rows.tolist()} repeats a row; select each row once")
    return rows


def select_rows(batch: PackedBatch, rows: Sequence[int] | np.ndarray) -> PackedBatch:
    """Rows ``rows`` (batch-local, distinct) of ``batch`` as a new model call, in that order.

    Occurrences follow their rows; ``first_row`` becomes the global index of
    the first selected row (later rows need not be consecutive). An empty
    selection gives a call of 0 rows.
    """
    count = batch.shape[0]
    rows = distinct_rows(rows, count)
    new_of_old = np.full(count, -1, dtype=np.int64)
    new_of_old[rows] = np.arange(rows.shape[0], dtype=np.int64)
    occ = batch.occurrences
    new_row = new_of_old[occ.row]
    keep = np.flatnonzero(new_row >= 0)
    keep = keep[np.lexsort((occ.col_start[keep], new_row[keep]))]  # storage order
    cells = {name: getattr(batch, name)[rows] for name in CELL_FIELDS}
    first = batch.first_row + int(rows[0]) if rows.size else batch.first_row
    return replace(
        batch, **cells, occurrences=_occurrences_take(occ, keep, new_row[keep]), first_row=first
    )


def empty_batch(
    capacity: int, partition: Partition | str, binding: Binding, first_row: int = 0
) -> PackedBatch:
    """A model call of 0 rows: an explicitly empty micro-batch (loss sum 0, count 0)."""
    none = np.zeros(0, dtype=np.int64)
    return CompactRows(
        tokens=np.zeros(0, dtype=np.int32),
        loss_mask=np.zeros(0, dtype=bool),
        lengths=none,
        starts=none,
        row_offsets=np.zeros(1, dtype=np.int64),
        ordinals=none,
        source_ids=np.zeros(0, dtype=object),
        example_ids=np.zeros(0, dtype=object),
        range_starts=none,
        range_ends=none,
        capacity=capacity,
        partition=Partition.parse(partition),
        binding=binding,
        first_row=first_row,
    ).to_batch()


def concat_batches(batches: Sequence[PackedBatch]) -> PackedBatch:
    """Stack the rows of several model calls (same capacity, partition, binding) into one."""
    if not batches:
        raise InvalidInput("concat_batches needs at least one batch")
    head = batches[0]
    for b in batches[1:]:
        if b.shape[1] != head.shape[1] or b.partition is not head.partition:
            raise InvalidInput(
                f"cannot stack a {b.partition.value} batch of width {b.shape[1]} onto a"
                f" {head.partition.value} batch of width {head.shape[1]}"
            )
        head.binding.require(b.binding, "a stacked batch")
    if len(batches) == 1:
        return head
    parts = [b.occurrences for b in batches]
    occ = {f.name: np.concatenate([getattr(o, f.name) for o in parts]) for f in fields(Occurrences)}
    offsets = np.cumsum([0] + [b.shape[0] for b in batches[:-1]])
    occ["row"] = np.concatenate([o.row + off for o, off in zip(parts, offsets, strict=True)])
    cells = {name: np.concatenate([getattr(b, name) for b in batches]) for name in CELL_FIELDS}
    return replace(head, **cells, occurrences=Occurrences(**occ))


__all__ = ["concat_batches", "distinct_rows", "empty_batch", "select_rows"]
