"""Tree packing on disk: a table's rows as groups (:func:`file_groups`), and version 3.

A tree output is a packed directory like a flat one with ``"version": 3`` and
``"layout": "tree"``. One Parquet row per packed row, its used cells a prefix
of the row (padding is not stored); the same records are what
``pack_dataset(..., tree=True)`` returns::

    row             int64              global row index (on disk only)
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

:func:`tree_records` makes the records of a :class:`~exactpack.core.tree.TreeBatch`,
:func:`tree_batch_from_rows` one model call of any records; :class:`TreeStore`
reads them back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from exactpack.core.binding import INT32_MAX, Binding, Split
from exactpack.core.errors import InvalidInput, positive_int
from exactpack.core.examples import as_token_array, offsets_of
from exactpack.core.tree import TREE_COLUMNS, SequenceGroups, TreeBatch, groups_from_columns
from exactpack.io.atomic import Output
from exactpack.io.documents import Origin, make_binding
from exactpack.io.integrity import TreeManifest, bad_output, check_tree_record, decode
from exactpack.io.sft import TEMPLATE_COLUMNS, encode_sft, sft_columns
from exactpack.io.shards import FORMAT, TREE_VERSION, manifest_record, write_shard_file
from exactpack.io.tokenizers import Tokenizer


def read_table(source: Any, partition: Split | str = "train") -> tuple[pa.Table, Origin]:
    """Any input the flat path reads (:func:`exactpack.io.readers.read_arrow`) as one Arrow
    table and its :class:`Origin`."""
    from exactpack.io.readers import read_arrow

    # the readers keep the columns they know plus the text field: name "group" so a
    # Parquet input_ids + group input keeps its group (the other tree columns are kept)
    return read_arrow(source, partition, text_field="group")


def max_id(values: list[Any]) -> int:
    """The largest int in nested lists (0 when there is none)."""
    out = 0
    for v in values:
        if isinstance(v, (list, tuple)):
            out = max(out, max_id(list(v)))
        elif isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            out = max(out, int(v))
    return out


def file_groups(
    table: pa.Table,
    origin: Origin,
    *,
    binding: Binding,
    tokenizer: Tokenizer | None = None,
    mode: str = "on",
    prefix: int = 16,
    window: int = 4096,
) -> tuple[SequenceGroups, np.ndarray]:
    """``table``'s groups under ``binding`` and each sequence's input index (int64 [S]),
    from the first that applies: the id columns of :data:`~exactpack.core.tree.TREE_COLUMNS`;
    TRL's DPO text ``prompt`` / ``chosen`` / ``rejected`` (prompt + each answer read as an
    SFT prompt-completion row); with ``mode="auto"``, plain SFT rows grouped by their first
    ``prefix`` tokens within windows of ``window`` rows."""
    names = table.column_names
    where = origin.parts[0][0]
    if mode == "auto":
        return _auto_groups(
            *_plain_rows(table, origin, tokenizer, binding), binding, prefix, window
        )
    if any(set(cols) <= set(names) for cols in TREE_COLUMNS):
        wanted = {n for cols in TREE_COLUMNS for n in cols}
        groups = groups_from_columns(
            {n: table.column(n).to_pylist() if n in wanted else [] for n in names}, binding
        )
        return groups, np.arange(len(groups), dtype=np.int64)
    if {"prompt", "chosen", "rejected"} <= set(names):  # TRL's DPO text
        return _dpo_text(table, origin, tokenizer, binding)
    if "chosen" in names and "rejected" in names:
        raise InvalidInput(
            f"{where}: chosen / rejected rows without a prompt column (TRL's implicit prompt) —"
            " split the shared prompt into a prompt column"
        )
    if "input_ids" in names or sft_columns(names) is not None:
        raise InvalidInput(
            f"{where}: rows with columns {', '.join(names)} have no groups — pass --tree auto"
            " to group plain SFT rows by their first tokens, or add a group column"
        )
    groups_from_columns({n: [] for n in names}, binding)  # raises, naming the columns
    raise AssertionError("unreachable")


def _encoded(
    table: pa.Table, origin: Origin, tokenizer: Tokenizer | None, names: tuple[str, ...]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Sequences and their per-pair supervision (a target is supervised when its token is)."""
    tokens, offsets, flags = encode_sft(table, origin, tokenizer, names)
    _refuse_short(np.diff(offsets), origin)
    bounds = list(zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True))
    return [tokens[a:b] for a, b in bounds], [flags[a + 1 : b] for a, b in bounds]


def _refuse_short(n: np.ndarray, origin: Origin) -> None:
    """Refuse a row of fewer than 2 tokens (``n``: tokens per row)."""
    if n.size and int(n.min()) < 2:
        i = int(np.argmin(n))
        raise InvalidInput(
            f"{origin.locate(i)}: {int(n[i])} token(s); a sequence needs at least 2"
            " (one prediction pair) — drop the row"
        )


def _dpo_text(
    table: pa.Table, origin: Origin, tokenizer: Tokenizer | None, binding: Binding
) -> tuple[SequenceGroups, np.ndarray]:
    if tokenizer is None:
        raise InvalidInput(
            f"{origin.parts[0][0]}: rows hold prompt / chosen / rejected text but no tokenizer"
            " was given — pass --tokenizer with a local tokenizer folder, or tokenize them"
            " (prompt_input_ids / chosen_input_ids / rejected_input_ids)"
        )
    extras = {n: table.column(n) for n in TEMPLATE_COLUMNS if n in table.column_names}
    encoded = []
    for answer in ("chosen", "rejected"):
        cols = {"prompt": table.column("prompt"), "completion": table.column(answer), **extras}
        encoded.append(_encoded(pa.table(cols), origin, tokenizer, ("prompt", "completion")))
    (chosen, chosen_masks), (rejected, rejected_masks) = encoded
    # chosen, rejected of row 0, then of row 1, ...
    seqs = [s for pair in zip(chosen, rejected, strict=True) for s in pair]
    masks = [m for pair in zip(chosen_masks, rejected_masks, strict=True) for m in pair]
    group = np.repeat(np.arange(len(seqs) // 2, dtype=np.int64), 2)
    return SequenceGroups.of(seqs, masks, group, binding), np.arange(len(seqs), dtype=np.int64)


def _plain_rows(
    table: pa.Table, origin: Origin, tokenizer: Tokenizer | None, binding: Binding
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    names = table.column_names
    if "input_ids" in names:
        rows = table.column("input_ids").to_pylist()
        _refuse_short(np.array([len(ids or []) for ids in rows], dtype=np.int64), origin)
        vocab = binding.vocab_size
        seqs = [as_token_array(ids, vocab, origin.locate(i)) for i, ids in enumerate(rows)]
        return seqs, [np.ones(s.size - 1, bool) for s in seqs]
    cols = sft_columns(names)
    if cols is None:
        raise InvalidInput(
            f"{origin.parts[0][0]}: --tree auto groups plain SFT rows: input_ids, prompt /"
            f" completion or messages; this input has columns {', '.join(names) or 'none'}"
        )
    return _encoded(table, origin, tokenizer, cols)


def _auto_groups(
    seqs: list[np.ndarray], masks: list[np.ndarray], binding: Binding, prefix: int, window: int
) -> tuple[SequenceGroups, np.ndarray]:
    """Rows whose first ``prefix`` tokens agree, within each window of rows, as one group
    (groups in first-seen order; sequences reordered so groups are contiguous)."""
    order: list[int] = []
    group: list[int] = []
    for start in range(0, len(seqs), window):
        keys: dict[bytes, list[int]] = {}
        for i in range(start, min(start + window, len(seqs))):
            keys.setdefault(seqs[i][:prefix].tobytes(), []).append(i)
        for members in keys.values():
            group.extend([group[-1] + 1 if group else 0] * len(members))
            order.extend(members)
    picked = SequenceGroups.of([seqs[i] for i in order], [masks[i] for i in order], group, binding)
    return picked, np.asarray(order, dtype=np.int64)


def table_binding(
    table: pa.Table,
    partition: Split,
    *,
    vocab_size: int | None,
    tokenizer: Tokenizer | None,
    tokenizer_id: str | None = None,
    split_id: str | None = None,
) -> Binding:
    """The binding of a tree packing of ``table`` (receipt: the sha256 of its Arrow stream
    and the partition)."""

    def receipt() -> str:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return hashlib.sha256(f"tree:{partition.value}:".encode() + sink.getvalue()).hexdigest()

    return make_binding(
        receipt,
        vocab_size=vocab_size,
        tokenizer=tokenizer,
        tokenizer_id=tokenizer_id,
        split_id=split_id,
    )


# The records: one per packed row.

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
    """One record per row of ``batch`` (the columns of the module docstring, less ``row``):
    its used cells (a prefix of the row), node ids row-local, and its sequences."""
    width = batch.shape[1]
    seq_row = batch.seq_cells[batch.seq_bounds[:-1]] // width
    rows = []
    for r in range(batch.shape[0]):
        used = int(batch.input_valid[r].sum())
        first = int(batch.nodes[r, 0])
        node = batch.nodes[r, :used]
        parent = batch.node_parent[node]
        cells = {
            "input_ids": batch.inputs[r, :used],
            "target_ids": batch.targets[r, :used],
            "position_ids": batch.positions[r, :used],
            "node_ids": node - first,
            "node_ends": batch.node_ends[r, :used] - first,
            "parent_ids": np.where(parent >= 0, parent - first, -1),
            "weights": batch.weights[r, :used],
        }
        record = {name: value.astype(np.int64).tolist() for name, value in cells.items()}
        seqs = np.flatnonzero(seq_row == r)
        spans = [slice(batch.seq_bounds[i], batch.seq_bounds[i + 1]) for i in seqs]
        record["sequence_index"] = batch.seq_index[seqs].tolist()
        record["sequence_cells"] = [(batch.seq_cells[s] % width).tolist() for s in spans]
        record["sequence_mask"] = [batch.seq_loss_mask[s].tolist() for s in spans]
        rows.append(record)
    return rows


def tree_batch_from_rows(rows: list[dict[str, Any]], capacity: int, vocab_size: int) -> TreeBatch:
    """Records of :func:`tree_records` (any subset, any order) as one model call, checked
    as a tree shard is checked on load
    (:func:`~exactpack.io.integrity.check_tree_record`) before anything is allocated."""
    capacity = positive_int("capacity", capacity, INT32_MAX)
    binding = Binding(vocab_size, "pretokenized", "tree-dataset")  # checks vocab_size
    if not isinstance(rows, (list, tuple)) or not all(isinstance(r, Mapping) for r in rows):
        raise InvalidInput("rows must be a list of tree records (dicts: tree_records)")
    for r, row in enumerate(rows):
        check_tree_record(row, capacity, binding.vocab_size, _argument(r))
    index = [i for row in rows for i in row["sequence_index"]]
    if len(set(index)) != len(index):
        raise InvalidInput("two records hold the same sequence_index — pass each packed row once")
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


def write_tree_shards(
    records: list[dict[str, Any]],
    output: Output,
    *,
    binding: Binding,
    partition: Split,
    config: dict[str, Any],
    shard_rows: int = TREE_SHARD_ROWS,
    **sections: Any,
) -> dict[str, Any]:
    """Write tree ``records`` as version-3 shards into the held ``output``; the manifest
    for :meth:`~exactpack.io.atomic.Output.commit` (``sections`` go into it)."""
    shards = []
    for k, a in enumerate(range(0, max(len(records), 1), shard_rows)):
        part = records[a : a + shard_rows]
        table = pa.Table.from_pylist(
            [{"row": a + i} | rec for i, rec in enumerate(part)], schema=TREE_SCHEMA
        )
        shards.append(write_shard_file(table, output.path, output.shard(k), a))
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


class TreeStore:
    """A tree output read back: ``len(store)`` rows; ``store[i]`` / :meth:`records` give
    the row records :func:`tree_batch_from_rows` takes; ``capacity``
    and ``binding`` say how to call it."""

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        where = path / "manifest.json"
        if manifest.get("format") != FORMAT or manifest.get("version") != TREE_VERSION:
            raise InvalidInput(
                f"{where}: a tree output of format {manifest.get('format')!r} version"
                f" {manifest.get('version')!r}; this exactpack reads tree outputs of version"
                f" {TREE_VERSION} — pack it again with this version"
            )
        m = decode(manifest, TreeManifest, where)
        self.binding = Binding.from_dict(manifest["binding"])
        self.partition = Split(m.partition)
        self.capacity, self.max_rows_per_batch = m.config.capacity, m.config.max_rows_per_batch
        self.num_rows, self.shards = m.rows, list(manifest["shards"])
        if any(Path(s.file).name != s.file or s.file in ("", ".", "..") for s in m.shards):
            raise InvalidInput(f"{where}: a shard file is not a plain file name — pack again")
        if sum(s.rows for s in m.shards) != self.num_rows:
            raise InvalidInput(f"{where}: shards do not hold {self.num_rows} rows — pack again")
        sequences = manifest.get("sequences")  # written since version 3; None: not checked
        if sequences is not None and (type(sequences) is not int or sequences < 0):
            raise bad_output(where, f"sequences is {sequences!r}, not a count")
        self.sequences: int | None = sequences
        self.path, self.manifest = path, manifest
        self._cached: tuple[int, list[dict[str, Any]]] | None = None

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
            if any(_has_nulls(column) for column in table.columns):
                raise InvalidInput(f"{file}: holds a null value — the file is damaged; pack again")
            records = table.to_pylist()
            vocab = self.binding.vocab_size
            for i, rec in enumerate(records):
                row, fail = entry["first_row"] + i, _damaged(str(file), entry["first_row"] + i)
                if rec["row"] != row:
                    raise fail(f"it is numbered {rec['row']}")
                check_tree_record(rec, self.capacity, vocab, fail, self.sequences)
            self._cached = (k, records)
        return self._cached[1]

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < self.num_rows:
            raise IndexError(f"row {i} outside 0..{self.num_rows - 1}")
        k = max(j for j, s in enumerate(self.shards) if s["first_row"] <= i)
        return self.shard_records(k)[i - self.shards[k]["first_row"]]

    def records(self) -> list[dict[str, Any]]:
        """Every row's record, in row order (``row`` dropped); the sequence indexes checked
        to number the input's sequences, each once."""
        rows = [rec for k in range(len(self.shards)) for rec in self.shard_records(k)]
        index = np.sort(np.array([i for rec in rows for i in rec["sequence_index"]], np.int64))
        count = index.shape[0] if self.sequences is None else self.sequences
        if not np.array_equal(index, np.arange(count)):
            raise bad_output(
                self.path / "manifest.json",
                f"the rows' sequence_index values are not 0..{count - 1:,} each once",
            )
        return [{n: v for n, v in rec.items() if n != "row"} for rec in rows]


def _damaged(where: str, row: int) -> Any:
    """The loader's ``fail``: the flat integrity check's words for a damaged shard."""
    return lambda what: bad_output(where, f"row {row:,}: {what}")


def _has_nulls(column: pa.ChunkedArray) -> bool:
    """Whether a column holds a null at any depth of its lists."""
    while not column.null_count and pa.types.is_list(column.type):
        column = pc.list_flatten(column)
    return bool(column.null_count)


__all__ = [
    "TREE_SCHEMA",
    "TreeStore",
    "file_groups",
    "read_table",
    "table_binding",
    "tree_batch_from_rows",
    "tree_records",
    "write_tree_shards",
]
