"""Loading as verification: a packed directory's manifest and shards must agree.

``manifest.json`` is decoded once into :class:`Manifest` (msgspec structs with
bounds); an edited manifest or shard fails with an
:class:`~exactpack.core.errors.InvalidInput` naming what disagrees.
``load_packed(integrity=...)``: ``False`` runs :func:`check_manifest`, ``True``
also :func:`check_checksums`, ``"full"`` also :func:`check_contents`. Every
shard read is checked by :func:`check_table` and :func:`check_shard`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from exactpack.core.binding import INT32_MAX
from exactpack.core.compact import CompactRows
from exactpack.core.errors import InvalidInput
from exactpack.core.examples import offsets_of
from exactpack.io.atomic import MANIFEST
from exactpack.io.shards import (
    FORMAT,
    LAYOUTS,
    TREE_CELL_COLUMNS,
    TREE_SEQUENCE_COLUMNS,
    VERSION,
    arrow_to_rows,
    flat_column,
    sha256_file,
    unpack_bits,
)
from exactpack.io.trl_schema import is_trl

#: Counts in a manifest above this are not counts (JSON integers stay exact below 2**53).
MAX_COUNT = 2**53
DEPTHS = (False, True, "full")  # of load_packed(integrity=...)
#: The largest manifest read (a real one lists a few thousand shards).
MAX_MANIFEST_BYTES = 64 << 20

Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
Size = Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)]
Text = Annotated[str, msgspec.Meta(min_length=1)]


class ConfigRecord(msgspec.Struct):
    capacity: Size
    max_rows_per_batch: Size


class BindingRecord(msgspec.Struct):
    vocab_size: Size
    tokenizer_id: Text
    split_id: Text


class ShardEntry(msgspec.Struct, kw_only=True):
    """A shard's entry: its file, row span, size, sha256, occurrences (forest rows:
    sequences), tokens (forest rows: stored cells) and eligible targets."""

    file: Annotated[str, msgspec.Meta(max_length=255)]  # a name the file system can hold
    first_row: Count
    rows: Count
    bytes: Count
    sha256: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
    columns: list[str] | None = None
    carried: dict[str, str] | None = None  # a forest's carried columns: value type
    occurrences: Count
    tokens: Count
    eligible: Count | None = None


class Manifest(msgspec.Struct):
    """What a loader relies on in ``manifest.json`` (other sections are informational);
    ``layout`` says which columns the shards hold (:data:`~exactpack.io.shards.LAYOUTS`)."""

    config: ConfigRecord
    binding: BindingRecord
    partition: Literal["train", "validation", "test"]
    rows: Count
    shards: list[ShardEntry]
    occurrences: Count
    statistics: dict[str, Any] | None = None
    layout: Literal["flat", "tree"] = "flat"


def bad_output(where: Path | str, what: str) -> InvalidInput:
    """The error of a damaged output: ``where``, ``what`` disagrees, pack again."""
    return InvalidInput(
        f"{where}: {what} — the packed directory was changed or damaged; pack again"
    )


def read_manifest(folder: Path) -> Any:
    """The parsed ``manifest.json`` of ``folder`` (any JSON value; see :func:`decode`)."""
    where = folder / MANIFEST
    try:
        with where.open("rb") as f:
            data = f.read(MAX_MANIFEST_BYTES + 1)
        if len(data) > MAX_MANIFEST_BYTES:
            raise ValueError(f"over {MAX_MANIFEST_BYTES >> 20} MiB")
        # the json module, not msgspec's parser: Infinity and NaN parse, then the
        # schema names the field that holds them
        return json.loads(data)
    except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError
        raise InvalidInput(f"{where}: not valid JSON ({err}) — pack again") from None


def _schema_error(text: str, raw: Any, where: Path) -> InvalidInput:
    """msgspec's ``Expected `int`, got `str` - at `$.shards[0].rows``` in exactpack's words."""
    what, _, at = text.partition(" - at `$")
    path: list[Any] = [int(i) if i else k for k, i in re.findall(r"\.(\w+)|\[(\d+)\]", at)]
    node, parts = raw, []
    for key in path:
        entry = node[key]
        if isinstance(key, int):  # a shard entry, named by its file
            file = entry.get("file") if isinstance(entry, Mapping) else None
            named = isinstance(file, str) and len(file) <= 255
            parts = [f"shard {file}" if named else f"shards[{key}]"]
        else:
            parts.append(key)
        node = entry
    sep = " " if any(isinstance(k, int) for k in path) else "."
    label = sep.join(parts)
    if missing := re.match(r"Object missing required field `(\w+)`", what):
        context = label + (": " if sep == " " else ".") if label else ""
        return bad_output(where, f"{context}{missing[1]!r} is missing")
    if "`int`" in what:
        sizes = (*ConfigRecord.__struct_fields__, "vocab_size")
        low, high = (1, INT32_MAX) if path[-1] in sizes else (0, MAX_COUNT)
        return bad_output(where, f"{label} is {node!r}, not an integer in [{low:,}, {high:,}]")
    if path == ["partition"]:
        return bad_output(where, f"partition is {node!r}, not train, validation or test")
    shown = repr(node) if len(repr(node)) <= 40 else repr(node)[:37] + "..."
    expected = re.sub(r"^Expected |, got .*$", "", what)
    return bad_output(where, f"{label or 'the manifest'} is {shown}, not {expected}")


def check_manifest(manifest: Any, folder: Path) -> Manifest:
    """Check the parsed ``manifest.json`` of ``folder`` on its own; return it decoded (a
    misfit field is named with its value and bounds)."""
    where = folder / MANIFEST
    if not isinstance(manifest, Mapping):
        raise bad_output(where, f"holds a {type(manifest).__name__}, not a manifest object")
    trl = is_trl(manifest)
    if not trl and (manifest.get("format") != FORMAT or manifest.get("version") != VERSION):
        raise InvalidInput(
            f"{where}: format {manifest.get('format')!r} version {manifest.get('version')!r};"
            f" this exactpack reads {FORMAT!r} version {VERSION} — pack it again with this"
            " version"
        )
    try:
        m = msgspec.convert(manifest, Manifest)
    except msgspec.ValidationError as err:
        raise _schema_error(str(err), manifest, where) from None
    totals = _check_entries(m, where)
    for key in ("rows", "occurrences"):
        if totals[key] != getattr(m, key):
            raise bad_output(where, f"shards hold {totals[key]:,} {key}, not {getattr(m, key):,}")
    if m.statistics is not None:
        pairs = totals["tokens"] - (0 if trl or m.layout == "tree" else m.occurrences)
        _check_statistics(manifest, m, pairs, totals["eligible"], where)
    return m


def _check_entries(m: Manifest, where: Path) -> dict[str, int]:
    """Shard entries: plain unique names, contiguous whole model calls, plausible counts;
    their totals (eligible -1: not recorded for every shard)."""
    capacity, per_call = m.config.capacity, m.config.max_rows_per_batch
    names: set[str] = set()
    tree = m.layout == "tree"
    totals = {"rows": 0, "occurrences": 0, "tokens": 0, "eligible": 0}
    for k, e in enumerate(m.shards):
        name = e.file
        if Path(name).name != name or name in ("", ".", ".."):
            raise bad_output(where, f"shard file {name!r} is not a plain file name")
        if name in names:
            raise bad_output(where, f"shard {name} is listed twice")
        names.add(name)
        stale = e.eligible is None or totals["eligible"] < 0
        totals["eligible"] = -1 if stale else totals["eligible"] + e.eligible
        if e.first_row != totals["rows"]:
            raise bad_output(
                where, f"shard {name} starts at row {e.first_row:,}, not {totals['rows']:,}"
            )
        # forest calls never straddle a shard: a shard's last may be short
        if e.rows < 1 or (k < len(m.shards) - 1 and e.rows % per_call and not tree):
            raise bad_output(
                where, f"shard {name} holds {e.rows:,} rows, not whole model calls of {per_call:,}"
            )
        # Every row holds 1..capacity occurrences; a window is len + 1 >= 2 tokens. A forest
        # row holds 1..capacity cells and at least one sequence (sequences may share cells).
        rows, occ, tokens = e.rows, e.occurrences, e.tokens
        if tree:
            fits = rows <= occ and rows <= tokens <= rows * capacity
        else:
            fits = rows <= occ <= rows * capacity and 2 * occ <= tokens <= rows * capacity + occ
        if not fits:
            raise bad_output(
                where,
                f"shard {name} claims {rows:,} rows, {occ:,} occurrences and"
                f" {tokens:,} tokens, which rows of {capacity:,} cannot hold",
            )
        totals["rows"] += rows
        totals["occurrences"] += occ
        totals["tokens"] += tokens
    return totals


def _check_statistics(raw: Mapping, m: Manifest, tokens: int, known: int, where: Path) -> None:
    """The statistics a pack recorded agree with the manifest's own numbers (``tokens``:
    prediction pairs; ``known``: the shards' eligible targets, -1 when not recorded)."""
    stats, rows, capacity = m.statistics or {}, m.rows, m.config.capacity
    expected: dict[str, Any] = {"capacity": capacity, "rows": rows}
    if m.layout == "tree":  # forest rows: ``tokens`` are the stored cells, Σ weights eligible
        expected |= {"sequences": m.occurrences, "tokens_stored": tokens}
        tokens = max(known, 0)
    else:
        expected |= {
            "examples": m.occurrences,
            "tokens": tokens,
            "lower_bound": -(-tokens // capacity),
            "batches": -(-rows // m.config.max_rows_per_batch),
            "efficiency": tokens / (rows * capacity) if rows else 0.0,
        }
    policy = raw.get("policy")
    if isinstance(policy, Mapping) and "name" in policy:
        expected["policy"] = policy["name"]
    for key, want in expected.items():
        got = stats.get(key, want)
        if key == "efficiency":  # a float: equal to rounding
            same = type(got) in (int, float) and abs(got - want) <= 1e-9 * max(1.0, want)
        else:
            same = got == want and not isinstance(got, bool)
        if not same:
            raise bad_output(
                where,
                f"statistics.{key} is {got!r} but the manifest's config and shards give {want!r}",
            )
    eligible = stats.get("eligible_targets")
    if eligible is None:
        return
    if type(eligible) is not int or not 0 <= eligible <= tokens:
        raise bad_output(
            where, f"statistics.eligible_targets is {eligible!r}, not in [0, {tokens:,}]"
        )
    if known >= 0 and eligible != known:
        raise bad_output(
            where,
            f"statistics.eligible_targets is {eligible!r} but the shards' entries give {known:,}",
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


def check_schema(
    schema: pa.Schema, where: str, entry: Mapping | None = None, layout: str = "flat"
) -> None:
    """A shard's schema is the format's for its ``layout`` (the declared types, the
    required columns; a forest's carried columns the types its ``entry`` names) and has the
    columns its manifest ``entry`` lists."""
    declared, required = LAYOUTS[layout]
    carried = (entry or {}).get("carried") or {} if layout == "tree" else {}
    for f in schema:
        if f.name in declared.names:
            want, whose = _kind(declared.field(f.name).type), "the format's"
        elif f.name in carried:
            want, whose = f"list<{carried[f.name]}>", "the manifest's (a carried column)"
        else:
            raise bad_output(
                where, f"column {f.name!r} is not a column of the packed-row format ({layout} rows)"
            )
        if _kind(f.type) != want:
            raise bad_output(
                where, f"column {f.name!r} has type {_kind(f.type)}, not {whose} {want}"
            )
    missing = [n for n in required if n not in schema.names]
    if missing:
        raise bad_output(where, f"the required columns {missing} are missing")
    if entry is not None and "columns" in entry and entry["columns"] != schema.names:
        raise bad_output(
            where, f"holds the columns {schema.names} but the manifest says {entry['columns']}"
        )


def check_table(
    table: pa.Table, where: str, entry: Mapping | None = None, layout: str = "flat"
) -> None:
    """:func:`check_schema`, and no null at any list depth (the row decoder would turn one
    into NaN and then into an arbitrary integer; a carried column's values may be null)."""
    check_schema(table.schema, where, entry, layout)
    carried = (entry or {}).get("carried") or {}
    for name in table.column_names:
        chunks = table.column(name).chunks
        while chunks:
            if any(chunk.null_count for chunk in chunks):
                raise bad_output(where, f"a value of column {name!r} is missing (null)")
            if name in carried:  # its values may be null, not its lists
                break
            chunks = [c.flatten() for c in chunks if pa.types.is_list(c.type)]


def check_shard(
    rows: CompactRows | list[Mapping[str, Any]],
    entry: Mapping,
    occurrences: int | None,
    where: str,
    *,
    capacity: int = 0,
    vocab_size: int = 0,
    fail: Callable[[int], Callable[[str], Exception]] | None = None,
) -> None:
    """Shard content against its manifest ``entry``, the binding and ``occurrences``: flat
    rows (:class:`CompactRows`: :func:`check_rows`) or forest records (node columns, rows
    of ``capacity`` cells and ids below ``vocab_size``: :func:`check_record`, then each
    ``sequence_index`` once in the shard, and each carried column of ``entry`` a value per
    sequence); ``fail(r)`` makes record ``r``'s error (default:
    row ``first_row + r`` of ``where`` is damaged)."""
    if isinstance(rows, CompactRows):
        got = {"rows": rows.num_rows, "first_row": rows.first_row, "occurrences": len(rows),
               "tokens": int(rows.tokens.shape[0]),
               "eligible": int(np.count_nonzero(rows.loss_mask))}  # fmt: skip
        _agree(got, entry, where)
        check_rows(rows, occurrences or 0, where)
        return
    first = int(entry.get("first_row", 0))
    fail = fail or (lambda r: lambda what: bad_output(where, f"row {first + r:,}: {what}"))
    seen: set[int] = set()
    for r, rec in enumerate(rows):
        check_record(rec, capacity, vocab_size, fail(r), occurrences)
        for name in entry.get("carried") or {}:
            if len(rec[name]) != len(rec["sequence_index"]):
                raise fail(r)(
                    f"carried column {name!r} holds {len(rec[name]):,} values for"
                    f" {len(rec['sequence_index']):,} sequences"
                )
        if seen.intersection(rec["sequence_index"]):
            raise fail(r)("it holds the same sequence_index as an earlier row")
        seen.update(rec["sequence_index"])
    got = {
        "rows": len(rows),
        "occurrences": len(seen),
        "tokens": sum(len(r["input_ids"]) for r in rows),
        "eligible": sum(sum(r["weights"]) for r in rows),
    }
    _agree(got, entry, where)


def check_rows(rows: CompactRows, occurrences: int, where: str) -> None:
    """Rows against their binding and one another: every row holds an occurrence, ids
    within the vocabulary, no two occurrences of a row overlap, ordinals within
    ``0..occurrences-1`` and each once, provenance ranges their windows'."""
    if np.any(np.diff(rows.row_offsets) < 1):
        raise bad_output(where, "a row holds no occurrence")
    if outside := _outside(rows.tokens, rows.binding.vocab_size):
        raise bad_output(where, outside)
    starts, lengths = rows.starts, rows.lengths  # each inside its row: arrow_to_rows checked
    same_row = np.ones(max(lengths.shape[0] - 1, 0), dtype=bool)
    same_row[rows.row_offsets[1:-1] - 1] = False
    if np.any(same_row & (starts[1:] < starts[:-1] + lengths[:-1])):
        raise bad_output(where, "two occurrences of a row overlap")
    ordinals = rows.ordinals
    if ordinals.size and (int(ordinals.min()) < 0 or int(ordinals.max()) >= occurrences):
        raise bad_output(where, f"an ordinal lies outside 0..{occurrences - 1:,}")
    if np.unique(ordinals).shape[0] != ordinals.shape[0]:
        raise bad_output(where, "two occurrences share an ordinal (segment id)")
    if np.any(rows.range_starts < 0) or not np.array_equal(
        rows.range_ends - rows.range_starts, rows.lengths + 1
    ):
        raise bad_output(where, "a provenance range [range_start, range_end) is not its window's")


def _outside(tokens: np.ndarray, vocab_size: int) -> str | None:
    """What is wrong with the first token id outside the vocabulary (None: none is)."""
    if not tokens.size or (int(tokens.min()) >= 0 and int(tokens.max()) < vocab_size):
        return None
    bad = int(tokens[(tokens < 0) | (tokens >= vocab_size)][0])
    return f"token id {bad} is outside [0, {vocab_size}) (binding.vocab_size)"


#: What a record's list values may be (Arrow's ``to_pylist``, or a NumPy-formatted dataset).
LISTS = (list, tuple, np.ndarray)


def _ints(values: Any, what: str, fail: Callable[[str], Exception]) -> np.ndarray:
    """``values`` (a list of ints) as int64, or ``fail`` naming ``what``."""
    try:
        out = np.asarray(values if values is not None else [None])
    except (ValueError, OverflowError):
        out = np.asarray([None])
    if out.ndim != 1 or (out.size and not np.issubdtype(out.dtype, np.integer)):
        raise fail(f"{what} is not a list of integers")
    if out.size and (int(out.min()) < -(2**31) or int(out.max()) > INT32_MAX):
        raise fail(f"{what} holds a value outside int32")
    return out.astype(np.int64)


def _check_nodes(col: dict[str, np.ndarray], used: int, fail: Callable[[str], Exception]) -> Any:
    """The node columns of one tree record (:func:`check_record`); each cell's
    predecessor on its path (-1 at a root's first cell), int64 [used]."""
    node, pos = col["node_ids"], col["position_ids"]
    if node[0] != 0 or np.any((np.diff(node) != 0) & (np.diff(node) != 1)):
        raise fail("node_ids do not run 0, 1, 2, ... in column order")
    first = np.flatnonzero(np.r_[True, node[1:] != node[:-1]])  # [M] each node's first cell
    last = np.r_[first[1:], used] - 1
    count = first.shape[0]
    end, parent = col["node_ends"][first], col["parent_ids"][first]
    if np.any(col["node_ends"] != end[node]) or np.any(col["parent_ids"] != parent[node]):
        raise fail("node_ends or parent_ids differ inside one node")
    ids = np.arange(count)
    if np.any((parent < -1) | (parent >= ids)):
        k = int(np.flatnonzero((parent < -1) | (parent >= ids))[0])
        raise fail(f"node {k}'s parent {int(parent[k])} is not an earlier node (or -1)")
    size, top = np.ones(count, np.int64), ids.copy()  # subtree size and last node
    for k in range(count - 1, 0, -1):  # children after parents: one pass from the end
        p = parent[k]
        if p >= 0:
            size[p] += size[k]
            top[p] = max(top[p], top[k])
    if np.any(end != ids + size) or np.any(end != top + 1):
        k = int(np.flatnonzero((end != ids + size) | (end != top + 1))[0])
        raise fail(f"node {k}'s end {int(end[k])} is not one past its subtree (nested ends)")
    start = np.where(parent < 0, 0, pos[last[np.maximum(parent, 0)]] + 1)
    if np.any(pos != start[node] + np.arange(used) - first[node]):
        raise fail("position_ids are not the depth along each path")
    before = np.arange(used) - 1  # the cell before each cell on its path
    before[first] = np.where(parent < 0, -1, last[np.maximum(parent, 0)])
    wrong = (before >= 0) & (col["input_ids"] != col["target_ids"][np.maximum(before, 0)])
    if wrong.any():
        raise fail(f"cell {int(np.argmax(wrong))}'s input is not the target before it on its path")
    return before


def _check_sequences(
    rec: Mapping[str, Any],
    pos: np.ndarray,
    before: np.ndarray,
    fail: Callable[[str], Exception],
    sequences: int | None,
) -> np.ndarray:
    """The sequence columns of one tree record (:func:`check_record`): each sequence
    one path from a root in depth order; how many sequences supervise each cell, [used]."""
    used = pos.shape[0]
    index = _ints(rec["sequence_index"], "sequence_index", fail)
    cells_in, masks_in = rec["sequence_cells"], rec["sequence_mask"]
    if not isinstance(cells_in, LISTS) or not isinstance(masks_in, LISTS):
        raise fail("sequence_cells and sequence_mask are not lists of lists")
    if not len(cells_in) == len(masks_in) == index.shape[0]:
        raise fail("sequence_index, sequence_cells and sequence_mask differ in length")
    high = INT32_MAX if sequences is None else sequences - 1
    if index.size and (int(index.min()) < 0 or int(index.max()) > high):
        raise fail(f"a sequence_index lies outside 0..{high:,}")
    if np.unique(index).shape[0] != index.shape[0]:
        raise fail("two sequences share a sequence_index")
    if not index.size:
        raise fail("it holds no sequence")
    lens = np.array([len(c) if isinstance(c, LISTS) else -1 for c in cells_in], np.int64)
    if any(not isinstance(m, LISTS) or len(m) != n for m, n in zip(masks_in, lens, strict=True)):
        raise fail("a sequence's sequence_mask is not one flag per cell")
    if lens.size and int(lens.min()) < 1:
        raise fail("a sequence holds no cell")
    cells = _ints([x for c in cells_in for x in c], "sequence_cells", fail)
    mask = np.array([x for m in masks_in for x in m], dtype=object)
    if any(type(x) is not bool and not isinstance(x, np.bool_) for x in mask):
        raise fail("sequence_mask is not a list of flags")
    if cells.size and (int(cells.min()) < 0 or int(cells.max()) >= used):
        raise fail(f"a sequence cell lies outside the row's {used:,} cells")
    starts = offsets_of(lens)[:-1]
    depth = np.arange(cells.shape[0]) - np.repeat(starts, lens)
    nxt = np.ones(cells.shape[0], bool)
    nxt[starts] = False  # cell i follows cell i - 1 of its sequence
    follows = before[cells[nxt]] == cells[np.flatnonzero(nxt) - 1]
    if np.any(pos[cells] != depth) or not np.all(follows):
        raise fail("a sequence's cells are not one path from a root, in depth order")
    return np.bincount(cells[mask.astype(bool)], minlength=used)


def check_record(
    rec: Mapping[str, Any],
    capacity: int,
    vocab_size: int,
    fail: Callable[[str], Exception],
    sequences: int | None = None,
) -> None:
    """One forest record (a row of :func:`~exactpack.io.shards.shard_table`) is a forest the
    permission predicate can trust, else ``fail(what)`` is raised: 1..``capacity`` cells,
    token ids in ``[0, vocab_size)``, node ids 0, 1, ... in column order, parents earlier
    nodes, each node's end one past its subtree (nested, inside the row), positions the
    depth along the path, each cell's input the target before it on its path, every
    sequence one path from a root in depth order (indexes distinct, below ``sequences``),
    and weights the count of sequences supervising each cell."""
    missing = [n for n in (*TREE_CELL_COLUMNS, *TREE_SEQUENCE_COLUMNS) if n not in rec]
    if missing:
        raise fail(f"the columns {missing} are missing")
    col = {n: _ints(rec[n], n, fail) for n in TREE_CELL_COLUMNS}
    used = col["input_ids"].shape[0]
    if not 1 <= used <= capacity:
        raise fail(f"it holds {used:,} cells; a row holds 1..{capacity:,} (capacity)")
    for name, values in col.items():
        if values.shape[0] != used:
            raise fail(f"{name} holds {values.shape[0]:,} values for {used:,} cells")
    if outside := _outside(np.r_[col["input_ids"], col["target_ids"]], vocab_size):
        raise fail(outside)
    before = _check_nodes(col, used, fail)
    supervised = _check_sequences(rec, col["position_ids"], before, fail, sequences)
    weights = col["weights"]
    if int(weights.min()) < 0:
        raise fail(f"weight {int(weights.min())} is negative")
    if np.any(weights != supervised):
        c = int(np.flatnonzero(weights != supervised)[0])
        raise fail(
            f"cell {c} has weight {int(weights[c])} but {int(supervised[c])} sequence(s)"
            " supervise it"
        )


def _agree(got: dict[str, int], entry: Mapping, where: Path | str) -> None:
    """What a shard holds is what its manifest ``entry`` says (where it says it)."""
    for key, value in got.items():
        if entry.get(key) is not None and value != entry[key]:
            raise bad_output(where, f"holds {key} {value:,} but the manifest says {entry[key]:,}")


def read_row_stats(file: Path, entry: Mapping) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of one shard (only the columns needed; checked against ``entry``): pairs per
    occurrence int64 [K], occurrence offsets int64 [R+1], eligible targets per row [R]."""
    try:
        check_schema(schema := pq.read_schema(file), str(file), entry)
        names = schema.names
        table = pq.read_table(file, columns=[n for n in names if n in ("pair_counts", "loss_bits")])
        seq, occ = flat_column(table, "pair_counts")
        pairs = offsets_of(seq.astype(np.int64))
        per_row = np.diff(pairs[occ])
        if "loss_bits" in names:
            bits = unpack_bits(table.column("loss_bits"), per_row, str(file))
            per_row = np.diff(offsets_of(bits)[pairs[occ]])
    except (pa.ArrowException, OSError) as err:
        raise bad_output(file, f"cannot read the shard ({err})") from None
    got = {"rows": occ.shape[0] - 1, "occurrences": seq.shape[0], "eligible": int(per_row.sum())}
    _agree(got, entry, file)
    return seq.astype(np.int64), occ, per_row


def check_contents(manifest: Mapping, read: Callable[[int], Any], where: Path) -> None:
    """Decode every shard now (``read(k)`` checks each: :class:`CompactRows` or forest
    records); then every ordinal (forest rows: ``sequence_index``) exactly once, and the
    eligible targets recorded."""
    ordinals, eligible = [], 0
    for k in range(len(manifest["shards"])):
        rows = read(k)
        if isinstance(rows, CompactRows):
            ordinals.append(rows.ordinals)
            eligible += int(np.count_nonzero(rows.loss_mask))
        else:
            ordinals.append(np.array([i for r in rows for i in r["sequence_index"]], np.int64))
            eligible += sum(sum(r["weights"]) for r in rows)
    seen = np.sort(np.concatenate([np.zeros(0, np.int64), *ordinals]))
    if not np.array_equal(seen, np.arange(seen.shape[0])):
        what = "ordinals are not 0..occurrences-1"
        if manifest.get("layout") == "tree":
            what = f"sequence_index values are not 0..{manifest['occurrences'] - 1:,}"
        raise bad_output(where / MANIFEST, f"the shards' {what} each once")
    stats = manifest.get("statistics")
    if isinstance(stats, Mapping) and stats.get("eligible_targets", eligible) != eligible:
        got = stats["eligible_targets"]
        raise bad_output(
            where / MANIFEST,
            f"statistics.eligible_targets is {got!r} but the shards hold {eligible:,}",
        )


def read_shard(file: Path, entry: Mapping, store: Any) -> Any:
    """Decode one shard file of a :class:`~exactpack.io.store.PackedStore` into checked
    :class:`CompactRows` (forest rows: records), both checked by :func:`check_shard`."""
    where = str(file)
    try:
        table = pq.read_table(file, memory_map=True)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as err:
        raise bad_output(file, f"cannot read the shard ({err})") from None
    check_table(table, where, entry, store.layout)
    if store.layout == "tree":
        records = table.to_pylist()
        first = int(entry["first_row"])
        for i, rec in enumerate(records):
            if rec["row"] != first + i:
                raise bad_output(where, f"row {first + i:,}: it is numbered {rec['row']}")
        check_shard(records, entry, store.occurrences, where, capacity=store.capacity,
                    vocab_size=store.binding.vocab_size)  # fmt: skip
        return records
    rows = arrow_to_rows(
        table,
        capacity=store.capacity,
        partition=store.partition,
        binding=store.binding,
        where=where,
    )
    check_shard(rows, entry, store.occurrences, where)
    return rows


def refuse_packed(path: Path) -> None:
    """Refuse a exactpack output (its folder or a file in it) given as input."""
    folder = path if path.is_dir() else path.parent
    try:
        kind = read_manifest(folder).get("format") if (folder / MANIFEST).is_file() else None
    except (OSError, InvalidInput, AttributeError):
        return
    if not isinstance(kind, str) or not kind.startswith("exactpack."):
        return
    use = (
        "exactpack.hf.load_trl(path) or TRL's trainer"
        if kind.endswith("trl-packed")
        else "exactpack.io.load_packed(path) or exactpack.training.PackedBatches(path)"
    )
    raise InvalidInput(
        f"{path} is a exactpack output (format {kind}): it is already packed — use it with"
        f" {use}, or give the corpus it was packed from"
    )
