"""Forest rows as records: the node columns of the packed-row format
(:func:`~exactpack.io.shards.shard_table`) made from forest rows (a tree :class:`PackedBatch`)
(:func:`tree_records`) and one model call made of any records
(:func:`tree_batch_from_rows`). The same records are what
``pack_dataset(..., tree=True)`` returns and ``load_packed(...).records()`` reads back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from exactpack.core.batch import PackedBatch
from exactpack.core.binding import INT32_MAX, Binding, Split
from exactpack.core.compact import CompactRows
from exactpack.core.errors import InvalidInput, positive_int
from exactpack.core.examples import offsets_of, spread
from exactpack.io.integrity import check_shard
from exactpack.io.shards import shard_table


def tree_records(batch: PackedBatch) -> list[dict[str, list[Any]]]:
    """One record per row of ``batch``: :func:`~exactpack.io.shards.shard_table`'s rows, less
    ``row``."""
    return shard_table(batch).drop_columns(["row"]).to_pylist()


def tree_batch_from_rows(rows: list[dict[str, Any]], capacity: int, vocab_size: int) -> PackedBatch:
    """Records of :func:`tree_records` (any subset, any order) as one model call, checked
    as a tree shard is checked on load
    (:func:`~exactpack.io.integrity.check_shard`) before anything is allocated, then
    gathered as :class:`CompactRows` (a node a window) like any packed rows."""
    capacity = positive_int("capacity", capacity, INT32_MAX)
    binding = Binding(vocab_size, "pretokenized", "tree-dataset")  # checks vocab_size
    if not isinstance(rows, (list, tuple)) or not all(isinstance(r, Mapping) for r in rows):
        raise InvalidInput("rows must be a list of tree records (dicts: tree_records)")
    check_shard(rows, {}, None, "tree records", capacity=capacity, vocab_size=binding.vocab_size,
                fail=_argument)  # fmt: skip
    index = [i for row in rows for i in row["sequence_index"]]

    def flat(name: str, dtype: Any = np.int64) -> np.ndarray:  # every row's, back to back
        return np.array([x for row in rows for x in row[name]], dtype=dtype)

    used = np.array([len(row["input_ids"]) for row in rows], dtype=np.int64)
    cell_row, cell_col = np.repeat(np.arange(len(rows)), used), spread(used)[1]
    node = flat("node_ids")  # row-local, 0, 1, 2, ... in column order
    starts = cell_col == 0
    starts[1:] |= node[1:] != node[:-1]
    first = np.flatnonzero(starts)  # each node's first cell
    lens = np.diff(np.append(first, node.shape[0]))
    row_offsets = offsets_of(np.bincount(cell_row[first], minlength=len(rows)))
    base = row_offsets[cell_row[first]]  # each node's row's first node
    parent, depths = flat("parent_ids")[first], flat("position_ids")[first]
    inputs, targets = flat("input_ids"), flat("target_ids")
    # sequences: each ends where its node does (the node of its last cell)
    cells = [c for row in rows for c in row["sequence_cells"]]
    seq_row = np.repeat(np.arange(len(rows)), [len(row["sequence_cells"]) for row in rows])
    last = offsets_of(used)[seq_row] + np.array([c[-1] for c in cells], dtype=np.int64)
    seq_nodes = node[last] + row_offsets[seq_row]
    if np.any(depths[seq_nodes] + lens[seq_nodes] != [len(c) for c in cells]):
        raise InvalidInput("a sequence ends inside a node — pass the records of tree_records")
    return CompactRows(
        tokens=np.insert(inputs, first + lens, targets[first + lens - 1]).astype(np.int32),
        lengths=lens,
        starts=cell_col[first],
        row_offsets=row_offsets,
        ordinals=np.arange(first.shape[0], dtype=np.int64),
        capacity=capacity,
        partition=Split.TRAIN,
        binding=binding,
        parents=np.where(parent >= 0, parent + base, -1),
        depths=depths,
        weights=flat("weights", np.int32),
        seq_index=np.array(index, dtype=np.int64),
        seq_nodes=seq_nodes,
        seq_mask=np.array([x for row in rows for m in row["sequence_mask"] for x in m], bool),
    ).to_batch()


def _argument(r: int) -> Any:
    """The constructor's ``fail``: an argument error naming the record."""
    return lambda what: InvalidInput(
        f"tree record {r}: {what} — pass the records of tree_records, pack_dataset(...,"
        " tree=True) or load_packed(...).records() unchanged"
    )


def max_id(values: list[Any]) -> int:
    """The largest int in nested lists (0 when there is none)."""
    out = 0
    for v in values:
        if isinstance(v, (list, tuple)):
            out = max(out, max_id(list(v)))
        elif isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            out = max(out, int(v))
    return out


__all__ = ["max_id", "tree_batch_from_rows", "tree_records"]
