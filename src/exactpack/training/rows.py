"""Packed rows in the read path's one form, :class:`~exactpack.core.compact.CompactRows`.

Stack and select rows (compact, or as padded :class:`PackedBatch` calls), and flatten
them into the valid cells' columns straight from the windows: cell ``j`` of an
occurrence holds input ``window[j]`` and target ``window[j + 1]``. Padding is made only
by :func:`pad_cells` (rows mode, dense masks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from exactpack.core.batch import IGNORE_INDEX, NO_SEGMENT, PackedBatch
from exactpack.core.binding import Binding, Split
from exactpack.core.compact import CompactRows
from exactpack.core.errors import InvalidInput
from exactpack.core.examples import concat_ranges

Rows = CompactRows | PackedBatch


# Compact rows: the one form the read path carries.


_FOREST = (
    "forest rows are one padded batch: select or stack their records (tree_batch_from_rows) instead"
)


def compact_of(rows: Rows) -> CompactRows:
    """``rows`` as :class:`CompactRows` (a :class:`PackedBatch`'s cells gathered back)."""
    if isinstance(rows, CompactRows):
        return rows
    if rows.is_tree:
        raise InvalidInput(_FOREST)
    occ, width = rows.occurrences, rows.shape[1]
    lengths = occ.col_end - occ.col_start
    index = concat_ranges(occ.row * width + occ.col_start, lengths)
    ends = np.cumsum(lengths)
    last = rows.targets.reshape(-1)[index[ends - 1]]  # each window's last token
    return CompactRows(
        tokens=np.insert(rows.inputs.reshape(-1)[index], ends, last),
        loss_mask=rows.loss_mask.reshape(-1)[index],
        lengths=lengths,
        starts=occ.col_start,
        row_offsets=np.searchsorted(occ.row, np.arange(rows.shape[0] + 1)).astype(np.int64),
        ordinals=occ.ordinal,
        source_ids=occ.source_ids,
        example_ids=occ.example_ids,
        range_starts=occ.range_starts,
        range_ends=occ.range_ends,
        capacity=width,
        partition=rows.partition,
        binding=rows.binding,
        first_row=rows.first_row,
    )


def concat_rows(parts: Sequence[Rows]) -> CompactRows:
    """The rows of ``parts`` (same capacity, partition, binding) stacked, compact."""
    if not parts:
        raise InvalidInput("concat_batches needs at least one batch")
    parts = [compact_of(p) for p in parts]
    head = parts[0]
    for p in parts[1:]:
        if p.capacity != head.capacity or p.partition is not head.partition:
            raise InvalidInput(
                f"cannot stack a {p.partition.value} batch of width {p.capacity} onto a"
                f" {head.partition.value} batch of width {head.capacity}"
            )
        head.binding.require(p.binding, "a stacked batch")
    if len(parts) == 1:
        return head
    if any(p.parents is not None for p in parts):
        raise InvalidInput(_FOREST)
    per_occ = ("tokens", "loss_mask", "lengths", "starts", "ordinals", "source_ids")
    per_occ += ("example_ids", "range_starts", "range_ends")
    cat = {n: np.concatenate([getattr(p, n) for p in parts]) for n in per_occ}
    shift = np.cumsum([0] + [len(p) for p in parts[:-1]])
    offsets = [p.row_offsets[1:] + s for p, s in zip(parts, shift, strict=True)]
    return replace(head, **cat, row_offsets=np.concatenate([[0], *offsets]).astype(np.int64))


def empty_rows(
    capacity: int, partition: Split | str, binding: Binding, first_row: int = 0
) -> CompactRows:
    """0 rows: an explicitly empty micro-batch (loss sum 0, count 0)."""
    none = np.zeros(0, dtype=np.int64)
    ints = dict.fromkeys(("lengths", "starts", "ordinals", "range_starts", "range_ends"), none)
    return CompactRows(
        **ints,
        tokens=np.zeros(0, dtype=np.int32),
        loss_mask=np.zeros(0, dtype=bool),
        row_offsets=np.zeros(1, dtype=np.int64),
        source_ids=np.zeros(0, dtype=object),
        example_ids=np.zeros(0, dtype=object),
        capacity=capacity,
        partition=Split.parse(partition),
        binding=binding,
        first_row=first_row,
    )


def empty_batch(
    capacity: int, partition: Split | str, binding: Binding, first_row: int = 0
) -> PackedBatch:
    """A model call of 0 rows: an explicitly empty micro-batch (loss sum 0, count 0)."""
    return empty_rows(capacity, partition, binding, first_row).to_batch()


def distinct_rows(rows: Sequence[int] | np.ndarray, count: int) -> np.ndarray:
    """``rows`` as int64 [k], checked to be distinct indices in ``0..count-1``."""
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= count):
        raise InvalidInput(f"row selection {rows.tolist()} lies outside 0..{count - 1}")
    if np.unique(rows).shape[0] != rows.shape[0]:
        raise InvalidInput(f"row selection {rows.tolist()} repeats a row; select each row once")
    return rows


def select_rows(batch: PackedBatch, rows: Sequence[int] | np.ndarray) -> PackedBatch:
    """Rows ``rows`` (batch-local, distinct) of ``batch`` as a new model call, in that order
    (``first_row``: the first selected row's global index; none: a call of 0 rows)."""
    rows = distinct_rows(rows, batch.shape[0])
    if not rows.size:
        return empty_batch(batch.shape[1], batch.partition, batch.binding, batch.first_row)
    whole = compact_of(batch)
    return concat_rows([whole.slice_rows(r, r + 1) for r in rows.tolist()]).to_batch()


def concat_batches(batches: Sequence[PackedBatch]) -> PackedBatch:
    """Stack the rows of several model calls (same capacity, partition, binding) into one."""
    return batches[0] if len(batches) == 1 else concat_rows(batches).to_batch()


def flat_columns(rows: CompactRows, ignore_index: int = IGNORE_INDEX) -> dict[str, np.ndarray]:
    """The valid cells of ``rows`` in row-major order, int64 [N] each: ``input_ids``,
    ``labels``, ``shift_labels``, ``position_ids``, ``segment_ids`` and ``valid_index``
    (each cell's flat index into ``R*T``)."""
    lengths = rows.lengths.astype(np.int64, copy=False)
    firsts = rows.target_offsets[:-1]
    owner = np.repeat(np.arange(lengths.shape[0]), lengths)
    local = np.arange(int(lengths.sum()), dtype=np.int64) - firsts[owner]
    src = rows.token_offsets[:-1][owner] + local  # each cell's input in the windows
    inputs, targets = rows.tokens[src].astype(np.int64), rows.tokens[src + 1].astype(np.int64)
    eligible = rows.loss_mask
    before = np.r_[False, eligible[:-1]] & (local > 0)  # the pair into this cell is supervised
    return {
        "input_ids": inputs,
        "labels": np.where(before, inputs, ignore_index),
        "shift_labels": np.where(eligible, targets, ignore_index),
        "position_ids": local,
        "segment_ids": rows.ordinals.astype(np.int64)[owner],
        "valid_index": (rows.row_of * rows.capacity + rows.starts)[owner] + local,
    }


#: What a padding cell holds in rows mode, per column (``input_ids``: the pad id).
PAD_FILL = {"labels": IGNORE_INDEX, "shift_labels": IGNORE_INDEX, "position_ids": 0}
PAD_FILL |= {"segment_ids": NO_SEGMENT}


def pad_cells(flat: np.ndarray, index: np.ndarray, shape: tuple[int, int], fill: int) -> np.ndarray:
    """``flat`` [N] scattered to cells ``index`` of an int64 ``shape`` array of ``fill``."""
    out = np.full(shape[0] * shape[1], fill, dtype=np.int64)
    out[index] = flat
    return out.reshape(shape)


def cu_seq_lens(rows: CompactRows) -> np.ndarray:
    """``[0, cumsum(segment lengths)]``, int32 [S+1], in storage (row-major) order."""
    return np.r_[0, np.cumsum(rows.lengths)].astype(np.int32)
