"""The one stream engine: documents read as they come, packed by stream best fit, as rows.

::

    source ──StreamSource.tables──▶ chunk_from_arrow (columns checked, tokenized, vocabulary)
        ──▶ units (examples, long ones cut; or tries) ──StreamPacker.push──▶ placements of
        closed rows ──StreamPass.rows──▶ CompactRows (forest rows for tries)

A unit is what the packer places whole: a flat example (a one-node trie) or, with
``tree``, a group's trie (a DPO pair, a GRPO group, ``input_ids`` rows of one ``group``:
:func:`~exactpack.pipeline.pack_tree.block_groups`), the rows of one group read together.

One pass reads ``chunk`` documents at a time; memory is the packer's ``lookahead`` and
``max_open_rows`` (:func:`~exactpack.core.stream_packer.stream_bytes`), one chunk, and the
closed rows its adapter holds. Two thin adapters drive it:
:class:`exactpack.training.StreamDataset` (a torch ``IterableDataset`` of scheduled model
calls, resumable from its ``state_dict``) and :func:`exactpack.hf.pack_dataset` over a
stream (a ``datasets.IterableDataset`` of packed rows).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exactpack.core.binding import Binding, Split
from exactpack.core.compact import CompactRows
from exactpack.core.config import check_segment_namespace
from exactpack.core.errors import BudgetExceeded, InvalidInput, OversizedExample
from exactpack.core.examples import long_ranges, offsets_of
from exactpack.core.stream_packer import (
    DEFAULT_LOOKAHEAD,
    DEFAULT_MAX_OPEN_ROWS,
    DEFAULT_STATE_BYTES,
    StreamPacker,
    stream_bytes,
)
from exactpack.core.supervision import Objective
from exactpack.core.tree import TrieSource, build_layout
from exactpack.io.columns import check_split, chunk_from_arrow, sft_columns
from exactpack.io.documents import Origin
from exactpack.io.tokenizers import Tokenizer
from exactpack.io.trl_schema import carried_columns
from exactpack.pipeline.corpus import is_sft, refuse_cut_sft
from exactpack.pipeline.pack_tree import block_groups

#: Bytes a closed row waiting for its step holds per cell: its token (int32) and flag.
WAITING_CELL_BYTES = 4 + 1
#: No placements: (example, row, start), int64 [0] each.
NO_PLACEMENTS = (np.zeros(0, dtype=np.int64),) * 3


class StreamSource:
    """A stream's documents as Arrow tables, read again on every pass (a generator: one).

    ``documents``: a ``datasets`` dataset (read as Arrow), an iterable of mappings or a
    function returning one; with ``bare``, a document may also be token ids or a text."""

    def __init__(self, documents: Any, *, bare: bool = False, text_field: str = "text") -> None:
        if not callable(documents) and (
            isinstance(documents, (str, bytes, Mapping)) or not isinstance(documents, Iterable)
        ):
            raise InvalidInput(
                f"documents must be an iterable of documents or a function returning one, got"
                f" {type(documents).__name__} — pass a list, a datasets.Dataset or a generator"
                " function"
            )
        hf = sys.modules.get("datasets")  # not loaded: no dataset of it was made
        self.documents, self.bare, self.text_field = documents, bare, text_field
        self.hf = hf is not None and isinstance(documents, (hf.Dataset, hf.IterableDataset))
        self.one_shot = not self.hf and not callable(documents) and iter(documents) is documents
        self.passes = 0

    def size(self) -> int | None:
        """How many documents a sized source holds (None: not known before it is read)."""
        size = None if callable(self.documents) else getattr(self.documents, "__len__", None)
        return None if size is None else size()

    def tables(self, skip: int, chunk: int) -> Iterator[pa.Table]:
        """This pass's documents from ``skip`` on, in tables of at most ``chunk`` rows."""
        if self.one_shot and self.passes:
            raise InvalidInput(
                "the stream is a generator that was already read once; a packed stream reads"
                " its source on every pass (epoch) — pass a function returning a fresh"
                " iterator, or a datasets.IterableDataset"
            )
        self.passes += 1
        if self.hf:
            source = self.documents.skip(skip) if skip else self.documents
            yield from source.with_format("arrow").iter(batch_size=chunk)
            return
        items = iter(self.documents() if callable(self.documents) else self.documents)
        first = skip
        for _ in itertools.islice(items, skip):
            pass
        while rows := list(itertools.islice(items, chunk)):
            yield self._table(rows, first)
            first += len(rows)

    def _table(self, rows: list[Any], first: int) -> pa.Table:
        for i, row in enumerate(rows):
            if self.bare and not isinstance(row, Mapping):
                rows[i] = {self.text_field if isinstance(row, str) else "input_ids": row}
            elif not isinstance(row, Mapping):
                raise InvalidInput(
                    f"stream row {first + i} is a {type(row).__name__}, not a mapping —"
                    " yield rows such as {'input_ids': [...]} or {'text': '...'}"
                )
        try:
            names = dict.fromkeys(name for row in rows for name in row)  # every row's columns
            table = pa.table({name: [row.get(name) for row in rows] for name in names})
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            raise InvalidInput(
                f"stream rows {first}..{first + len(rows) - 1}: cannot read their columns"
                f" ({err}) — give every row the same columns and types"
            ) from None
        if self.bare and "id" in table.column_names:  # a document without one: its index
            index = pa.array([str(first + i) for i in range(len(rows))])
            ids = pc.coalesce(table["id"].cast(pa.string()), index)
            table = table.set_column(table.column_names.index("id"), "id", ids)
        return table


@dataclass(frozen=True, eq=False)
class Example:
    """A unit: an example's ``window`` int32 [len + 1] and ``loss_mask`` bool [len]; a trie
    (``nodes``: :class:`~exactpack.core.tree.TrieSource`'s parts of it, trie-local, and its
    sequences' ``carried`` columns) its nodes' windows back to back and its cells' weights
    int32 [size]."""

    window: np.ndarray
    loss_mask: np.ndarray
    source_id: str
    start: int
    doc: int
    doc_first_example: int
    nodes: dict[str, Any] | None = None

    @property
    def size(self) -> int:
        """Cells it takes in a row (an example's prediction pairs)."""
        return int(self.loss_mask.shape[0])


@dataclass(frozen=True)
class StreamSettings:
    """How a stream is read and packed: ``capacity`` cells a row, ``pair_capacity`` pairs an
    example at most (``capacity - 1`` when ``count_tokens``: format trl), the packer's
    ``lookahead`` / ``max_open_rows`` / ``seed``, ``chunk`` documents read at a time."""

    capacity: int
    pair_capacity: int
    lookahead: int = DEFAULT_LOOKAHEAD
    max_open_rows: int = DEFAULT_MAX_OPEN_ROWS
    seed: int = 0
    kernels: str = "auto"
    cut_long: bool = False
    tokenizer: Tokenizer | None = None
    text_field: str = "text"
    partition: Split = Split.TRAIN
    objective: Objective | None = None
    chunk: int = 1024
    name: str = "stream"  # what an error calls a document: "stream row 3"
    rows_per_step: int = 1  # closed rows held at once (StreamDataset: one step)
    tree: str | None = None  # "on": a unit is a group's trie

    def packer(self) -> dict[str, int]:
        """The packer's settings, as a manifest records them."""
        return {"lookahead": self.lookahead, "max_open_rows": self.max_open_rows, "seed": self.seed}

    @property
    def count_tokens(self) -> bool:
        return self.pair_capacity < self.capacity

    def check_memory(self) -> None:
        """The packer's buffers, then with ``rows_per_step`` closed rows, within
        :data:`~exactpack.core.stream_packer.DEFAULT_STATE_BYTES`, before any allocation."""
        StreamPacker.check_settings(self.capacity, self.lookahead, self.max_open_rows, self.seed)
        packer = stream_bytes(self.capacity, self.lookahead, self.max_open_rows)
        step = self.rows_per_step * self.capacity * WAITING_CELL_BYTES
        for need, what, fix in (
            (packer, f"a stream-best-fit packer (capacity {self.capacity:,}, lookahead"
             f" {self.lookahead:,}, max_open_rows {self.max_open_rows:,})",
             "lower lookahead or max_open_rows"),
            (packer + step, f"one optimizer step of {self.rows_per_step:,} rows of capacity"
             f" {self.capacity:,} held while it is cut",
             "lower world_size, micro_batches or rows_per_micro_batch"),
        ):  # fmt: skip
            if need > DEFAULT_STATE_BYTES:
                raise BudgetExceeded(
                    f"{what} would take {need:,} bytes, over the {DEFAULT_STATE_BYTES:,}-byte"
                    f" bound — {fix}"
                )


class StreamPass:
    """One pass of the engine over ``source``: :meth:`push` reads a chunk and returns the
    placements (example, row, start) it closed; :meth:`rows` gathers closed rows as
    :class:`CompactRows` from the examples still ``pending`` (example index -> data)."""

    def __init__(self, source: StreamSource, binding: Binding, settings: StreamSettings) -> None:
        self.source, self.binding, self.s = source, binding, settings
        self.packer = StreamPacker(
            settings.capacity, lookahead=settings.lookahead, max_open_rows=settings.max_open_rows,
            seed=settings.seed, kernels=settings.kernels, stream=binding.split_id,
        )  # fmt: skip
        self.pending: dict[int, Example] = {}
        self.docs_read = self.seqs_read = 0
        self.source_done = False
        self._tables: Iterator[pa.Table] | None = None
        self._left: pa.Table | None = None

    def read(self, count: int, first_example: int) -> tuple[list[Example], int]:
        """Up to ``count`` next documents (with ``tree``: on to the end of the last one's
        group) as units numbered from ``first_example``; how many documents were read."""
        if self._tables is None:
            self._tables = self.source.tables(self.docs_read, self.s.chunk)
        out: list[Example] = []
        start = self.docs_read
        while self.docs_read - start < count:
            table = self._left if self._left is not None else next(self._tables, None)
            if table is None:
                break
            want = count - (self.docs_read - start)
            while self.s.tree and "group" in table.column_names:  # a group's rows: one trie
                group = table["group"]
                after = np.flatnonzero(pc.not_equal(group[1:], group[:-1]).to_numpy(False)) + 1
                more = None if (after >= want).any() else next(self._tables, None)
                if more is None:
                    want = int(next(iter(after[after >= want]), table.num_rows))
                    break
                table = pa.concat_tables([table, more], promote_options="permissive")
            self._left = table.slice(want) if table.num_rows > want else None
            units = self._tries if self.s.tree else self._examples
            out += units(table.slice(0, want), first_example + len(out))
        return out, self.docs_read - start

    def _tries(self, table: pa.Table, first_example: int) -> list[Example]:
        """The tries of ``table``'s groups, their sequences numbered on from the last's."""
        first, origin = self.docs_read, Origin(((self.s.name, -self.docs_read, "row"),))
        check_split(table, origin, self.s.partition)
        groups, index = block_groups(table, origin, self.binding, self.s.tokenizer, self.s)
        lay = build_layout(groups, self.s.capacity)
        tokens, parts = TrieSource(groups, lay, index).take(np.arange(len(lay.sizes)), True)
        carried = carried_columns(table, groups).take(pa.array(parts["seq_index"]))
        k, seqs = parts.pop("units"), np.diff(lay.seq_bounds)  # nodes, sequences per trie
        node0, seq0 = offsets_of(k), offsets_of(seqs)
        parents = parts["parents"]  # numbered in its trie
        parts["parents"] = np.where(parents >= 0, parents - np.repeat(node0[:-1], k), -1)
        parts["seq_nodes"] -= np.repeat(node0[:-1], seqs)
        parts["seq_index"] += self.seqs_read
        sizes = {"weights": lay.sizes, "seq_index": seqs, "seq_nodes": seqs,
                 "seq_mask": np.diff(offsets_of(lay.lengths)[lay.seq_bounds])}  # fmt: skip
        cut = {n: np.split(v, np.cumsum(sizes.get(n, k))[:-1]) for n, v in parts.items()}
        windows = np.split(tokens, np.cumsum(lay.sizes + k)[:-1])
        self.docs_read += table.num_rows
        self.seqs_read += len(groups)
        return [
            Example(windows[t], cut["weights"][t], "", 0, first, first_example,
                    {n: v[t] for n, v in cut.items()} | {"carried": carried[seq0[t] : seq0[t + 1]]})
            for t in range(len(lay.sizes))
        ]  # fmt: skip

    def _examples(self, table: pa.Table, first_example: int) -> list[Example]:
        """The examples of ``table``'s documents (one each, or its ``long_ranges`` pieces)."""
        s, first = self.s, self.docs_read
        names = table.column_names
        if "input_ids" not in names and s.text_field not in names and not sft_columns(names):
            raise InvalidInput(
                f"{s.name} row {first} has neither input_ids nor {s.text_field!r} (columns"
                f" {sorted(names)}) — pass text_field= naming its text column"
            )
        origin = Origin(((s.name, -first, "row"),))
        chunk = chunk_from_arrow(
            table, origin, tokenizer=s.tokenizer, text_field=s.text_field,
            partition=s.partition, objective=s.objective,
        ).rebased(first)  # fmt: skip
        chunk.check_vocabulary(self.binding.vocab_size)
        counts = chunk.counts
        self.docs_read += len(chunk)
        long = np.flatnonzero(counts - 1 > s.pair_capacity)
        if long.size and (not s.cut_long or is_sft(table)):
            i = int(long[0])
            what = f"{origin.locate(i)} (id {chunk.id_of(i)!r})"
            if s.cut_long:
                refuse_cut_sft(what)
            unit = "tokens (format trl counts tokens)" if s.count_tokens else "prediction pairs"
            raise OversizedExample(
                f"{what} has {int(counts[i]) - (0 if s.count_tokens else 1)} {unit}; capacity"
                f" is {s.capacity} — raise max_length= or pass cut_long=True"
            )
        doc, starts, ends = long_ranges(counts, s.pair_capacity)
        out = []
        for d, a, b in zip(doc.tolist(), starts.tolist(), ends.tolist(), strict=True):
            lo = int(chunk.offsets[d])
            if chunk.flags is None:
                flags = np.ones(b - a - 1, dtype=bool)
            else:
                flags = np.asarray(chunk.flags[lo - d + a : lo - d + b - 1], dtype=bool)
            first_piece = first_example + int(np.searchsorted(doc, d))
            window = np.asarray(chunk.tokens[lo + a : lo + b], dtype=np.int32)
            out.append(Example(window, flags, chunk.id_of(d), a, first + d, first_piece))
        return out

    def push(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Read up to ``chunk`` documents and push their examples; finish at the end. The
        placements closed (example, row, start; int64 [k], in (row, start) order)."""
        first = self.packer.examples_pushed
        examples, read = self.read(self.s.chunk, first)
        check_segment_namespace(first + len(examples))
        placed = NO_PLACEMENTS
        if examples:
            pieces = np.array([e.size for e in examples], dtype=np.int64)
            placed = tuple(self.packer.push(pieces + int(self.s.count_tokens)))
            self.pending.update(zip(range(first, first + len(examples)), examples, strict=True))
        if read < self.s.chunk:
            done = tuple(self.packer.finish())
            placed = tuple(np.concatenate(p) for p in zip(placed, done, strict=True))
            self.source_done = True
        return placed

    def rows(self, placed: tuple, rows: np.ndarray, first_row: int) -> CompactRows:
        """Global ``rows`` (ascending) of the placements ``placed``, as compact rows (forest
        rows where a unit is a trie: its nodes the occurrences, as
        :func:`~exactpack.core.compact.gather_rows` lays a trie out)."""
        example, row, start = placed
        take = np.flatnonzero(np.isin(row, rows))  # already in (row, start) order
        local = np.searchsorted(rows, row[take])
        exs = [self.pending[e] for e in example[take].tolist()]
        offsets = np.searchsorted(local, np.arange(rows.size + 1, dtype=np.int64))
        fields = (_forest if self.s.tree else _flat)(exs, start[take], offsets, example[take])
        return CompactRows(
            tokens=np.concatenate([np.zeros(0, np.int32)] + [e.window for e in exs]),
            capacity=self.s.capacity,
            partition=self.s.partition,
            binding=self.binding,
            first_row=first_row,
            **fields,
        )


def _flat(exs: list[Example], starts: np.ndarray, offsets: np.ndarray, ordinals: np.ndarray):
    """:class:`CompactRows` fields of examples placed at ``starts``."""
    lengths = np.array([e.size for e in exs], dtype=np.int64)
    ids = np.array([e.source_id for e in exs], dtype=object)
    range_starts = np.array([e.start for e in exs], dtype=np.int64)
    range_ends = range_starts + lengths + 1
    names = [f"{s}[{a}:{b}]" for s, a, b in zip(ids, range_starts, range_ends, strict=True)]
    return {
        "loss_mask": np.concatenate([np.zeros(0, bool)] + [e.loss_mask for e in exs]),
        "lengths": lengths,
        "starts": starts,
        "row_offsets": offsets.astype(np.int64),
        "ordinals": ordinals,
        "source_ids": ids,
        "example_ids": np.array(names, dtype=object),
        "range_starts": range_starts,
        "range_ends": range_ends,
    }


def _forest(exs: list[Example], starts: np.ndarray, offsets: np.ndarray, ordinals: np.ndarray):
    """:class:`CompactRows` fields of tries placed at ``starts``: their nodes numbered on."""
    nodes = [e.nodes for e in exs]
    k = np.array([len(n["lengths"]) for n in nodes], dtype=np.int64)  # nodes per trie
    base = offsets_of(k)

    def cat(name: str, dtype: Any = np.int64) -> np.ndarray:
        return np.concatenate([np.zeros(0, dtype)] + [n[name] for n in nodes])

    parents = cat("parents")
    seqs = [len(n["seq_index"]) for n in nodes]
    return {
        "lengths": cat("lengths"),
        "starts": np.repeat(starts, k) + cat("starts"),
        "row_offsets": base[offsets],
        "ordinals": np.repeat(ordinals, k),
        "parents": np.where(parents >= 0, parents + np.repeat(base[:-1], k), -1),
        "depths": cat("depths"),
        "weights": np.concatenate([np.zeros(0, np.int32)] + [e.loss_mask for e in exs]),
        "seq_index": cat("seq_index"),
        "seq_nodes": cat("seq_nodes") + np.repeat(base[:-1], seqs),
        "seq_mask": cat("seq_mask", bool),
    }
