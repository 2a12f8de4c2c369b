"""The packed directory: Parquet shards (:mod:`exactpack.io.shards`, flat or forest rows)
plus ``manifest.json``, published by :mod:`exactpack.io.atomic`; one writer
(:func:`write_shards`) and one store (:class:`PackedStore`) for both."""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from exactpack.core.batch import PackedBatch
from exactpack.core.binding import INT32_MAX, Binding, Split
from exactpack.core.compact import CompactRows
from exactpack.core.errors import (
    InvalidInput,
    SplitMismatch,
    path_argument,
    positive_int,
    type_argument,
)
from exactpack.core.examples import offsets_of, spread
from exactpack.io.atomic import MANIFEST, Output, open_output
from exactpack.io.integrity import (
    DEPTHS,
    check_checksums,
    check_contents,
    check_manifest,
    check_shard,
    read_manifest,
    read_shard,
)
from exactpack.io.shards import (
    SHARD_TOKENS,
    manifest_record,
    shard_bounds,
    shard_table,
    write_shard_file,
)
from exactpack.io.trl_schema import refuse_trl, trl_table

#: Shards in memory at once while writing: one being gathered, the others compressing.
SHARDS_IN_FLIGHT = 2


def to_table(rows: CompactRows | pa.Table, format: str = "exactpack") -> pa.Table:
    """``rows`` as one shard's table: :func:`~exactpack.io.shards.shard_table` or TRL's; a
    table made already (forest rows: :func:`~exactpack.io.shards.shard_table` of a tree
    batch) as it is."""
    if isinstance(rows, pa.Table):
        return rows
    return trl_table(rows) if format == "trl" else shard_table(rows)


def write_shard(
    rows: CompactRows, folder: str | Path, name: str, format: str = "exactpack"
) -> dict:
    """The one shard writer: ``rows`` as the file ``folder/name``; its manifest entry."""
    return write_shard_file(to_table(rows, format), folder, name, rows.first_row)


def write_shards(
    gather: Callable[[int, int], CompactRows],
    bounds: np.ndarray,
    output: Output,
    format: str = "exactpack",
    on_shard: Callable[[dict[str, Any]], None] | None = None,
    first_shard: int = 0,
) -> list[dict[str, Any]]:
    """Shard ``first_shard + k``, rows ``gather(bounds[k], bounds[k+1])`` (flat or forest),
    written into ``output``; the manifest entries, in order (``on_shard(entry)`` after each).
    At most :data:`SHARDS_IN_FLIGHT` shards are in memory; a single one is written on this
    thread."""
    spans = list(itertools.pairwise(np.asarray(bounds).tolist()))
    entries: list[dict[str, Any]] = []

    def build(k: int) -> pa.Table:
        return to_table(gather(*spans[k]), format)

    def write(k: int, table: pa.Table) -> dict[str, Any]:
        return write_shard_file(table, output.path, output.shard(first_shard + k), spans[k][0])

    def done(entry: dict[str, Any]) -> None:
        entries.append(entry)
        if on_shard is not None:
            on_shard(entry)

    if len(spans) == 1:
        done(write(0, build(0)))
        return entries
    writing: collections.deque[Future] = collections.deque()
    with ThreadPoolExecutor(SHARDS_IN_FLIGHT, thread_name_prefix="exactpack-write") as pool:
        for k in range(len(spans)):
            # shard k is gathered while at most SHARDS_IN_FLIGHT - 1 earlier ones write
            while len(writing) >= SHARDS_IN_FLIGHT:
                done(writing.popleft().result())  # raises a writer's error here
            writing.append(pool.submit(write, k, build(k)))
        while writing:
            done(writing.popleft().result())
    return entries


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
    """Write ``rows`` as a packed directory at ``out`` (:func:`~exactpack.io.atomic.open_output`:
    on a failure a previous output is left as it was); return the manifest.
    ``on_shard(rows_written)`` reports progress."""
    with open_output(out, overwrite) as output:
        bounds = shard_bounds(rows, max_rows_per_batch, shard_tokens)
        report = None if on_shard is None else (lambda entry: on_shard(entry["rows"]))
        shards = write_shards(rows.slice_rows, bounds, output, on_shard=report)
        manifest = manifest_record(
            binding=rows.binding,
            partition=rows.partition,
            config={"capacity": rows.capacity, "max_rows_per_batch": max_rows_per_batch},
            shards=shards,
            rows=rows.num_rows,
            occurrences=len(rows),
            **(extra or {}),
        )
        output.commit(manifest)
    return manifest


def require(
    store: Any, expected_binding: Binding | None = None, expected_split: Split | str | None = None
) -> None:
    """Raise BindingMismatch / SplitMismatch unless ``store`` is expected."""
    if expected_binding is not None:
        expected_binding.require(store.binding, f"packed data {store.path}")
    if expected_split is not None:
        want = Split.parse(expected_split)
        if store.partition is not want:
            raise SplitMismatch(
                f"packed data {store.path} holds split {store.partition.value!r}, not"
                f" {want.value!r} — load the {want.value} output instead"
            )


class PackedStore:
    """A packed directory read back: ``len(store)`` model calls; ``store[i]`` / iteration
    give :class:`PackedBatch` objects identical to :func:`exactpack.materialize`'s (a forest
    output, ``layout == "tree"``: forest rows, calls never straddling a shard);
    ``store.shard_rows(k)`` gives shard ``k`` as
    :class:`CompactRows` (forest: its records; :meth:`records`; any records back as a
    model call: :func:`tree_batch_from_rows`). ``occurrences`` counts a forest's
    sequences."""

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        m = check_manifest(manifest, path)  # every number agrees with the others before use
        self.path, self.manifest, self.shards = path, manifest, manifest["shards"]
        self.binding = Binding.from_dict(manifest["binding"])
        self.partition, self.layout = Split(m.partition), m.layout
        self.capacity, self.max_rows_per_batch = m.config.capacity, m.config.max_rows_per_batch
        self.num_rows, self.occurrences = m.rows, m.occurrences
        self._first_rows = np.array([s["first_row"] for s in self.shards], dtype=np.int64)
        rows = np.array([s["rows"] for s in self.shards], dtype=np.int64)
        # forest calls never straddle a shard: each shard's own -(-rows // per_call)
        calls = -(-rows // self.max_rows_per_batch) if self.layout == "tree" else rows[:0]
        self._first_calls = np.concatenate([[0], np.cumsum(calls)]).astype(np.int64)
        self._cached: tuple[int, Any] | None = None

    require = require  # store.require(expected_binding, expected_split)

    def __len__(self) -> int:
        if self.layout == "tree":
            return int(self._first_calls[-1])
        return -(-self.num_rows // self.max_rows_per_batch)

    def shard_rows(self, k: int) -> Any:
        """Shard ``k`` checked: :class:`CompactRows`, or a forest's records (``row`` kept)."""
        if self._cached is None or self._cached[0] != k:
            self._cached = (k, read_shard(self.path / self.shards[k]["file"], self.shards[k], self))
        return self._cached[1]

    def __getitem__(self, i: int) -> Any:
        if not -len(self) <= i < len(self):
            raise IndexError(f"model call {i} outside 0..{len(self) - 1}")
        i %= len(self)
        if self.layout == "tree":
            k = int(np.searchsorted(self._first_calls, i, "right") - 1)
            local = (i - int(self._first_calls[k])) * self.max_rows_per_batch
            rows = self.shard_rows(k)[local : local + self.max_rows_per_batch]
            batch = tree_batch_from_rows([_drop_row(r) for r in rows], self.capacity,
                                         self.binding.vocab_size)  # fmt: skip
            return dataclasses.replace(batch, binding=self.binding, partition=self.partition)
        first = i * self.max_rows_per_batch
        k = int(np.searchsorted(self._first_rows, first, "right") - 1)
        rows = self.shard_rows(k)
        local = first - rows.first_row
        stop = min(local + self.max_rows_per_batch, rows.num_rows)
        return rows.slice_rows(local, stop).to_batch()

    def records(self) -> list[dict[str, Any]]:
        """Every forest row's record, in row order (``row`` dropped), each checked, and the
        sequence indexes checked to number the input's sequences, each once."""
        check_contents(self.manifest, self.shard_rows, self.path)
        return [_drop_row(r) for k in range(len(self.shards)) for r in self.shard_rows(k)]

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]


def load_packed(
    path: str | Path,
    expected_binding: Binding | None = None,
    *,
    integrity: bool | str = True,
    expected_split: Split | str | None = None,
) -> PackedStore:
    """Open a packed directory (flat or forest rows), reading only the files its manifest
    lists.

    ``integrity`` (:mod:`exactpack.io.integrity`): ``False`` checks the manifest,
    ``True`` also every shard's size and sha256, ``"full"`` also decodes every
    shard now; a shard is always checked against its entry when read. Raises
    :class:`~exactpack.core.errors.InvalidInput` for a missing, malformed or
    damaged output (naming what disagrees), ``BindingMismatch`` /
    ``SplitMismatch`` when ``expected_binding`` / ``expected_split`` differ.
    """
    path = path_argument("path", path)
    if expected_binding is not None and not isinstance(expected_binding, Binding):
        type_argument(
            "expected_binding", expected_binding, (Binding,), "a exactpack.Binding or None"
        )
    if integrity not in DEPTHS:
        raise InvalidInput(f"integrity must be True, False or 'full', not {integrity!r}")
    if not (path / MANIFEST).is_file():
        raise InvalidInput(
            f"{path} has no {MANIFEST}: not a finished exactpack output (an interrupted run"
            " leaves none) — run exactpack pack again"
        )
    manifest = read_manifest(path)
    refuse_trl(manifest, str(path))
    store = PackedStore(path, manifest)
    if integrity:
        check_checksums(store.manifest, path)
    if integrity == "full":
        check_contents(store.manifest, store.shard_rows, path)
    require(store, expected_binding, expected_split)
    return store


def tree_batch_from_rows(rows: list[dict[str, Any]], capacity: int, vocab_size: int) -> PackedBatch:
    """Forest records (:func:`~exactpack.io.shards.row_records`; any subset, any order) as
    one model call, checked as a tree shard is checked on load
    (:func:`~exactpack.io.integrity.check_shard`) before anything is allocated, then
    gathered as :class:`CompactRows` (a node a window) like any packed rows."""
    capacity = positive_int("capacity", capacity, INT32_MAX)
    binding = Binding(vocab_size, "pretokenized", "tree-dataset")  # checks vocab_size
    if not isinstance(rows, (list, tuple)) or not all(isinstance(r, Mapping) for r in rows):
        raise InvalidInput("rows must be a list of tree records (dicts: shards.row_records)")
    check_shard(rows, {}, None, "tree records", capacity=capacity, vocab_size=binding.vocab_size,
                fail=_argument)  # fmt: skip
    index = [i for row in rows for i in row["sequence_index"]]

    def flat(name: str, dtype: Any = np.int64) -> np.ndarray:  # every row's, back to back
        return np.array([x for row in rows for x in row[name]], dtype=dtype)

    used = np.array([len(row["input_ids"]) for row in rows], dtype=np.int64)
    cell_row, cell_col = np.repeat(np.arange(len(rows)), used), spread(used)[1]
    node = flat("node_ids")  # row-local, 0, 1, 2, ... in column order
    starts = cell_col == 0
    starts[1:] |= node[1:] != node[:-1]
    first = np.flatnonzero(starts)  # each node's first cell
    lens = np.diff(np.append(first, node.shape[0]))
    row_offsets = offsets_of(np.bincount(cell_row[first], minlength=len(rows)))
    base = row_offsets[cell_row[first]]  # each node's row's first node
    parent, depths = flat("parent_ids")[first], flat("position_ids")[first]
    inputs, targets = flat("input_ids"), flat("target_ids")
    # sequences: each ends where its node does (the node of its last cell)
    cells = [c for row in rows for c in row["sequence_cells"]]
    seq_row = np.repeat(np.arange(len(rows)), [len(row["sequence_cells"]) for row in rows])
    last = offsets_of(used)[seq_row] + np.array([c[-1] for c in cells], dtype=np.int64)
    seq_nodes = node[last] + row_offsets[seq_row]
    if np.any(depths[seq_nodes] + lens[seq_nodes] != [len(c) for c in cells]):
        raise InvalidInput("a sequence ends inside a node — pass the records of shards.row_records")
    return CompactRows(
        tokens=np.insert(inputs, first + lens, targets[first + lens - 1]).astype(np.int32),
        lengths=lens,
        starts=cell_col[first],
        row_offsets=row_offsets,
        ordinals=np.arange(first.shape[0], dtype=np.int64),
        capacity=capacity,
        partition=Split.TRAIN,
        binding=binding,
        parents=np.where(parent >= 0, parent + base, -1),
        depths=depths,
        weights=flat("weights", np.int32),
        seq_index=np.array(index, dtype=np.int64),
        seq_nodes=seq_nodes,
        seq_mask=np.array([x for row in rows for m in row["sequence_mask"] for x in m], bool),
    ).to_batch()


def _argument(r: int) -> Any:
    """The constructor's ``fail``: an argument error naming the record."""
    return lambda what: InvalidInput(
        f"tree record {r}: {what} — pass the records of shards.row_records, pack_dataset(...,"
        " tree=True) or load_packed(...).records() unchanged"
    )


def _drop_row(record: dict[str, Any]) -> dict[str, Any]:
    return {n: v for n, v in record.items() if n != "row"}
