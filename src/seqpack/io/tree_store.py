"""Tree-packed rows on disk: the packed format's version 3 (``seqpack pack --tree``).

A tree output is a packed directory like a flat one (``manifest.json`` with
``format`` :data:`~seqpack.io.shards.FORMAT`, binding, partition, config,
policy, statistics and every shard's size and sha256; published atomically),
with ``"version": 3`` and ``"layout": "tree"``. One Parquet row per packed
row, its used cells a prefix of the row (padding is not stored)::

    row             int64              global row index
    input_ids       list<int32>        [T] input token of each cell
    target_ids      list<int32>        [T] its target
    position_ids    list<int32>        [T] depth along the path
    node_ids        list<int32>        [T] row-local pre-order node id
    node_ends       list<int32>        [T] the node's Euler-tour exit
    parent_ids      list<int32>        [T] the node's parent (-1: a root)
    weights         list<int32>        [T] multiplicity: sequences supervising the target
    sequence_index  list<int64>        [K] each sequence's index in the input
    sequence_cells  list<list<int32>>  [K][L] its cells, in depth order
    sequence_mask   list<list<bool>>   [K][L] which of its targets it supervises

:func:`tree_records` makes these records from a
:class:`~seqpack.core.tree.TreeBatch`; :class:`TreeStore` (what
:func:`seqpack.io.store.load_packed` returns for a tree output) gives them
back, for :func:`seqpack.hf.tree_data.tree_batch_from_rows` /
``TreeCollator``. Versions 1 and 2 (flat rows) are read as before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from seqpack.core.binding import Binding, Partition
from seqpack.core.errors import InvalidInput, PartitionMismatch
from seqpack.core.tree import TreeBatch
from seqpack.io.atomic import Output, write_file
from seqpack.io.integrity import TreeManifest, decode
from seqpack.io.shards import FORMAT, PARQUET_OPTIONS, TREE_VERSION, manifest_record, sha256_file

_CELL = pa.list_(pa.int32())
TREE_FIELDS: dict[str, pa.DataType] = {
    "row": pa.int64(),
    "input_ids": _CELL,
    "target_ids": _CELL,
    "position_ids": _CELL,
    "node_ids": _CELL,
    "node_ends": _CELL,
    "parent_ids": _CELL,
    "weights": _CELL,
    "sequence_index": pa.list_(pa.int64()),
    "sequence_cells": pa.list_(_CELL),
    "sequence_mask": pa.list_(pa.list_(pa.bool_())),
}
TREE_SCHEMA = pa.schema(list(TREE_FIELDS.items()))
#: Rows per shard of a tree output.
TREE_SHARD_ROWS = 4096


def tree_records(batch: TreeBatch) -> list[dict[str, list[Any]]]:
    """One record per row of ``batch``: its used cells (a prefix of the row), node ids
    row-local, and its sequences (the columns of the module docstring, less ``row``)."""
    width = batch.shape[1]
    seq_row = batch.seq_cells[batch.seq_bounds[:-1]] // width
    parent = np.where(batch.node_parent >= 0, batch.node_parent, -1)
    rows = []
    for r in range(batch.shape[0]):
        used = int(batch.input_valid[r].sum())
        first = int(batch.nodes[r, 0])
        node = batch.nodes[r, :used]
        cells = {
            "input_ids": batch.inputs[r, :used],
            "target_ids": batch.targets[r, :used],
            "position_ids": batch.positions[r, :used],
            "node_ids": node - first,
            "node_ends": batch.node_ends[r, :used] - first,
            "parent_ids": np.where(parent[node] >= 0, parent[node] - first, -1),
            "weights": batch.weights[r, :used],
        }
        record = {name: value.astype(np.int64).tolist() for name, value in cells.items()}
        seqs = np.flatnonzero(seq_row == r)
        record["sequence_index"] = batch.seq_index[seqs].tolist()
        record["sequence_cells"] = [(batch.sequence_cells(i) % width).tolist() for i in seqs]
        record["sequence_mask"] = [
            batch.seq_loss_mask[batch.seq_bounds[i] : batch.seq_bounds[i + 1]].tolist()
            for i in seqs
        ]
        rows.append(record)
    return rows


def write_tree_shards(
    records: list[dict[str, Any]],
    output: Output,
    *,
    binding: Binding,
    partition: Partition,
    config: dict[str, Any],
    shard_rows: int = TREE_SHARD_ROWS,
    **sections: Any,
) -> dict[str, Any]:
    """Write tree ``records`` as version-3 shards into the held ``output``
    (:func:`seqpack.io.atomic.open_output`; each shard whole or not at all) and return
    the manifest for :meth:`~seqpack.io.atomic.Output.commit`. ``config`` holds
    ``capacity`` and ``max_rows_per_batch``; ``sections`` go into the manifest."""
    shards = []
    for k, a in enumerate(range(0, max(len(records), 1), shard_rows)):
        part = records[a : a + shard_rows]
        table = pa.Table.from_pylist(
            [{"row": a + i} | rec for i, rec in enumerate(part)], schema=TREE_SCHEMA
        )
        path = output.path / output.shard(k)
        write_file(path, lambda f, t=table: pq.write_table(t, f, **PARQUET_OPTIONS))
        shards.append(
            {
                "file": path.name,
                "first_row": a,
                "rows": table.num_rows,
                "bytes": path.stat().st_size,
                "sha256": sha256_file(path),
                "columns": table.column_names,
            }
        )
    return manifest_record(
        binding=binding,
        partition=partition,
        config=config,
        shards=shards,
        kind=(FORMAT, TREE_VERSION),
        layout="tree",
        rows=len(records),
        sequences=sum(len(r["sequence_index"]) for r in records),
        **sections,
    )


def is_tree_manifest(manifest: Any) -> bool:
    return isinstance(manifest, dict) and manifest.get("layout") == "tree"


class TreeStore:
    """A tree output read back: ``len(store)`` rows; ``store[i]`` / :meth:`records` give
    the row records :func:`seqpack.hf.tree_data.tree_batch_from_rows` takes; ``capacity``
    and ``binding`` say how to call it."""

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        where = path / "manifest.json"
        if manifest.get("format") != FORMAT or manifest.get("version") != TREE_VERSION:
            raise InvalidInput(
                f"{where}: a tree output of format {manifest.get('format')!r} version"
                f" {manifest.get('version')!r}; this seqpack reads tree outputs of version"
                f" {TREE_VERSION} — pack it again with this version"
            )
        m = decode(manifest, TreeManifest, where)
        self.binding = Binding.from_dict(manifest["binding"])
        self.partition = Partition(m.partition)
        self.capacity, self.max_rows_per_batch = m.config.capacity, m.config.max_rows_per_batch
        self.num_rows, self.shards = m.rows, list(manifest["shards"])
        if any(Path(s.file).name != s.file or s.file in ("", ".", "..") for s in m.shards):
            raise InvalidInput(f"{where}: a shard file is not a plain file name — pack again")
        if sum(s.rows for s in m.shards) != self.num_rows:
            raise InvalidInput(f"{where}: shards do not hold {self.num_rows} rows — pack again")
        self.path, self.manifest = path, manifest
        self._cached: tuple[int, list[dict[str, Any]]] | None = None

    def require(
        self, expected_binding: Binding | None, expected_partition: Partition | str | None
    ) -> None:
        if expected_binding is not None:
            expected_binding.require(self.binding, f"packed data {self.path}")
        if expected_partition is not None and self.partition is not Partition.parse(
            expected_partition
        ):
            raise PartitionMismatch(
                f"packed data {self.path} holds partition {self.partition.value!r}, not"
                f" {Partition.parse(expected_partition).value!r}"
            )

    def __len__(self) -> int:
        return self.num_rows

    def shard_records(self, k: int) -> list[dict[str, Any]]:
        """Shard ``k``'s records (checked against the manifest and the capacity)."""
        if self._cached is None or self._cached[0] != k:
            entry, file = self.shards[k], self.path / self.shards[k]["file"]
            try:
                table = pq.read_table(file)
            except (pa.ArrowException, OSError) as err:
                raise InvalidInput(f"{file}: cannot read the shard ({err}) — pack again") from None
            if table.schema != TREE_SCHEMA or table.num_rows != entry["rows"]:
                raise InvalidInput(f"{file}: not the tree shard the manifest lists — pack again")
            records = table.to_pylist()
            for i, rec in enumerate(records):
                _check_record(rec, entry["first_row"] + i, self.capacity, str(file))
            self._cached = (k, records)
        return self._cached[1]

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < self.num_rows:
            raise IndexError(f"row {i} outside 0..{self.num_rows - 1}")
        k = max(j for j, s in enumerate(self.shards) if s["first_row"] <= i)
        return self.shard_records(k)[i - self.shards[k]["first_row"]]

    def records(self) -> list[dict[str, Any]]:
        """Every row's record, in row order (``row`` dropped)."""
        rows = [rec for k in range(len(self.shards)) for rec in self.shard_records(k)]
        return [{n: v for n, v in rec.items() if n != "row"} for rec in rows]


def _check_record(rec: dict[str, Any], row: int, capacity: int, where: str) -> None:
    used = len(rec["input_ids"])
    bad = (
        rec["row"] != row
        or used > capacity
        or any(rec[n] is None or len(rec[n]) != used for n in TREE_FIELDS if n.endswith("_ids"))
        or len(rec["weights"]) != used
        or len(rec["sequence_cells"]) != len(rec["sequence_index"])
        or len(rec["sequence_mask"]) != len(rec["sequence_index"])
        or any(
            len(c) != len(m)
            for c, m in zip(rec["sequence_cells"], rec["sequence_mask"], strict=False)
        )
        or any(not 0 <= x < used for c in rec["sequence_cells"] for x in c)
    )
    if bad:
        raise InvalidInput(f"{where}: row {row} is not a consistent tree row — pack again")


def open_tree_store(path: Path) -> TreeStore | None:
    """The tree output at ``path``, or None when its manifest is not a tree output's."""
    try:
        manifest = json.loads((path / "manifest.json").read_bytes())
    except (OSError, ValueError, RecursionError):
        return None  # the flat reader names the problem
    return TreeStore(path, manifest) if is_tree_manifest(manifest) else None


__all__ = ["TREE_SCHEMA", "TreeStore", "open_tree_store", "tree_records", "write_tree_shards"]
