"""Tree-packed rows as a ``datasets.Dataset``, and the rows back into a model call.

:func:`pack_tree_dataset` (``pack_dataset(..., tree=True)``) reads the
tree columns of a ``datasets.Dataset`` (``prompt_ids`` + ``completion_ids``,
TRL's DPO ``prompt_input_ids`` / ``chosen_input_ids`` /
``rejected_input_ids``, or ``input_ids`` + ``group``), packs the tries and
returns one record per row, its cells a prefix of the row (padding is not
stored):

==================  ========================================================
column              per cell / per sequence
==================  ========================================================
``input_ids``       input token of each cell
``target_ids``      its target (every cell has one)
``position_ids``    depth along the path
``node_ids``        row-local pre-order node id
``node_ends``       the node's Euler-tour exit (one past its last descendant)
``parent_ids``      the node's parent (-1: a root), per cell
``weights``         multiplicity: sequences supervising the target
``sequence_index``  per sequence in the row: its index in the input
``sequence_cells``  per sequence: its cells (columns), in depth order
``sequence_mask``   per sequence: which of its targets it supervises
==================  ========================================================

:func:`tree_batch_from_rows` turns records back into a
:class:`~seqpack.core.tree.TreeBatch` for :func:`seqpack.hf.tree_inputs.tree_inputs`.
``format="trl"`` is refused: TRL's packed rows describe disjoint sequences
(``seq_lengths``, restarting ``position_ids``) and have no node columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from seqpack.core.binding import Binding
from seqpack.core.errors import InvalidInput
from seqpack.core.tree import TreeBatch, pack_tree
from seqpack.core.tree_input import TREE_COLUMNS, groups_from_columns
from seqpack.io.tree_store import tree_records

CELL_COLUMNS = (
    "input_ids",
    "target_ids",
    "position_ids",
    "node_ids",
    "node_ends",
    "parent_ids",
    "weights",
)


def pack_tree_dataset(
    dataset: Any,
    capacity: int | None = None,
    policy: str | None = None,
    *,
    format: str = "seqpack",
    vocab_size: int | None = None,
    **policy_options: Any,
) -> Any:
    """Tree-pack ``dataset``'s groups into a ``datasets.Dataset`` of rows (module docstring)."""
    import datasets

    if format == "trl":
        raise InvalidInput(
            "format='trl' cannot express a tree: TRL's packed rows hold disjoint sequences"
            " (seq_lengths, restarting position_ids) and no node/parent columns — use the"
            " default format with tree=True"
        )
    if capacity is None:
        raise InvalidInput("pack_dataset(..., tree=True) needs capacity= (cells per row)")
    wanted = {name for names in TREE_COLUMNS for name in names}
    columns = {n: dataset[n] if n in wanted else [] for n in dataset.column_names}
    vocab = vocab_size or 1 + max(
        (max(_ids(columns[n]), default=0) for n in columns if n in wanted and n != "group"),
        default=0,
    )
    groups = groups_from_columns(columns, Binding(int(vocab), "pretokenized", "tree-dataset"))
    epoch = pack_tree(groups, capacity, policy=policy or "best-fit-decreasing", **policy_options)
    (batch,) = epoch.batches
    return datasets.Dataset.from_list(rows_of(batch))


def _ids(values: list[Any]) -> list[int]:
    out: list[int] = []
    for v in values:
        out.extend(_ids(list(v)) if isinstance(v, (list, tuple)) else [int(v)])
    return out


#: One record per row of a :class:`TreeBatch` (the columns of the module docstring).
rows_of = tree_records


def tree_batch_from_rows(rows: list[dict[str, Any]], capacity: int, vocab_size: int) -> TreeBatch:
    """Records of :func:`pack_tree_dataset` (any subset, any order) as one model call."""
    n = len(rows)
    shape = (n, capacity)
    cells = {name: np.full(shape, -1, dtype=np.int64) for name in CELL_COLUMNS}
    valid = np.zeros(shape, dtype=bool)
    offset = 0
    seq_index, seq_cells, seq_mask, bounds = [], [], [], [0]
    node_tables = []
    for r, row in enumerate(rows):
        used = len(row["input_ids"])
        if used > capacity:
            raise InvalidInput(f"row {r} holds {used} cells; capacity is {capacity}")
        for name in CELL_COLUMNS:
            values = np.asarray(row[name], dtype=np.int64)
            shift = offset if name in ("node_ids", "node_ends") else 0
            if name == "parent_ids":
                values = np.where(values >= 0, values + offset, -1)
            cells[name][r, :used] = values + shift
        valid[r, :used] = True
        node = cells["node_ids"][r, :used]
        starts = np.flatnonzero(np.r_[True, node[1:] != node[:-1]])
        node_tables.append((r, starts, np.diff(np.r_[starts, used]), cells, used))
        offset += int(node.max()) + 1 if used else 0
        for s, c, m in zip(
            row["sequence_index"], row["sequence_cells"], row["sequence_mask"], strict=True
        ):
            seq_index.append(s)
            seq_cells.append(r * capacity + np.asarray(c, dtype=np.int64))
            seq_mask.append(np.asarray(m, dtype=bool))
            bounds.append(bounds[-1] + len(c))
    tables = {k: [] for k in ("row", "col", "len", "pos", "parent", "end")}
    for r, starts, lens, c, _ in node_tables:
        tables["row"].append(np.full(starts.shape[0], r))
        tables["col"].append(starts)
        tables["len"].append(lens)
        tables["pos"].append(c["position_ids"][r, starts])
        tables["parent"].append(c["parent_ids"][r, starts])
        tables["end"].append(c["node_ends"][r, starts])
    cat = {
        k: np.concatenate(v).astype(np.int64) if v else np.zeros(0, np.int64)
        for k, v in tables.items()
    }
    weights = np.where(valid, cells["weights"], 0).astype(np.int32)
    empty = np.zeros(0, dtype=np.int64)
    return TreeBatch(
        inputs=cells["input_ids"].astype(np.int32),
        targets=cells["target_ids"].astype(np.int32),
        nodes=cells["node_ids"].astype(np.int32),
        node_ends=cells["node_ends"].astype(np.int32),
        positions=np.where(valid, cells["position_ids"], 0).astype(np.int32),
        input_valid=valid,
        loss_mask=weights > 0,
        weights=weights,
        node_row=cat["row"],
        node_col=cat["col"],
        node_len=cat["len"],
        node_pos=cat["pos"],
        node_parent=cat["parent"],
        node_end=cat["end"],
        seq_index=np.asarray(seq_index, dtype=np.int64),
        seq_group=np.zeros(len(seq_index), dtype=np.int64),
        seq_bounds=np.asarray(bounds, dtype=np.int64),
        seq_cells=np.concatenate(seq_cells) if seq_cells else empty,
        seq_loss_mask=np.concatenate(seq_mask) if seq_mask else np.zeros(0, bool),
        binding=Binding(vocab_size, "pretokenized", "tree-dataset"),
    )


@dataclass
class TreeCollator:
    """``DataLoader`` collate function for :func:`pack_tree_dataset` records.

    Returns ``{"inputs": tree_inputs(...), "batch": TreeBatch}``: call
    ``model(**out["inputs"])`` and take the loss or the per-sequence views
    from ``out["batch"]`` (:mod:`seqpack.nn.tree_attention`).
    """

    capacity: int
    vocab_size: int
    attn_implementation: str = "seqpack_tree"
    config: Any = None
    dtype: Any = None
    pad_token_id: int = 0

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        from seqpack.hf.tree_inputs import tree_inputs

        batch = tree_batch_from_rows(list(features), self.capacity, self.vocab_size)
        inputs = tree_inputs(
            batch,
            self.attn_implementation,
            config=self.config,
            dtype=self.dtype or torch.float32,
            pad_token_id=self.pad_token_id,
        )
        return {"inputs": inputs, "batch": batch}


__all__ = ["CELL_COLUMNS", "TreeCollator", "pack_tree_dataset", "rows_of", "tree_batch_from_rows"]
