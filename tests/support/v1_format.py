"""The version-1 packed format, written as exactpack 0.2 wrote it (kept to test that it still loads).

Version 1 stored, per packed row, ``tokens``, a ``labels`` column aligned
with them (the token where its pair is supervised, -100 otherwise and on
each window's first token), ``seq_lengths`` (prediction pairs per
occurrence, the name TRL uses for tokens) and every provenance column.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from exactpack.core.compact import CompactRows
from exactpack.io.shards import V1_SCHEMA, manifest_record, sha256_file, shard_bounds


def _lists(offsets, values, kind):
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, kind))


def v1_table(rows: CompactRows) -> pa.Table:
    tok = rows.token_offsets
    row_tok = tok[rows.row_offsets]
    occ = rows.row_offsets
    first = rows.first_row
    columns = [
        pa.array(np.arange(first, first + rows.num_rows, dtype=np.int64)),
        _lists(row_tok, rows.tokens, pa.int32()),
        _lists(row_tok, rows.labels(), pa.int32()),
        _lists(occ, rows.lengths.astype(np.int32), pa.int32()),
        _lists(occ, rows.starts.astype(np.int32), pa.int32()),
        _lists(occ, rows.ordinals, pa.int64()),
        _lists(occ, rows.source_ids, pa.string()),
        _lists(occ, rows.example_ids, pa.string()),
        _lists(occ, rows.range_starts, pa.int64()),
        _lists(occ, rows.range_ends, pa.int64()),
    ]
    return pa.Table.from_arrays(columns, schema=V1_SCHEMA)


def v1_manifest(rows: CompactRows, max_rows_per_batch: int, shards=None) -> dict:
    record = manifest_record(
        binding=rows.binding,
        partition=rows.partition,
        config={"capacity": rows.capacity, "max_rows_per_batch": max_rows_per_batch},
        shards=shards,
        rows=rows.num_rows,
        occurrences=len(rows),
    )
    return record | {"version": 1}


def write_v1(rows: CompactRows, out: Path, max_rows_per_batch: int, shard_tokens: int) -> dict:
    """A version-1 packed directory of ``rows`` at ``out`` (zstd shards, manifest last)."""
    out.mkdir(parents=True)
    bounds = shard_bounds(rows, max_rows_per_batch, shard_tokens)
    shards = []
    for k, (a, b) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)):
        path = out / f"shard-{k:05d}.parquet"
        table = v1_table(rows.slice_rows(a, b))
        pq.write_table(table, path, compression="zstd", row_group_size=4096)
        shards.append(
            {
                "file": path.name,
                "first_row": a,
                "rows": b - a,
                "occurrences": int(rows.row_offsets[b] - rows.row_offsets[a]),
                "tokens": table.column("tokens").combine_chunks().flatten().__len__(),
                "bytes": os.path.getsize(path),
                "sha256": sha256_file(path),
            }
        )
    manifest = v1_manifest(rows, max_rows_per_batch, shards)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def v1_dataset(rows: CompactRows, max_rows_per_batch: int, statistics: dict):
    """What ``exactpack.hf.pack_dataset`` returned in version 1: the rows and the metadata."""
    import datasets

    meta = v1_manifest(rows, max_rows_per_batch) | {"statistics": statistics}
    info = datasets.DatasetInfo(description=json.dumps({"exactpack": meta}))
    return datasets.Dataset(datasets.table.InMemoryTable(v1_table(rows)), info=info)
