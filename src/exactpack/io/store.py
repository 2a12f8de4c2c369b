"""The packed directory: Parquet shards (:mod:`exactpack.io.shards`; trees:
:mod:`exactpack.io.tree_store`) plus ``manifest.json``, published by
:mod:`exactpack.io.atomic`."""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from exactpack.core.batch import PackedBatch
from exactpack.core.binding import Binding, Split
from exactpack.core.compact import CompactRows
from exactpack.core.errors import InvalidInput, SplitMismatch, path_argument, type_argument
from exactpack.io.atomic import MANIFEST, Output, open_output
from exactpack.io.integrity import (
    DEPTHS,
    check_checksums,
    check_contents,
    check_manifest,
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
from exactpack.io.tree_store import TreeStore
from exactpack.io.trl_schema import refuse_trl, trl_table

#: Shards in memory at once while writing: one being gathered, the others compressing.
SHARDS_IN_FLIGHT = 2


def to_table(rows: CompactRows, format: str = "exactpack") -> pa.Table:
    """``rows`` as one shard's table: :func:`~exactpack.io.shards.shard_table` or TRL's."""
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
) -> list[dict[str, Any]]:
    """Shard ``k``, rows ``gather(bounds[k], bounds[k+1])``, written into ``output``; the
    manifest entries, in order (``on_shard(entry)`` after each). At most
    :data:`SHARDS_IN_FLIGHT` shards are in memory; a single one is written on this thread."""
    spans = list(itertools.pairwise(np.asarray(bounds).tolist()))
    entries: list[dict[str, Any]] = []

    def build(k: int) -> pa.Table:
        return to_table(gather(*spans[k]), format)

    def write(k: int, table: pa.Table) -> dict[str, Any]:
        return write_shard_file(table, output.path, output.shard(k), spans[k][0])

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
    """Raise BindingMismatch / SplitMismatch unless ``store`` (flat or tree) is expected."""
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
    give :class:`PackedBatch` objects identical to :func:`exactpack.materialize`'s;
    ``store.shard_rows(k)`` gives shard ``k`` as :class:`CompactRows`."""

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        m = check_manifest(manifest, path)  # every number agrees with the others before use
        self.path, self.manifest, self.shards = path, manifest, manifest["shards"]
        self.binding = Binding.from_dict(manifest["binding"])
        self.partition = Split(m.partition)
        self.capacity, self.max_rows_per_batch = m.config.capacity, m.config.max_rows_per_batch
        self.num_rows, self.occurrences = m.rows, m.occurrences
        self._first_rows = np.array([s["first_row"] for s in self.shards], dtype=np.int64)
        self._cached: tuple[int, CompactRows] | None = None

    require = require  # store.require(expected_binding, expected_split)

    def __len__(self) -> int:
        return -(-self.num_rows // self.max_rows_per_batch)

    def shard_rows(self, k: int) -> CompactRows:
        if self._cached is None or self._cached[0] != k:
            self._cached = (k, read_shard(self.path / self.shards[k]["file"], self.shards[k], self))
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


def load_packed(
    path: str | Path,
    expected_binding: Binding | None = None,
    *,
    integrity: bool | str = True,
    expected_split: Split | str | None = None,
) -> PackedStore:
    """Open a packed directory (a tree output as a :class:`~exactpack.io.tree_store.TreeStore`),
    reading only the files its manifest lists.

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
    store: Any
    if isinstance(manifest, dict) and manifest.get("layout") == "tree":
        store = TreeStore(path, manifest)  # version 3: tree rows (exactpack pack --tree)
    else:
        refuse_trl(manifest, str(path))
        store = PackedStore(path, manifest)
    if integrity:
        check_checksums(store.manifest, path)
    if integrity == "full" and isinstance(store, PackedStore):
        check_contents(store.manifest, store.shard_rows, path)
    elif integrity == "full":
        store.records()
    require(store, expected_binding, expected_split)
    return store
