"""Packed-row tables read back as :class:`~seqpack.core.compact.CompactRows` (versions 1 and 2).

Version 2 (:mod:`seqpack.io.shards`) stores ``pair_counts`` and, where they
cannot be derived, ``loss_bits``, ``source_ids``, ``example_ids`` and the
ranges; version 1 stored ``seq_lengths`` and a ``labels`` column aligned
with ``tokens`` (-100 where a pair is not supervised and on each window's
first token). Which one a table is follows from its columns, so a shard, a
``datasets`` row or a collator's features are read alike. Every read checks
that the rows describe whole, in-row occurrences.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from seqpack.core.batch import IGNORE_INDEX
from seqpack.core.binding import Binding, Split
from seqpack.core.compact import CompactRows
from seqpack.core.errors import InvalidInput
from seqpack.core.examples import concat_ranges
from seqpack.io.shards import REQUIRED

#: The version-1 schema (every column stored; ``labels`` aligned with ``tokens``).
V1_SCHEMA = pa.schema(
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
V1_COLUMNS = tuple(V1_SCHEMA.names)
_PER_OCCURRENCE = ("seq_starts", "ordinals", "source_ids", "example_ids", "range_starts")


def is_version_1(names: list[str] | set[str]) -> bool:
    return "seq_lengths" in names and "pair_counts" not in names


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
    _, obuf, dbuf = col.buffers()
    offsets = np.frombuffer(obuf, dtype=np.int32)[col.offset : col.offset + len(col) + 1]
    offsets = offsets.astype(np.int64)
    nbytes = (row_pairs + 7) // 8
    if not np.array_equal(np.diff(offsets), nbytes):
        raise InvalidInput(f"{where}: loss_bits do not match the rows' pairs — the file is damaged")
    data = np.frombuffer(dbuf, dtype=np.uint8) if dbuf is not None else np.zeros(0, np.uint8)
    bits = np.unpackbits(data[int(offsets[0]) : int(offsets[-1])]).view(bool)
    valid = np.ones(bits.shape[0], dtype=bool)
    pad = 8 * nbytes - row_pairs
    valid[concat_ranges(8 * (offsets[1:] - offsets[0]) - pad, pad)] = False
    return bits[valid]


def _ids(table: pa.Table, name: str, occ: np.ndarray) -> np.ndarray | None:
    if name not in table.column_names:
        return None
    values, offsets = flat_column(table, name)
    if not np.array_equal(offsets, occ):
        raise ValueError(name)
    return values.astype(object)


def _v2(table: pa.Table, where: str) -> dict:
    """The per-occurrence and per-token arrays of a version-2 table, derived parts filled."""
    missing = [n for n in REQUIRED if n not in table.column_names]
    if missing:
        raise InvalidInput(f"{where}: missing columns {missing} — not seqpack packed rows")
    tokens, row_tok = flat_column(table, "tokens")
    lengths, occ = flat_column(table, "pair_counts")
    lengths = lengths.astype(np.int64)
    per = {name: flat_column(table, name) for name in ("seq_starts", "ordinals")}
    if not all(np.array_equal(off, occ) for _, off in per.values()):
        raise ValueError("per-occurrence columns")
    ordinals = per["ordinals"][0].astype(np.int64)
    sources = _ids(table, "source_ids", occ)
    if sources is None:
        sources = ordinals.astype(str).astype(object)
    examples = _ids(table, "example_ids", occ)
    ranges = [_ids(table, n, occ) for n in ("range_starts", "range_ends")]
    if (ranges[0] is None) != (ranges[1] is None):
        raise ValueError("range columns")
    pairs = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=pairs[1:])
    if "loss_bits" in table.column_names:
        mask = unpack_bits(table.column("loss_bits"), np.diff(pairs[occ]), where)
    else:
        mask = np.ones(int(pairs[-1]), dtype=bool)
    return {
        "tokens": tokens,
        "row_tok": row_tok,
        "lengths": lengths,
        "occ": occ,
        "starts": per["seq_starts"][0].astype(np.int64),
        "ordinals": ordinals,
        "loss_mask": mask,
        "source_ids": sources,
        "example_ids": sources if examples is None else examples,
        "range_starts": np.zeros_like(lengths) if ranges[0] is None else ranges[0].astype(np.int64),
        "range_ends": lengths + 1 if ranges[1] is None else ranges[1].astype(np.int64),
    }


def _v1(table: pa.Table, where: str) -> dict:
    """The same arrays from a version-1 table (``seq_lengths`` and ``labels``)."""
    missing = [n for n in V1_COLUMNS if n not in table.column_names]
    if missing:
        raise InvalidInput(f"{where}: missing columns {missing} — not seqpack packed rows")
    tokens, row_tok = flat_column(table, "tokens")
    labels, label_off = flat_column(table, "labels")
    lengths, occ = flat_column(table, "seq_lengths")
    flat = {name: flat_column(table, name) for name in (*_PER_OCCURRENCE, "range_ends")}
    if not all(np.array_equal(off, occ) for _, off in flat.values()):
        raise ValueError("per-occurrence columns")
    if not np.array_equal(label_off, row_tok):
        raise ValueError("labels")
    supervised = labels != IGNORE_INDEX
    if np.any(supervised & (labels != tokens)):
        raise InvalidInput(f"{where}: a label differs from its token — the file is damaged")
    lengths = lengths.astype(np.int64)
    tok = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths + 1, out=tok[1:])
    keep = np.ones(tokens.shape[0], dtype=bool)
    keep[tok[:-1][tok[:-1] < tokens.shape[0]]] = False
    return {
        "tokens": tokens,
        "row_tok": row_tok,
        "lengths": lengths,
        "occ": occ,
        "starts": flat["seq_starts"][0].astype(np.int64),
        "ordinals": flat["ordinals"][0].astype(np.int64),
        "loss_mask": supervised[keep],
        "source_ids": flat["source_ids"][0].astype(object),
        "example_ids": flat["example_ids"][0].astype(object),
        "range_starts": flat["range_starts"][0].astype(np.int64),
        "range_ends": flat["range_ends"][0].astype(np.int64),
    }


def arrow_to_rows(
    table: pa.Table,
    *,
    capacity: int,
    partition: Split,
    binding: Binding,
    where: str,
    contiguous: bool = True,
) -> CompactRows:
    """Read packed-row rows (version 1 or 2) back, checking they describe whole, in-row
    occurrences.

    ``contiguous`` also requires consecutive ``row`` values (needed to rebuild
    model calls; not to recover the examples).
    """
    try:
        a = (_v1 if is_version_1(table.column_names) else _v2)(table, where)
    except (ValueError, pa.ArrowException):
        raise InvalidInput(
            f"{where}: rows are inconsistent — the file is damaged; pack again"
        ) from None
    lengths, starts, occ = a["lengths"], a["starts"], a["occ"]
    tok = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths + 1, out=tok[1:])
    row_ids = table.column("row").to_numpy()
    first_row = int(row_ids[0]) if row_ids.size else 0
    consistent = (
        np.array_equal(tok[occ], a["row_tok"])
        and a["loss_mask"].shape[0] == int(lengths.sum())
        and (lengths.size == 0 or (lengths.min() >= 1 and starts.min() >= 0))
        and bool(np.all(starts + lengths <= capacity))
        and (
            not contiguous
            or np.array_equal(row_ids, np.arange(first_row, first_row + row_ids.size))
        )
    )
    if not consistent:
        raise InvalidInput(f"{where}: rows are inconsistent — the file is damaged; pack again")
    return CompactRows(
        tokens=a["tokens"].astype(np.int32, copy=False),
        loss_mask=a["loss_mask"],
        lengths=lengths,
        starts=starts,
        row_offsets=occ,
        ordinals=a["ordinals"],
        source_ids=a["source_ids"],
        example_ids=a["example_ids"],
        range_starts=a["range_starts"],
        range_ends=a["range_ends"],
        capacity=capacity,
        partition=partition,
        binding=binding,
        first_row=first_row,
    )


def read_pair_stats(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of one shard, reading only the columns they need: pairs per occurrence int64 [K],
    occurrence offsets per row int64 [R+1] and eligible (supervised) targets per row
    int64 [R]."""
    names = set(pq.read_schema(path).names)
    if is_version_1(names):
        table = pq.read_table(path, columns=["seq_lengths", "labels"])
        seq, occ = flat_column(table, "seq_lengths")
        labels, offsets = flat_column(table, "labels")
        counts = np.concatenate([[0], np.cumsum(labels != IGNORE_INDEX, dtype=np.int64)])
        return seq.astype(np.int64), occ, counts[offsets[1:]] - counts[offsets[:-1]]
    table = pq.read_table(path, columns=sorted({"pair_counts", "loss_bits"} & names))
    seq, occ = flat_column(table, "pair_counts")
    seq = seq.astype(np.int64)
    pairs = np.zeros(seq.shape[0] + 1, dtype=np.int64)
    np.cumsum(seq, out=pairs[1:])
    row_pairs = np.diff(pairs[occ])
    if "loss_bits" not in names:
        return seq, occ, row_pairs
    mask = unpack_bits(table.column("loss_bits"), row_pairs, str(path))
    counts = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])
    return seq, occ, counts[pairs[occ[1:]]] - counts[pairs[occ[:-1]]]
