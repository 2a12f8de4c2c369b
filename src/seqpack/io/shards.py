"""The packed-row Parquet format: one table row per packed row, one shard written or read.

One Parquet row per packed row (``K`` = occurrences in that row)::

    row           int64           global row index
    tokens        list<int32>     the occurrences' windows back to back (Σ(len+1))
    labels        list<int32>     aligned with tokens: the token where its pair is
                                  supervised, -100 otherwise (always on a window's first token)
    seq_lengths   list<int32>     [K] prediction pairs per occurrence
    seq_starts    list<int32>     [K] column where each occurrence starts
    ordinals      list<int64>     [K] occurrence ordinal = segment id
    source_ids    list<string>    [K]
    example_ids   list<string>    [K]
    range_starts  list<int64>     [K] selected source range [start, end)
    range_ends    list<int64>     [K]

A shard holds whole model calls (a multiple of ``max_rows_per_batch`` rows);
:mod:`seqpack.io.store` lays shards out into a packed directory.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from seqpack.core.batch import IGNORE_INDEX
from seqpack.core.binding import INT32_MAX, Binding, Partition
from seqpack.core.compact import CompactRows
from seqpack.core.errors import InvalidInput

FORMAT = "seqpack.packed-rows"
VERSION = 1
#: Target tokens per shard; shards always end on a model-call boundary.
SHARD_TOKENS = 1 << 25


def manifest_record(
    *,
    binding: Binding,
    partition: Partition,
    config: dict[str, int],
    shards: list[dict[str, Any]] | None = None,
    **sections: Any,
) -> dict[str, Any]:
    """The packed output's metadata in one shape: format, version, binding, partition,
    config, then ``sections`` (rows, occurrences, policy, statistics, input, engine…)
    in the order given, and ``shards`` last when there are files.

    ``manifest.json`` of a packed directory (local and Ray engines alike) and
    the ``info`` of :func:`seqpack.hf.pack_dataset` are built here only.
    """
    record: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "binding": binding.to_dict(),
        "partition": partition.value,
        "config": dict(config),
        **sections,
    }
    if shards is not None:
        record["shards"] = shards
    return record


SCHEMA = pa.schema(
    [
        ("row", pa.int64()),
        ("tokens", pa.list_(pa.int32())),
        ("labels", pa.list_(pa.int32())),
        ("seq_lengths", pa.list_(pa.int32())),
        ("seq_starts", pa.list_(pa.int32())),
        ("ordinals", pa.list_(pa.int64())),
        ("source_ids", pa.list_(pa.string())),
        ("example_ids", pa.list_(pa.string())),
        ("range_starts", pa.list_(pa.int64())),
        ("range_ends", pa.list_(pa.int64())),
    ]
)
_PER_OCCURRENCE = ("seq_starts", "ordinals", "source_ids", "example_ids", "range_starts")


def list_array(offsets: np.ndarray, values: np.ndarray, kind: pa.DataType) -> pa.ListArray:
    """Arrow ``list<kind>``: list ``i`` is ``values[offsets[i]:offsets[i+1]]`` (int32 offsets)."""
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, type=kind))


def rows_to_arrow(rows: CompactRows) -> pa.Table:
    """Compact rows as a table with :data:`SCHEMA` (one table row per packed row)."""
    tok = rows.token_offsets
    row_tok = tok[rows.row_offsets]
    if int(row_tok[-1]) > INT32_MAX:
        raise InvalidInput(
            f"{int(row_tok[-1]):,} tokens do not fit one Parquet list column"
            " — lower --max-rows-per-batch"
        )
    labels = rows.labels()
    occ = rows.row_offsets
    first = rows.first_row
    columns = [
        pa.array(np.arange(first, first + rows.num_rows, dtype=np.int64)),
        list_array(row_tok, rows.tokens, pa.int32()),
        list_array(row_tok, labels, pa.int32()),
        list_array(occ, rows.lengths.astype(np.int32), pa.int32()),
        list_array(occ, rows.starts.astype(np.int32), pa.int32()),
        list_array(occ, rows.ordinals, pa.int64()),
        list_array(occ, rows.source_ids, pa.string()),
        list_array(occ, rows.example_ids, pa.string()),
        list_array(occ, rows.range_starts, pa.int64()),
        list_array(occ, rows.range_ends, pa.int64()),
    ]
    return pa.Table.from_arrays(columns, schema=SCHEMA)


def flat_column(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    col = table.column(name).combine_chunks()
    offsets = np.asarray(col.offsets, dtype=np.int64)
    return col.flatten().to_numpy(zero_copy_only=False), offsets - offsets[0]


def arrow_to_rows(
    table: pa.Table,
    *,
    capacity: int,
    partition: Partition,
    binding: Binding,
    where: str,
    contiguous: bool = True,
) -> CompactRows:
    """Read :data:`SCHEMA` rows back, checking they describe whole, in-row occurrences.

    ``contiguous`` also requires consecutive ``row`` values (needed to rebuild
    model calls; not to recover the examples).
    """
    missing = [n for n in SCHEMA.names if n not in table.column_names]
    if missing:
        raise InvalidInput(f"{where}: missing columns {missing} — not seqpack packed rows")
    tokens, row_tok = flat_column(table, "tokens")
    labels, label_off = flat_column(table, "labels")
    lengths, occ = flat_column(table, "seq_lengths")
    flat = {name: flat_column(table, name) for name in (*_PER_OCCURRENCE, "range_ends")}
    lengths = lengths.astype(np.int64)
    tok = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths + 1, out=tok[1:])
    starts = flat["seq_starts"][0].astype(np.int64)
    row_ids = table.column("row").to_numpy()
    first_row = int(row_ids[0]) if row_ids.size else 0
    consistent = (
        all(np.array_equal(off, occ) for _, off in flat.values())
        and np.array_equal(label_off, row_tok)
        and np.array_equal(tok[occ], row_tok)
        and (lengths.size == 0 or (lengths.min() >= 1 and starts.min() >= 0))
        and bool(np.all(starts + lengths <= capacity))
        and (
            not contiguous
            or np.array_equal(row_ids, np.arange(first_row, first_row + row_ids.size))
        )
    )
    if not consistent:
        raise InvalidInput(f"{where}: rows are inconsistent — the file is damaged; pack again")
    supervised = labels != IGNORE_INDEX
    if np.any(supervised & (labels != tokens)):
        raise InvalidInput(f"{where}: a label differs from its token — the file is damaged")
    keep = np.ones(tokens.shape[0], dtype=bool)
    keep[tok[:-1]] = False
    return CompactRows(
        tokens=tokens.astype(np.int32, copy=False),
        loss_mask=supervised[keep],
        lengths=lengths,
        starts=starts,
        row_offsets=occ,
        ordinals=flat["ordinals"][0].astype(np.int64),
        source_ids=flat["source_ids"][0].astype(object),
        example_ids=flat["example_ids"][0].astype(object),
        range_starts=flat["range_starts"][0].astype(np.int64),
        range_ends=flat["range_ends"][0].astype(np.int64),
        capacity=capacity,
        partition=partition,
        binding=binding,
        first_row=first_row,
    )


def shard_bounds(rows: CompactRows, max_rows_per_batch: int, shard_tokens: int) -> np.ndarray:
    """Row boundaries of the shards: whole model calls, about ``shard_tokens`` tokens each."""
    calls = np.arange(0, rows.num_rows, max_rows_per_batch, dtype=np.int64)
    cum = rows.token_offsets[rows.row_offsets[calls]]
    group = cum // max(1, shard_tokens)
    starts = calls[np.flatnonzero(np.diff(group, prepend=-1))]
    return np.append(starts, rows.num_rows)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_shard(table: pa.Table, path: Path) -> None:
    with path.open("wb") as f:
        pq.write_table(table, f, compression="zstd", row_group_size=4096)
        f.flush()
        os.fsync(f.fileno())


def write_shard_file(table: pa.Table, directory: str | Path, name: str) -> dict[str, Any]:
    """Write :data:`SCHEMA` rows as ``directory/name``; return its manifest entry.

    The file is written under a unique hidden name, fsynced and renamed, so a
    writer that runs twice (a task retried after a crash) replaces it whole
    and a reader never sees a torn shard. The entry has the keys of
    :func:`write_packed`'s: file, first_row, rows, occurrences, tokens,
    bytes, sha256.
    """
    directory = Path(directory)
    path = directory / name
    part = directory / f".{name}.{secrets.token_hex(4)}.part"
    try:
        _write_shard(table, part)
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)
    rows = table.column("row")
    return {
        "file": name,
        "first_row": int(rows[0].as_py()) if table.num_rows else 0,
        "rows": table.num_rows,
        "occurrences": int(flat_column(table, "seq_lengths")[1][-1]),
        "tokens": int(flat_column(table, "tokens")[1][-1]),
        "bytes": path.stat().st_size,
        "sha256": sha256_file(path),
    }
