"""The packed-directory format: Parquet shards of compact rows plus ``manifest.json``.

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

Shards hold whole model calls (a multiple of ``max_rows_per_batch`` rows).
``manifest.json`` records the format version, binding, partition, config,
policy, statistics and every shard's row span, size and sha256. A directory
is complete exactly when its manifest exists: :func:`write_packed` builds it
under a hidden temporary sibling, fsyncs, then renames it into place
(:mod:`seqpack.atomic`). :func:`load_packed` checks the manifest's shape, every
shard's size and sha256, and the caller's expected binding and partition.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .atomic import HIDDEN, MANIFEST, check_output, fsync_dir, publish, temp_output
from .batch import PackedBatch
from .compact import IGNORE_INDEX, CompactRows
from .errors import InvalidInput, PartitionMismatch
from .examples import INT32_MAX, Binding, Partition

FORMAT = "seqpack.packed-rows"
VERSION = 1
#: Target tokens per shard; shards always end on a model-call boundary.
SHARD_TOKENS = 1 << 25

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


def _flat(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
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
    tokens, row_tok = _flat(table, "tokens")
    labels, label_off = _flat(table, "labels")
    lengths, occ = _flat(table, "seq_lengths")
    flat = {name: _flat(table, name) for name in (*_PER_OCCURRENCE, "range_ends")}
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


def _sha256(path: Path) -> str:
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


def write_packed(
    rows: CompactRows,
    out: str | Path,
    *,
    max_rows_per_batch: int,
    extra: dict[str, Any] | None = None,
    overwrite: bool = False,
    shard_tokens: int = SHARD_TOKENS,
    on_shard: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Write ``rows`` as a packed directory at ``out`` atomically; return the manifest.

    Shards and the manifest go to a hidden sibling ``.NAME.seqpack-tmp-*``,
    each fsynced, and the folder is renamed to ``out`` only when complete.
    On any failure the temporary folder is removed and a previous ``out`` is
    left untouched. ``on_shard(rows_written)`` reports progress.
    """
    out = check_output(out, overwrite)
    tmp = temp_output(out)
    try:
        bounds = shard_bounds(rows, max_rows_per_batch, shard_tokens)
        shards = []
        for k, (a, b) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)):
            table = rows_to_arrow(rows.slice_rows(a, b))
            shards.append(write_shard_file(table, tmp, f"shard-{k:05d}.parquet"))
            if on_shard is not None:
                on_shard(b - a)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "binding": rows.binding.to_dict(),
        "partition": rows.partition.value,
        "config": {"capacity": rows.capacity, "max_rows_per_batch": max_rows_per_batch},
        "rows": rows.num_rows,
        "occurrences": len(rows),
        **(extra or {}),
        "shards": shards,
    }
    publish_packed(tmp, out, manifest)
    return manifest


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
        "occurrences": int(_flat(table, "seq_lengths")[1][-1]),
        "tokens": int(_flat(table, "tokens")[1][-1]),
        "bytes": path.stat().st_size,
        "sha256": _sha256(path),
    }


def publish_packed(tmp: Path, out: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest`` into ``tmp`` last, fsync, and rename ``tmp`` to ``out``.

    Files in ``tmp`` that the manifest does not list (e.g. parts left by a
    crashed writer) are removed first. On failure ``tmp`` is removed and a
    previous ``out`` is left untouched.
    """
    try:
        listed = {shard["file"] for shard in manifest["shards"]}
        for path in tmp.iterdir():
            if path.name not in listed:
                path.unlink()
        with (tmp / MANIFEST).open("w") as f:
            json.dump(manifest, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(tmp)
        publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class PackedStore:
    """A packed directory, read back as the model calls that were packed.

    ``len(store)`` model calls; ``store[i]`` / iteration give
    :class:`PackedBatch` objects identical to :func:`seqpack.materialize`'s
    (same cells, segments, positions, flags, occurrences and provenance).
    ``store.shard_rows(k)`` gives shard ``k`` as :class:`CompactRows`.
    """

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path = path
        self.manifest = manifest
        self.binding = Binding.from_dict(manifest["binding"])
        self.partition = Partition.parse(manifest["partition"])
        self.capacity = int(manifest["config"]["capacity"])
        self.max_rows_per_batch = int(manifest["config"]["max_rows_per_batch"])
        self.num_rows = int(manifest["rows"])
        self.shards = manifest["shards"]
        self._first_rows = np.array([s["first_row"] for s in self.shards], dtype=np.int64)
        self._cached: tuple[int, CompactRows] | None = None

    def require(
        self,
        expected_binding: Binding | None = None,
        expected_partition: Partition | str | None = None,
    ) -> None:
        """Raise BindingMismatch / PartitionMismatch unless this output is the expected one."""
        if expected_binding is not None:
            expected_binding.require(self.binding, f"packed data {self.path}")
        if expected_partition is not None:
            want = Partition.parse(expected_partition)
            if self.partition is not want:
                raise PartitionMismatch(
                    f"packed data {self.path} holds partition {self.partition.value!r}, not"
                    f" {want.value!r} — load the {want.value} output instead"
                )

    def __len__(self) -> int:
        return -(-self.num_rows // self.max_rows_per_batch)

    def shard_rows(self, k: int) -> CompactRows:
        if self._cached is None or self._cached[0] != k:
            file = self.path / self.shards[k]["file"]
            try:
                table = pq.read_table(file, memory_map=True)
            except (pa.ArrowException, OSError, UnicodeDecodeError) as err:
                raise InvalidInput(
                    f"{file}: cannot read the shard ({err}) — the packed directory is damaged;"
                    " pack again"
                ) from None
            rows = arrow_to_rows(
                table,
                capacity=self.capacity,
                partition=self.partition,
                binding=self.binding,
                where=str(file),
            )
            self._cached = (k, rows)
        return self._cached[1]

    def __getitem__(self, i: int) -> PackedBatch:
        if not -len(self) <= i < len(self):
            raise IndexError(f"model call {i} outside 0..{len(self) - 1}")
        first = (i % len(self)) * self.max_rows_per_batch
        k = int(np.searchsorted(self._first_rows, first, "right") - 1)
        rows = self.shard_rows(k)
        local = first - rows.first_row
        stop = min(local + self.max_rows_per_batch, rows.num_rows)
        return rows.slice_rows(local, stop).to_batch()

    def __iter__(self) -> Iterator[PackedBatch]:
        for i in range(len(self)):
            yield self[i]


def _open_manifest(path: Path) -> PackedStore:
    """Read ``manifest.json`` and check its shape (types, shard names, counts)."""
    mpath = path / MANIFEST
    try:
        manifest = json.loads(mpath.read_bytes())
    except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError
        raise InvalidInput(f"{mpath}: not valid JSON ({err}) — pack again") from None
    if not isinstance(manifest, dict):
        raise InvalidInput(
            f"{mpath}: holds a {type(manifest).__name__}, not a manifest object — pack again"
        )
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise InvalidInput(
            f"{mpath}: format {manifest.get('format')!r} version {manifest.get('version')!r};"
            f" this seqpack reads {FORMAT!r} version {VERSION} — pack it again with this version"
        )
    try:
        store = PackedStore(path, manifest)
        for shard in store.shards:
            name = shard["file"]
            if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
                raise ValueError(f"shard file {name!r} is not a plain file name")
            if not all(isinstance(shard[k], int) for k in ("first_row", "rows", "bytes")):
                raise ValueError(f"shard {name} has non-integer counts")
            if not isinstance(shard["sha256"], str):
                raise ValueError(f"shard {name} has no sha256")
        if store.capacity < 1 or store.max_rows_per_batch < 1 or store.num_rows < 0:
            raise ValueError("config values must be positive")
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise InvalidInput(f"{mpath}: malformed manifest ({err!s}) — pack again") from None
    return store


def load_packed(
    path: str | Path,
    expected_binding: Binding | None = None,
    *,
    verify: bool = True,
    expected_partition: Partition | str | None = None,
) -> PackedStore:
    """Open a packed directory, checking its manifest, shards, checksums and binding.

    Raises :class:`~seqpack.errors.InvalidInput` for a missing, malformed or
    damaged output (a shard changed, truncated or missing: its size and
    sha256 differ from the manifest's), :class:`~seqpack.errors.BindingMismatch`
    when ``expected_binding`` differs from the manifest's and
    :class:`~seqpack.errors.PartitionMismatch` when ``expected_partition`` does.
    Hidden ``.NAME.seqpack-tmp-*`` / ``-old-*`` folders of interrupted runs are
    refused even when they hold a manifest.
    """
    path = Path(path)
    if not (path / MANIFEST).is_file():
        raise InvalidInput(
            f"{path} has no {MANIFEST}: not a finished seqpack output (an interrupted run"
            " leaves none) — run seqpack pack again"
        )
    if HIDDEN.match(path.name):
        raise InvalidInput(
            f"{path} is the temporary folder of a seqpack run that did not finish (or an old"
            " output being replaced), not an output — load the folder it was written for;"
            " the next seqpack pack there removes it"
        )
    store = _open_manifest(path)
    mpath = path / MANIFEST
    expected_first = 0
    for shard in store.shards:
        file = path / shard["file"]
        if shard["first_row"] != expected_first or shard["first_row"] % store.max_rows_per_batch:
            raise InvalidInput(
                f"{mpath}: shard {shard['file']} starts at an unexpected row — the manifest was"
                " changed; pack again"
            )
        expected_first += shard["rows"]
        if not file.is_file():
            raise InvalidInput(f"{file} is missing — the packed directory is incomplete")
        if verify and (file.stat().st_size != shard["bytes"] or _sha256(file) != shard["sha256"]):
            raise InvalidInput(
                f"{file}: checksum mismatch (size or sha256 differs from the manifest) — the"
                " file was changed, truncated or damaged; pack again"
            )
    if expected_first != store.num_rows:
        raise InvalidInput(
            f"{mpath}: shards hold {expected_first} rows, not {store.num_rows} — the manifest"
            " was changed; pack again"
        )
    store.require(expected_binding, expected_partition)
    return store
