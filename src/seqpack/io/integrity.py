"""Loading as verification: a packed directory's manifest and shards must agree.

Every number a loader relies on is checked against the others before it is
used, so an edited manifest or shard either fails with an
:class:`~seqpack.core.errors.InvalidInput` naming what disagrees, or changes
nothing that is loaded. Three depths, :func:`seqpack.io.store.load_packed`'s
``verify=``:

``False``
    :func:`check_manifest` only (types, bounds, contiguous rows, counts,
    statistics, no shard twice): microseconds. Files the manifest does not list
    are never read (a killed run's shards, the user's own files).
``True`` (default, the checksum fast path)
    plus :func:`check_checksums`: size and sha256 of every shard (reads
    every byte once, no decoding).
``"full"``
    plus :func:`check_contents`: every shard decoded now and held against
    its manifest entry (:func:`check_shard`), ordinals a permutation of
    ``0..occurrences-1`` across shards, eligible targets as recorded.

At every depth a shard is checked when it is read: its schema is the
format's (:func:`check_schema`: declared columns and Arrow types, the
columns its entry lists) and its content agrees with its entry
(:func:`check_shard`: rows, first row, occurrences, tokens and eligible
targets; rows non-empty, occurrences inside their row without overlap;
tokens in ``[0, vocab_size)``; ordinals in range and distinct; provenance
ranges ``range_end - range_start == len + 1``), so no depth ever yields a
batch that disagrees with the manifest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from seqpack.core.binding import INT32_MAX, Binding, Partition
from seqpack.core.compact import CompactRows
from seqpack.core.errors import InvalidInput
from seqpack.io.atomic import MANIFEST
from seqpack.io.shard_rows import V1_SCHEMA, arrow_to_rows, is_version_1, read_pair_stats
from seqpack.io.shards import FORMAT, READABLE_VERSIONS, REQUIRED, SCHEMA, VERSION, sha256_file
from seqpack.io.trl_schema import check_trl_contents, is_trl

#: Counts in a manifest above this are not counts (JSON integers stay exact below 2**53).
MAX_COUNT = 2**53
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_ENTRY_COUNTS = ("first_row", "rows", "occurrences", "tokens", "bytes")
DEPTHS = (False, True, "full")  # of load_packed(verify=...)


def _bad(where: Path | str, what: str) -> InvalidInput:
    return InvalidInput(
        f"{where}: {what} — the packed directory was changed or damaged; pack again"
    )


def _count(value: Any, name: str, where: Path, low: int = 0, high: int = MAX_COUNT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(where, f"{name} is {value!r}, not an integer in [{low:,}, {high:,}]")
    return value


def _field(node: Any, key: str, where: Path, context: str = "") -> Any:
    if not isinstance(node, Mapping) or key not in node:
        raise _bad(where, f"{context}{key!r} is missing")
    return node[key]


def check_manifest(manifest: Any, folder: Path) -> dict[str, int]:
    """Check ``manifest`` (parsed ``manifest.json`` of ``folder``) on its own; no shard read.

    Returns the checked numbers: capacity, max_rows_per_batch, vocab_size,
    rows, occurrences, tokens (prediction pairs), shards.
    """
    where = folder / MANIFEST
    if not isinstance(manifest, Mapping):
        raise _bad(where, f"holds a {type(manifest).__name__}, not a manifest object")
    trl = is_trl(manifest)
    if not trl and (
        manifest.get("format") != FORMAT or manifest.get("version") not in READABLE_VERSIONS
    ):
        raise InvalidInput(
            f"{where}: format {manifest.get('format')!r} version {manifest.get('version')!r};"
            f" this seqpack reads {FORMAT!r} version {' or '.join(map(str, READABLE_VERSIONS))}"
            f" (it writes {VERSION}) — pack it again with this version"
        )
    config = _field(manifest, "config", where)
    capacity = _count(
        _field(config, "capacity", where, "config."), "config.capacity", where, 1, INT32_MAX
    )
    per_call = _field(config, "max_rows_per_batch", where, "config.")
    per_call = _count(per_call, "config.max_rows_per_batch", where, 1, INT32_MAX)
    binding = _field(manifest, "binding", where)
    vocab = _count(
        _field(binding, "vocab_size", where, "binding."), "binding.vocab_size", where, 1, INT32_MAX
    )
    for key in ("tokenizer_id", "split_id"):
        if not isinstance(_field(binding, key, where, "binding."), str) or not binding[key]:
            raise _bad(where, f"binding.{key} is {binding[key]!r}, not a non-empty string")
    part = _field(manifest, "partition", where)
    if part not in {p.value for p in Partition}:
        raise _bad(where, f"partition is {part!r}, not train, validation or test")
    rows = _count(_field(manifest, "rows", where), "rows", where)
    occurrences = _count(_field(manifest, "occurrences", where), "occurrences", where)
    totals = _check_entries(_field(manifest, "shards", where), where, capacity, per_call)
    if totals["rows"] != rows:
        raise _bad(where, f"shards hold {totals['rows']:,} rows, not {rows:,}")
    if totals["occurrences"] != occurrences:
        raise _bad(where, f"shards hold {totals['occurrences']:,} occurrences, not {occurrences:,}")
    summary = {
        "capacity": capacity,
        "max_rows_per_batch": per_call,
        "vocab_size": vocab,
        "rows": rows,
        "occurrences": occurrences,
        "tokens": totals["tokens"] - (0 if trl else occurrences),  # TRL's unit: tokens
        "shards": len(manifest["shards"]),
        "eligible": totals["eligible"],
    }
    if "statistics" in manifest:
        _check_statistics(manifest, summary, where)
    return summary


def _check_entries(shards: Any, where: Path, capacity: int, per_call: int) -> dict[str, int]:
    """Shard entries: plain unique names, contiguous whole model calls, plausible counts."""
    if not isinstance(shards, list):
        raise _bad(where, f"shards is a {type(shards).__name__}, not a list")
    names: set[str] = set()
    totals = {"rows": 0, "occurrences": 0, "tokens": 0, "eligible": 0}
    for k, entry in enumerate(shards):
        name = _field(entry, "file", where, f"shards[{k}].")
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise _bad(where, f"shard file {name!r} is not a plain file name")
        if name in names:
            raise _bad(where, f"shard {name} is listed twice")
        names.add(name)
        first, rows, occ, tokens, _ = (
            _count(_field(entry, key, where, f"shard {name}: "), f"shard {name} {key}", where)
            for key in _ENTRY_COUNTS
        )
        # supervised targets, recorded since 0.3 (-1: not for every shard, no total)
        eligible = entry.get("eligible")
        if eligible is not None:
            _count(eligible, f"shard {name} eligible", where)
        stale = eligible is None or totals["eligible"] < 0
        totals["eligible"] = -1 if stale else totals["eligible"] + eligible
        if not isinstance(entry.get("sha256"), str) or not _SHA256.match(entry["sha256"]):
            raise _bad(where, f"shard {name} has no sha256 of 64 hex digits")
        if first != totals["rows"]:
            raise _bad(where, f"shard {name} starts at row {first:,}, not {totals['rows']:,}")
        last = k == len(shards) - 1
        if rows < 1 or (not last and rows % per_call):
            raise _bad(
                where, f"shard {name} holds {rows:,} rows, not whole model calls of {per_call:,}"
            )
        # Every row holds 1..capacity occurrences; a window is len + 1 >= 2 tokens.
        if not rows <= occ <= rows * capacity or not 2 * occ <= tokens <= rows * capacity + occ:
            raise _bad(
                where,
                f"shard {name} claims {rows:,} rows, {occ:,} occurrences and"
                f" {tokens:,} tokens, which rows of {capacity:,} cannot hold",
            )
        for key, value in (("rows", rows), ("occurrences", occ), ("tokens", tokens)):
            totals[key] += value
    return totals


def _check_statistics(manifest: Mapping, summary: dict[str, int], where: Path) -> None:
    """The statistics a pack recorded agree with the manifest's own numbers."""
    stats = manifest["statistics"]
    rows, capacity, tokens = summary["rows"], summary["capacity"], summary["tokens"]
    expected: dict[str, Any] = {
        "capacity": capacity,
        "rows": rows,
        "examples": summary["occurrences"],
        "tokens": tokens,
        "lower_bound": -(-tokens // capacity),
        "batches": -(-rows // summary["max_rows_per_batch"]),
    }
    policy = manifest.get("policy")
    if isinstance(policy, Mapping) and "name" in policy:
        expected["policy"] = policy["name"]
    if not isinstance(stats, Mapping):
        raise _bad(where, f"statistics is a {type(stats).__name__}, not an object")
    for key, want in expected.items():
        if key in stats and (stats[key] != want or isinstance(stats[key], bool)):
            raise _bad(
                where,
                f"statistics.{key} is {stats[key]!r} but the manifest's config and"
                f" shards give {want!r}",
            )
    if "efficiency" in stats:
        eff = tokens / (rows * capacity) if rows else 0.0
        got = stats["efficiency"]
        if not isinstance(got, (int, float)) or not abs(got - eff) <= 1e-9 * max(1.0, eff):
            raise _bad(
                where,
                f"statistics.efficiency is {got!r} but the manifest's config and"
                f" shards give {eff!r}",
            )
    eligible = stats.get("eligible_targets")
    if eligible is not None:
        _count(eligible, "statistics.eligible_targets", where, 0, tokens)
        if summary["eligible"] >= 0 and eligible != summary["eligible"]:
            raise _bad(
                where,
                f"statistics.eligible_targets is {eligible!r} but the shards' entries give"
                f" {summary['eligible']:,}",
            )


def check_checksums(manifest: Mapping, folder: Path) -> None:
    """Every listed shard exists, with the manifest's size and sha256."""
    for entry in manifest["shards"]:
        file = folder / entry["file"]
        if not file.is_file():
            raise InvalidInput(f"{file} is missing — the packed directory is incomplete")
        if file.stat().st_size != entry["bytes"] or sha256_file(file) != entry["sha256"]:
            raise InvalidInput(
                f"{file}: checksum mismatch (size or sha256 differs from the manifest) — the"
                " file was changed, truncated or damaged; pack again"
            )


def _kind(kind: pa.DataType) -> str:
    """An Arrow type without its list fields' names: ``list<int32>``."""
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return f"{'large_' * pa.types.is_large_list(kind)}list<{_kind(kind.value_type)}>"
    return str(kind)


def check_schema(schema: pa.Schema, where: str, entry: Mapping | None = None) -> None:
    """A shard's schema is the format's: only its columns, each of its declared Arrow
    type (no float or int64 token ids), the required ones present, and the columns its
    manifest ``entry`` lists."""
    v1 = is_version_1(schema.names)
    declared = V1_SCHEMA if v1 else SCHEMA
    for f in schema:
        if f.name not in declared.names:
            raise _bad(where, f"column {f.name!r} is not a column of the packed-row format")
        want = declared.field(f.name).type
        if _kind(f.type) != _kind(want):
            raise _bad(
                where, f"column {f.name!r} has type {_kind(f.type)}, not the format's {_kind(want)}"
            )
    missing = [n for n in (V1_SCHEMA.names if v1 else REQUIRED) if n not in schema.names]
    if missing:
        raise _bad(where, f"the required columns {missing} are missing")
    if entry is not None and "columns" in entry and entry["columns"] != schema.names:
        raise _bad(
            where, f"holds the columns {schema.names} but the manifest says {entry['columns']}"
        )


def check_table(table: pa.Table, where: str, entry: Mapping | None = None) -> None:
    """:func:`check_schema`, and no null at any list depth (the row decoder would turn one
    into NaN and then into an arbitrary integer)."""
    check_schema(table.schema, where, entry)
    for name in table.column_names:
        column = table.column(name)
        chunks = column.chunks
        while chunks:
            if any(chunk.null_count for chunk in chunks):
                raise _bad(where, f"a value of column {name!r} is missing (null)")
            chunks = [c.flatten() for c in chunks if pa.types.is_list(c.type)]


def check_shard(rows: CompactRows, entry: Mapping, occurrences: int, where: str) -> None:
    """Shard content against its manifest ``entry`` and the binding, capacity and the
    manifest's ``occurrences`` (ordinals lie in ``[0, occurrences)``)."""
    got = {
        "rows": rows.num_rows,
        "first_row": rows.first_row,
        "occurrences": len(rows),
        "tokens": int(rows.tokens.shape[0]),
    }
    if "eligible" in entry:
        got["eligible"] = int(np.count_nonzero(rows.loss_mask))
    for key, value in got.items():
        if value != entry[key]:
            raise _bad(where, f"holds {key} {value:,} but the manifest says {entry[key]:,}")
    if np.any(np.diff(rows.row_offsets) < 1):
        raise _bad(where, "a row holds no occurrence")
    tokens = rows.tokens
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= rows.binding.vocab_size):
        bad = int(tokens[(tokens < 0) | (tokens >= rows.binding.vocab_size)][0])
        raise _bad(
            where, f"token id {bad} is outside [0, {rows.binding.vocab_size}) (binding.vocab_size)"
        )
    _check_placements(rows, where)
    ordinals = rows.ordinals
    if ordinals.size and (int(ordinals.min()) < 0 or int(ordinals.max()) >= occurrences):
        raise _bad(where, f"an ordinal lies outside 0..{occurrences - 1:,}")
    if np.unique(ordinals).shape[0] != ordinals.shape[0]:
        raise _bad(where, "two occurrences share an ordinal (segment id)")
    if np.any(rows.range_starts < 0) or not np.array_equal(
        rows.range_ends - rows.range_starts, rows.lengths + 1
    ):
        raise _bad(where, "a provenance range [range_start, range_end) is not its window's")
    for name in ("source_ids", "example_ids"):
        values = getattr(rows, name)
        if not all(type(v) is str for v in values):
            raise _bad(where, f"{name[:-1]} is missing for an occurrence")


def _check_placements(rows: CompactRows, where: str) -> None:
    """Occurrences lie inside their row, in column order, without overlap."""
    starts, lengths = rows.starts, rows.lengths
    if lengths.size and (int(lengths.min()) < 1 or int(starts.min()) < 0):
        raise _bad(where, "an occurrence has no prediction pair or a negative column")
    if np.any(starts + lengths > rows.capacity):
        raise _bad(where, f"an occurrence ends beyond column {rows.capacity} (config.capacity)")
    same_row = np.ones(max(lengths.shape[0] - 1, 0), dtype=bool)
    same_row[rows.row_offsets[1:-1] - 1] = False
    if np.any(same_row & (starts[1:] < starts[:-1] + lengths[:-1])):
        raise _bad(where, "two occurrences of a row overlap")


def read_row_stats(file: Path, entry: Mapping) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`~seqpack.io.shard_rows.read_pair_stats`, its schema and counts checked."""
    try:
        check_schema(pq.read_schema(file), str(file), entry)
        seq, occ, per_row = read_pair_stats(file)
    except (pa.ArrowException, OSError) as err:
        raise _bad(file, f"cannot read the shard ({err})") from None
    got = {"rows": occ.shape[0] - 1, "occurrences": seq.shape[0], "eligible": int(per_row.sum())}
    for key, value in got.items():
        if key in entry and value != entry[key]:
            raise _bad(file, f"holds {key} {value:,} but the manifest says {entry[key]:,}")
    return seq, occ, per_row


def check_contents(manifest: Mapping, read: Callable[[int], CompactRows], where: Path) -> None:
    """Decode every shard now (``read(k)`` runs :func:`check_shard`); then the whole-output
    facts: every ordinal exactly once, and the eligible targets recorded."""
    ordinals, eligible = [], 0
    for k in range(len(manifest["shards"])):
        rows = read(k)
        ordinals.append(rows.ordinals)
        eligible += int(np.count_nonzero(rows.loss_mask))
    seen = np.sort(np.concatenate([np.zeros(0, np.int64), *ordinals]))
    if not np.array_equal(seen, np.arange(seen.shape[0])):
        raise _bad(where / MANIFEST, "the shards' ordinals are not 0..occurrences-1 each once")
    stats = manifest.get("statistics")
    if isinstance(stats, Mapping) and stats.get("eligible_targets", eligible) != eligible:
        raise _bad(
            where / MANIFEST,
            f"statistics.eligible_targets is"
            f" {stats['eligible_targets']!r} but the shards hold {eligible:,}",
        )


def read_shard(file: Path, entry: Mapping, manifest: Mapping, occurrences: int) -> CompactRows:
    """Decode one shard file into checked :class:`CompactRows` (see :func:`check_shard`)."""
    try:
        table = pq.read_table(file, memory_map=True)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as err:
        raise InvalidInput(
            f"{file}: cannot read the shard ({err}) — the packed directory is damaged; pack again"
        ) from None
    check_table(table, str(file), entry)
    rows = arrow_to_rows(
        table,
        capacity=int(manifest["config"]["capacity"]),
        partition=Partition.parse(manifest["partition"]),
        binding=Binding.from_dict(manifest["binding"]),
        where=str(file),
    )
    check_shard(rows, entry, occurrences, str(file))
    return rows


def verify_folder(folder: Path) -> dict[str, Any]:
    """Fully verify the packed directory ``folder`` whatever its name; return its manifest.

    Every check of every depth, for seqpack's format and TRL's.
    """
    try:
        manifest = json.loads((folder / MANIFEST).read_bytes())
    except (OSError, ValueError, RecursionError) as err:
        raise _bad(folder / MANIFEST, f"not a readable JSON manifest ({err})") from None
    occurrences, shards = check_manifest(manifest, folder)["occurrences"], manifest["shards"]
    check_checksums(manifest, folder)
    if is_trl(manifest):
        check_trl_contents(manifest, folder)
        return manifest

    def read(k: int) -> CompactRows:
        return read_shard(folder / shards[k]["file"], shards[k], manifest, occurrences)

    check_contents(manifest, read, folder)
    return manifest
