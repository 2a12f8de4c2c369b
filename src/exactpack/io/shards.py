"""The packed-row Parquet format: one table row per packed row, written and read back.

Flat rows (``layout`` ``"flat"``, ``K`` = occurrences in the row)::

    row           int64           global row index
    tokens        list<int32>     the occurrences' windows back to back (Σ(len+1))
    pair_counts   list<int32>     [K] prediction pairs per occurrence (not TRL's
                                  ``seq_lengths``, which counts tokens)
    seq_starts    list<int32>     [K] column where each occurrence starts
    ordinals      list<int64>     [K] occurrence ordinal = segment id
    source_ids    list<string>    [K]  *
    loss_bits     binary          one bit per target of the row, MSB first  *
    example_ids   list<string>    [K]  *
    range_starts  list<int64>     [K] selected source range [start, end)  *
    range_ends    list<int64>     [K]  *

``*``: stored only when the other columns cannot give them (:func:`layout_of`,
decided from content; the manifest lists each shard's ``columns``). A shard
holds whole model calls. :func:`arrow_to_rows` reads it back as
:class:`CompactRows`, checked.

Forest rows (``layout`` ``"tree"`` in the manifest: ``exactpack pack --tree``) keep
``row`` and store the node columns instead, a row's used cells a prefix of the row
(``T`` cells, ``K`` sequences; :func:`shard_table` of a tree batch)::

    input_ids       list<int32>        [T] input token of each cell
    target_ids      list<int32>        [T] its target
    position_ids    list<int32>        [T] depth along the path
    node_ids        list<int32>        [T] row-local pre-order node id
    node_ends       list<int32>        [T] the node's Euler-tour exit
    parent_ids      list<int32>        [T] the node's parent (-1: a root)
    weights         list<int32>        [T] sequences supervising the target
    sequence_index  list<int64>        [K] each sequence's index in the input
    sequence_cells  list<list<int32>>  [K][L] its cells, in depth order
    sequence_mask   list<list<bool>>   [K][L] which of its targets it supervises

    <carried>       list<scalar>       [K] the input's scalar columns (``id``,
                                       ``ref_chosen_logps``, ...), a value per sequence
                                       (:func:`~exactpack.io.trl_schema.carried_columns`)

A forest shard's manifest entry counts sequences as ``occurrences``, stored cells as
``tokens`` and ``Σ weights`` as ``eligible``, and names the carried columns' value types
(``carried``); its model calls never straddle a shard.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from exactpack.core.batch import PackedBatch
from exactpack.core.binding import INT32_MAX, Binding, Split
from exactpack.core.compact import CompactRows
from exactpack.core.errors import InvalidInput
from exactpack.core.examples import concat_ranges, offsets_of
from exactpack.io.atomic import write_file

FORMAT = "exactpack.packed-rows"
VERSION = 2
#: Target tokens per shard; shards always end on a model-call boundary.
SHARD_TOKENS = 1 << 25
#: How shards are written (``benchmarks/bench_format.py``).
PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 1,
    "use_dictionary": False,
    "write_statistics": False,
    "row_group_size": 4096,
}

FIELDS: dict[str, pa.DataType] = {
    "row": pa.int64(),
    "tokens": pa.list_(pa.int32()),
    "pair_counts": pa.list_(pa.int32()),
    "seq_starts": pa.list_(pa.int32()),
    "ordinals": pa.list_(pa.int64()),
    "source_ids": pa.list_(pa.string()),
    "loss_bits": pa.binary(),
    "example_ids": pa.list_(pa.string()),
    "range_starts": pa.list_(pa.int64()),
    "range_ends": pa.list_(pa.int64()),
}
REQUIRED = ("row", "tokens", "pair_counts", "seq_starts", "ordinals")
#: Every flat column (a shard holds :data:`REQUIRED` and some of the others).
SCHEMA = pa.schema(list(FIELDS.items()))
_CELL = pa.list_(pa.int32())
#: Columns of a forest row with one value per used cell, and with one per sequence.
TREE_CELL_COLUMNS = ("input_ids", "target_ids", "position_ids", "node_ids", "node_ends",
                     "parent_ids", "weights")  # fmt: skip
TREE_SEQUENCE_COLUMNS = ("sequence_index", "sequence_cells", "sequence_mask")
TREE_FIELDS: dict[str, pa.DataType] = {
    "row": pa.int64(),
    **dict.fromkeys(TREE_CELL_COLUMNS, _CELL),
    "sequence_index": pa.list_(pa.int64()),
    "sequence_cells": pa.list_(_CELL),
    "sequence_mask": pa.list_(pa.list_(pa.bool_())),
}
TREE_SCHEMA = pa.schema(list(TREE_FIELDS.items()))
#: Per layout: every column a shard may hold, and those it must.
LAYOUTS = {
    "flat": (SCHEMA, REQUIRED),
    "tree": (TREE_SCHEMA, tuple(TREE_FIELDS)),
}
_PER_OCCURRENCE = (
    "seq_starts",
    "ordinals",
    "source_ids",
    "example_ids",
    "range_starts",
    "range_ends",
)


@dataclass(frozen=True)
class StoredColumns:
    """Which derivable columns an output stores (the same for all its shards)."""

    source_ids: bool = True
    loss_bits: bool = True
    example_ids: bool = True
    ranges: bool = True

    def columns(self) -> list[str]:
        stored = {"source_ids": self.source_ids, "loss_bits": self.loss_bits,
                  "example_ids": self.example_ids, "range_starts": self.ranges,
                  "range_ends": self.ranges}  # fmt: skip
        return [n for n in FIELDS if stored.get(n, True)]

    def schema(self) -> pa.Schema:
        return pa.schema([(n, FIELDS[n]) for n in self.columns()])


#: Every column stored (what a Ray block hands on: the shard decides when it is written).
FULL = StoredColumns()


def union(layouts: Iterable[StoredColumns]) -> StoredColumns:
    """The layout that keeps everything any of ``layouts`` keeps (one schema for many)."""
    found = list(layouts)
    return StoredColumns(
        *(any(getattr(x, f.name) for x in found) for f in dataclasses.fields(StoredColumns))
    )


def arrow_ids(cols: CompactRows) -> CompactRows:
    """``cols`` with NumPy id arrays as Arrow strings (what the format stores)."""

    def strings(values: Any) -> Any:
        plain = values is None or isinstance(values, pa.Array)
        return values if plain else pa.array(values, pa.string())

    sources = strings(cols.source_ids)
    same = cols.example_ids is cols.source_ids
    return dataclasses.replace(
        cols, source_ids=sources, example_ids=sources if same else strings(cols.example_ids)
    )


def layout_of(cols: CompactRows) -> StoredColumns:
    """The leanest layout that keeps everything in ``cols`` (checked by content)."""
    cols = arrow_ids(cols)
    loss = cols.loss_mask is not None and not bool(cols.loss_mask.all())
    examples = (
        cols.example_ids is not None
        and cols.example_ids is not cols.source_ids
        and not cols.example_ids.equals(cols.source_ids)
    )
    ranges = cols.range_starts is not None and not (
        not np.any(cols.range_starts) and np.array_equal(cols.range_ends, cols.lengths + 1)
    )
    sources = examples or ranges
    if not sources and cols.source_ids is not None:
        sources = not cols.source_ids.equals(default_ids(cols.ordinals))
    return StoredColumns(source_ids=sources, loss_bits=loss, example_ids=examples, ranges=ranges)


def default_ids(ordinals: np.ndarray) -> pa.Array:
    """The source ids of an input without ids: each example's row number, as text."""
    # from_buffers, not pa.array: converting a NumPy array imports pandas (0.15 s) first
    return pc.cast(numpy_array(ordinals, pa.int64()), pa.string())


def manifest_record(
    *,
    binding: Binding,
    partition: Split,
    config: dict[str, Any],
    shards: list[dict[str, Any]] | None = None,
    kind: tuple[str, int] = (FORMAT, VERSION),
    **sections: Any,
) -> dict[str, Any]:
    """``manifest.json`` (and :func:`exactpack.hf.pack_dataset`'s ``info``): format and
    version (``kind``), binding, partition, config, ``sections`` in order, ``shards`` last."""
    record: dict[str, Any] = {
        "format": kind[0],
        "version": kind[1],
        "binding": binding.to_dict(),
        "partition": partition.value,
        "config": dict(config),
        **sections,
    }
    if shards is not None:
        record["shards"] = shards
    return record


def numpy_array(values: np.ndarray, kind: pa.DataType) -> pa.Array:
    """A primitive Arrow array over ``values`` (no copy when the dtype already matches)."""
    values = np.ascontiguousarray(values, dtype=kind.to_pandas_dtype())
    return pa.Array.from_buffers(kind, values.shape[0], [None, pa.py_buffer(values)])


def list_array(offsets: np.ndarray, values: Any, kind: pa.DataType) -> pa.ListArray:
    """Arrow ``list<kind>``: list ``i`` is ``values[offsets[i]:offsets[i+1]]`` (int32 offsets;
    primitive NumPy values wrapped without a copy)."""
    if isinstance(values, pa.Array):
        items = values
    elif pa.types.is_primitive(kind):
        items = numpy_array(values, kind)
    else:
        items = pa.array(values, type=kind)
    return pa.ListArray.from_arrays(numpy_array(offsets, pa.int32()), items)


def row_bits(mask: np.ndarray, row_pairs: np.ndarray) -> pa.Array:
    """Per row, its targets' flags packed 8 to a byte (first target = the high bit)."""
    nbytes = (row_pairs + 7) // 8
    offsets = offsets_of(nbytes)
    padded = np.zeros(8 * int(offsets[-1]), dtype=bool)
    pad = 8 * nbytes - row_pairs  # 0..7 unused low bits at the end of each row's bytes
    valid = np.ones(padded.shape[0], dtype=bool)
    valid[concat_ranges(8 * offsets[1:] - pad, pad)] = False
    padded[valid] = mask
    data = np.packbits(padded)
    buffers = [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.binary(), row_pairs.shape[0], buffers)


def token_offsets(cols: CompactRows) -> tuple[np.ndarray, np.ndarray]:
    """Where each occurrence's window and each row start in ``cols.tokens`` (int64
    [K+1], [R+1]); refused when the shard's tokens overflow one list column's offsets."""
    tok = offsets_of(cols.lengths + 1)
    row_tok = tok[cols.row_offsets]
    if int(row_tok[-1]) > INT32_MAX:
        raise InvalidInput(
            f"{int(row_tok[-1]):,} tokens do not fit one Parquet list column"
            " — lower max_rows_per_batch="
        )
    return tok, row_tok


def shard_table(
    cols: CompactRows | PackedBatch, layout: StoredColumns | None = None, first_row: int = 0
) -> pa.Table:
    """``cols`` as a Parquet-ready table (version 2, one table row per packed row) with
    ``layout``'s columns (default: the leanest that keeps everything, :func:`layout_of`);
    forest rows (a tree batch: node columns) as the forest columns, ``row`` numbered from
    ``first_row``: a row's used cells (a prefix of it), node ids row-local, its sequences."""
    if isinstance(cols, CompactRows) and cols.parents is not None:
        cols = cols.to_batch()
    if not isinstance(cols, CompactRows):
        return _forest_table(cols, first_row)
    cols = arrow_ids(cols)
    layout = layout_of(cols) if layout is None else layout
    _, row_tok = token_offsets(cols)
    occ = cols.row_offsets
    first = cols.first_row
    columns: dict[str, pa.Array] = {
        "row": numpy_array(np.arange(first, first + cols.num_rows, dtype=np.int64), pa.int64()),
        "tokens": list_array(row_tok, cols.tokens, pa.int32()),
        "pair_counts": list_array(occ, cols.lengths, pa.int32()),
        "seq_starts": list_array(occ, cols.starts, pa.int32()),
        "ordinals": list_array(occ, cols.ordinals, pa.int64()),
    }
    sources = cols.source_ids if cols.source_ids is not None else default_ids(cols.ordinals)
    if layout.source_ids:
        columns["source_ids"] = list_array(occ, sources, pa.string())
    if layout.loss_bits:
        mask = cols.loss_mask
        if mask is None:
            mask = np.ones(int(cols.lengths.sum()), dtype=bool)
        columns["loss_bits"] = row_bits(mask, np.diff(offsets_of(cols.lengths)[occ]))
    if layout.example_ids:
        examples = cols.example_ids if cols.example_ids is not None else sources
        columns["example_ids"] = list_array(occ, examples, pa.string())
    if layout.ranges:
        whole = cols.range_starts is None
        starts = np.zeros(cols.lengths.shape[0], np.int64) if whole else cols.range_starts
        ends = cols.lengths + 1 if whole else cols.range_ends
        columns["range_starts"] = list_array(occ, starts, pa.int64())
        columns["range_ends"] = list_array(occ, ends, pa.int64())
    return pa.Table.from_arrays(list(columns.values()), schema=layout.schema())


def row_records(rows: CompactRows | PackedBatch) -> list[dict[str, Any]]:
    """The records view of packed rows, flat or forest: one dict per row, the columns of
    :func:`shard_table` less ``row`` (what ``pack_dataset`` returns and
    ``load_packed(...).records()`` reads back; forest rows' node columns are absent on flat
    rows)."""
    return shard_table(rows).drop_columns(["row"]).to_pylist()


def _forest_table(batch: PackedBatch, first_row: int) -> pa.Table:
    """:func:`shard_table` of a tree batch (vectorised, no Python object per cell)."""
    rows, width = batch.shape
    valid = batch.input_valid
    cell_offsets = offsets_of(valid.sum(axis=1).astype(np.int64))  # [R+1]
    first = np.where(valid[:, 0], batch.segments[:, 0], 0).astype(np.int64)[:, None]  # [R, 1]
    node = batch.segments.astype(np.int64)
    parent = batch.node_parent[np.maximum(node, 0)]
    parents = np.where(parent >= 0, parent - first, -1)
    cells = (batch.inputs, batch.targets, batch.positions, node - first,
             batch.node_ends - first, parents, batch.weights)  # fmt: skip
    columns = [numpy_array(np.arange(rows, dtype=np.int64) + first_row, pa.int64())]
    columns += [list_array(cell_offsets, value[valid], pa.int32()) for value in cells]
    # sequences in layout order, row by row; cells as columns of their row
    seq_cells, seq_bounds, seq_mask = batch.sequences()
    seq_row = seq_cells[seq_bounds[:-1]] // width  # [S]
    order = np.argsort(seq_row, kind="stable")
    lens = np.diff(seq_bounds)[order]
    take = np.repeat(seq_bounds[:-1][order] - offsets_of(lens)[:-1], lens)
    take += np.arange(take.shape[0])
    per_row = offsets_of(np.bincount(seq_row, minlength=rows).astype(np.int64))
    inner = numpy_array(offsets_of(lens), pa.int32())
    col32 = numpy_array(seq_cells[take] % width, pa.int32())
    flags = pa.array(seq_mask[take], pa.bool_())
    columns += [
        list_array(per_row, batch.seq_index[order], pa.int64()),
        list_array(per_row, pa.ListArray.from_arrays(inner, col32), _CELL),
        list_array(per_row, pa.ListArray.from_arrays(inner, flags), pa.list_(pa.bool_())),
    ]
    return pa.Table.from_arrays(columns, schema=TREE_SCHEMA)


def shard_bounds(rows: CompactRows, max_rows_per_batch: int, shard_tokens: int) -> np.ndarray:
    """Row boundaries of the shards: whole model calls, about ``shard_tokens`` tokens each."""
    return call_bounds(rows.token_offsets[rows.row_offsets], max_rows_per_batch, shard_tokens)


def call_bounds(row_tokens: np.ndarray, max_rows_per_batch: int, shard_tokens: int) -> np.ndarray:
    """Shard boundaries from the tokens before each row (int64 [rows+1]): whole model
    calls, a new shard when ``shard_tokens`` more tokens have been passed."""
    rows = row_tokens.shape[0] - 1
    calls = np.arange(0, rows, max_rows_per_batch, dtype=np.int64)
    group = row_tokens[calls] // max(1, shard_tokens)
    starts = calls[np.flatnonzero(np.diff(group, prepend=-1))]
    return np.append(starts, rows)


def sha256_file(path: Path) -> str:
    h, block = hashlib.sha256(), memoryview(bytearray(1 << 20))  # one buffer, reused
    with path.open("rb", buffering=0) as f:
        while n := f.readinto(block):
            h.update(block[:n])
    return h.hexdigest()


def _write_shard(table: pa.Table, path: Path) -> None:  # tests patch it to fail or pause
    write_file(path, lambda f: pq.write_table(table, f, **PARQUET_OPTIONS))


def _total(table: pa.Table, name: str) -> int:
    """Values in a list column."""
    return int(pc.sum(pc.list_value_length(table.column(name))).as_py() or 0)


def write_shard_file(table: pa.Table, directory: str | Path, name: str, first_row: int) -> dict:
    """Write a shard table (flat, forest or TRL's) whole as ``directory/name``; its manifest
    entry (occurrences, tokens and eligible targets: forest rows count sequences, stored
    cells and ``Σ weights``; ``carried``: a forest's carried columns and their value types,
    ``{"id": "string"}``)."""
    path = Path(directory) / name
    _write_shard(table, path)
    names = table.column_names
    entry: dict[str, Any] = {"file": name, "first_row": int(first_row), "rows": table.num_rows}
    counted = next(n for n in ("sequence_index", "pair_counts", "seq_lengths") if n in names)
    entry["occurrences"] = _total(table, counted)
    entry["tokens"] = _total(table, "tokens" if "tokens" in names else "input_ids")
    entry |= {"bytes": path.stat().st_size, "sha256": sha256_file(path), "columns": names}
    if "node_ids" in names and (carried := [f for f in table.schema if f.name not in TREE_FIELDS]):
        entry["carried"] = {f.name: str(f.type.value_type) for f in carried}
    entry["eligible"] = eligible_targets(table)
    return entry


def byte_buffers(col: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A binary or string column's value offsets (int64 [n+1], as stored) and its bytes."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    _, obuf, dbuf = col.buffers()
    large = pa.types.is_large_string(col.type) or pa.types.is_large_binary(col.type)
    offsets = np.frombuffer(obuf, np.int64 if large else np.int32)
    offsets = offsets[col.offset : col.offset + len(col) + 1]
    data = np.frombuffer(dbuf, np.uint8) if dbuf is not None else np.zeros(0, np.uint8)
    return offsets.astype(np.int64), data


def eligible_targets(table: pa.Table) -> int:
    """Supervised targets of a shard table (flat, forest: ``Σ weights``, or TRL's)."""
    if "weights" in table.column_names:
        return int(pc.sum(pc.list_flatten(table.column("weights"))).as_py() or 0)
    if "input_ids" in table.column_names and "labels" not in table.column_names:
        tokens = pc.sum(pc.list_value_length(table.column("input_ids"))).as_py() or 0
        return int(tokens) - int(
            pc.sum(pc.list_value_length(table.column("seq_lengths"))).as_py() or 0
        )
    if "input_ids" in table.column_names:
        # read from the buffer: to_numpy() and scalar compute arguments import pandas
        flat = table.column("labels").combine_chunks().flatten()
        buf = flat.buffers()[1]
        labels = np.frombuffer(buf, np.int64) if buf is not None else np.zeros(0, np.int64)
        return int(np.count_nonzero(labels[flat.offset : flat.offset + len(flat)] != -100))
    if "loss_bits" not in table.column_names:
        return int(pc.sum(pc.list_flatten(table.column("pair_counts"))).as_py() or 0)
    offsets, data = byte_buffers(table.column("loss_bits"))
    return int(np.unpackbits(data[int(offsets[0]) : int(offsets[-1])]).sum(dtype=np.int64))


# ---------------------------------------------------------------- reading


def flat_column(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A list column as (values [Σn], offsets int64 [k+1] from 0)."""
    col = table.column(name).combine_chunks()
    offsets = np.asarray(col.offsets, dtype=np.int64)
    return col.flatten().to_numpy(zero_copy_only=False), offsets - offsets[0]


def unpack_bits(col: pa.Array, row_pairs: np.ndarray, where: str) -> np.ndarray:
    """The per-target flags of ``loss_bits`` rows (bool [Σ row_pairs])."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if col.null_count or not pa.types.is_binary(col.type):
        raise ValueError("loss_bits")
    offsets, data = byte_buffers(col)
    nbytes = (row_pairs + 7) // 8
    if not np.array_equal(np.diff(offsets), nbytes):
        raise InvalidInput(f"{where}: loss_bits do not match the rows' pairs — the file is damaged")
    bits = np.unpackbits(data[int(offsets[0]) : int(offsets[-1])]).view(bool)
    valid = np.ones(bits.shape[0], dtype=bool)
    pad = 8 * nbytes - row_pairs
    valid[concat_ranges(8 * (offsets[1:] - offsets[0]) - pad, pad)] = False
    return bits[valid]


def _per_occurrence(table: pa.Table, occ: np.ndarray, name: str) -> np.ndarray | None:
    """A per-occurrence list column's values (None when absent); its lists must be ``occ``'s."""
    if name not in table.column_names:
        return None
    values, offsets = flat_column(table, name)
    if not np.array_equal(offsets, occ):
        raise ValueError(name)
    return values


def arrow_to_rows(
    table: pa.Table,
    *,
    capacity: int,
    partition: Split,
    binding: Binding,
    where: str,
    contiguous: bool = True,
) -> CompactRows:
    """Read packed-row rows back (the columns a shard does not store derived), checked to
    describe whole, in-row occurrences (``contiguous``: and consecutive ``row`` values)."""
    missing = [n for n in REQUIRED if n not in table.column_names]
    if missing:
        raise InvalidInput(f"{where}: missing columns {missing} — not exactpack packed rows")
    damaged = f"{where}: rows are inconsistent — the file is damaged; pack again"
    try:
        tokens, row_tok = flat_column(table, "tokens")
        lengths, occ = flat_column(table, "pair_counts")
        lengths = lengths.astype(np.int64)
        col = {n: _per_occurrence(table, occ, n) for n in _PER_OCCURRENCE}
        if (col["range_starts"] is None) != (col["range_ends"] is None):
            raise ValueError("range columns")
        if lengths.size and (lengths.min() < 0 or int(lengths.sum()) + lengths.size > tokens.size):
            raise ValueError("pair_counts")  # before allocating from them: a claimed 2**31 is 2 GiB
        pairs = offsets_of(lengths)
        if "loss_bits" in table.column_names:
            mask = unpack_bits(table.column("loss_bits"), np.diff(pairs[occ]), where)
        else:
            mask = np.ones(int(pairs[-1]), dtype=bool)
    except (ValueError, pa.ArrowException):
        raise InvalidInput(damaged) from None
    row_ids = table.column("row").to_numpy()
    first_row = int(row_ids[0]) if row_ids.size else 0
    starts = col["seq_starts"].astype(np.int64)
    consistent = (
        np.array_equal(offsets_of(lengths + 1)[occ], row_tok)
        and mask.shape[0] == int(lengths.sum())
        and (lengths.size == 0 or (lengths.min() >= 1 and starts.min() >= 0))
        and bool(np.all(starts + lengths <= capacity))
        and (
            not contiguous
            or np.array_equal(row_ids, np.arange(first_row, first_row + row_ids.size))
        )
    )
    if not consistent:
        raise InvalidInput(damaged)
    return CompactRows(
        tokens=tokens.astype(np.int32, copy=False), lengths=lengths, starts=starts,
        row_offsets=occ, ordinals=col["ordinals"].astype(np.int64), capacity=capacity,
        partition=partition, binding=binding, loss_mask=mask, first_row=first_row,
        **{n: col[n] for n in ("source_ids", "example_ids", "range_starts", "range_ends")},
    ).full()  # fmt: skip
