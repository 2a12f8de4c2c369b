"""Forest rows as records: the node columns of the packed-row format
(:func:`~exactpack.io.shards.shard_table`) made from a :class:`~exactpack.core.tree.TreeBatch`
(:func:`tree_records`) and one model call made of any records
(:func:`tree_batch_from_rows`). The same records are what
``pack_dataset(..., tree=True)`` returns and ``load_packed(...).records()`` reads back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from exactpack.core.binding import INT32_MAX, Binding
from exactpack.core.errors import InvalidInput, positive_int
from exactpack.core.examples import offsets_of
from exactpack.core.tree import TreeBatch
from exactpack.io.integrity import check_shard
from exactpack.io.shards import shard_table


def tree_records(batch: TreeBatch) -> list[dict[str, list[Any]]]:
    """One record per row of ``batch``: :func:`~exactpack.io.shards.shard_table`'s rows, less
    ``row``."""
    return shard_table(batch).drop_columns(["row"]).to_pylist()


def tree_batch_from_rows(rows: list[dict[str, Any]], capacity: int, vocab_size: int) -> TreeBatch:
    """Records of :func:`tree_records` (any subset, any order) as one model call, checked
    as a tree shard is checked on load
    (:func:`~exactpack.io.integrity.check_shard`) before anything is allocated."""
    capacity = positive_int("capacity", capacity, INT32_MAX)
    binding = Binding(vocab_size, "pretokenized", "tree-dataset")  # checks vocab_size
    if not isinstance(rows, (list, tuple)) or not all(isinstance(r, Mapping) for r in rows):
        raise InvalidInput("rows must be a list of tree records (dicts: tree_records)")
    check_shard(rows, {}, None, "tree records", capacity=capacity, vocab_size=binding.vocab_size,
                fail=_argument)  # fmt: skip
    used = np.array([len(row["input_ids"]) for row in rows], dtype=np.int64)
    valid = np.arange(capacity) < used[:, None]  # [R, T]: a row's cells are a prefix

    def cells(name: str) -> np.ndarray:
        out = np.full(valid.shape, -1, dtype=np.int64)
        out[valid] = [x for row in rows for x in row[name]]
        return out

    def flat(name: str, dtype: Any) -> np.ndarray:
        return np.array([x for row in rows for s in row[name] for x in s], dtype=dtype)

    # row-local node ids -> batch ids: each row's ids follow the rows before it
    shift = offsets_of(cells("node_ids").max(axis=1, initial=-1) + 1)[:-1, None]
    nodes, node_ends, parents = (
        np.where(x >= 0, x + shift, -1) for x in map(cells, ("node_ids", "node_ends", "parent_ids"))
    )
    lens = np.array([len(c) for row in rows for c in row["sequence_cells"]], dtype=np.int64)
    seq_row = np.repeat(np.arange(len(rows)), [len(row["sequence_cells"]) for row in rows])
    # Node ids run in (row, column) order, so node k starts at the k-th change of id.
    first = valid & np.c_[np.ones((len(rows), 1), bool), nodes[:, 1:] != nodes[:, :-1]]
    node_row, node_col = (x.astype(np.int64) for x in np.nonzero(first))
    node_len = np.bincount(nodes[valid], minlength=node_row.shape[0]).astype(np.int64)
    weights = np.where(valid, cells("weights"), 0).astype(np.int32)
    positions = cells("position_ids")
    return TreeBatch(
        inputs=cells("input_ids").astype(np.int32),
        targets=cells("target_ids").astype(np.int32),
        nodes=nodes.astype(np.int32),
        node_ends=node_ends.astype(np.int32),
        positions=np.where(valid, positions, 0).astype(np.int32),
        input_valid=valid,
        loss_mask=weights > 0,
        weights=weights,
        node_row=node_row,
        node_col=node_col,
        node_len=node_len,
        node_pos=positions[node_row, node_col],
        node_parent=parents[node_row, node_col],
        node_end=node_ends[node_row, node_col],
        seq_index=np.array([i for row in rows for i in row["sequence_index"]], dtype=np.int64),
        seq_bounds=offsets_of(lens),
        seq_cells=flat("sequence_cells", np.int64) + np.repeat(seq_row * capacity, lens),
        seq_loss_mask=flat("sequence_mask", bool),
        binding=binding,
    )


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
