"""Compact rows: a plan's occurrences in storage order, without padding.

What the pipeline materialises, the Parquet store writes and the loader
reads back. A row holds its occurrences' *windows* (``len + 1`` tokens each,
so inputs and targets both come from them) back to back; the column where
each occurrence starts is kept, so the padded :class:`PackedBatch` is rebuilt
exactly. The fixture (capacity 6, next-fit)::

    row 0: tokens [0 99 100 1 | 0 101 1]   lengths [3, 2]  starts [0, 3]
    row 1: tokens [0 102 103 104 1]        lengths [4]     starts [0]

Struct of arrays, per occurrence [k] in storage order (row, column) and per
token; the gather is one pass (a numba kernel when :mod:`seqpack.core.engine` has numba,
else chunked NumPy).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from seqpack.core import engine
from seqpack.core.batch import IGNORE_INDEX, Occurrences, PackedBatch, fill_cells
from seqpack.core.binding import Binding, Partition
from seqpack.core.config import check_segment_namespace
from seqpack.core.errors import InvalidInput
from seqpack.core.examples import ExampleTable, concat_ranges
from seqpack.core.plan import Plan

#: Tokens gathered per NumPy chunk when numba is missing (bounds the int64 index).
GATHER_CHUNK = 1 << 22


@dataclass(frozen=True, eq=False)
class CompactRows:
    """Rows ``first_row .. first_row + num_rows - 1`` of a packing, unpadded.

    Per occurrence, shape [k]: ``lengths`` (prediction pairs), ``starts``
    (column), ``ordinals`` (index among the packed examples = segment id),
    ``source_ids``/``example_ids`` (str), ``range_starts``/``range_ends``.
    ``row_offsets`` int64 [rows+1]: row ``r`` holds occurrences
    ``row_offsets[r]:row_offsets[r+1]``. Per token: ``tokens`` int32
    [Σ(len+1)] (windows), ``loss_mask`` bool [Σlen] (supervised targets).
    """

    tokens: np.ndarray
    loss_mask: np.ndarray
    lengths: np.ndarray
    starts: np.ndarray
    row_offsets: np.ndarray
    ordinals: np.ndarray
    source_ids: np.ndarray
    example_ids: np.ndarray
    range_starts: np.ndarray
    range_ends: np.ndarray
    capacity: int
    partition: Partition
    binding: Binding
    first_row: int = 0

    @property
    def num_rows(self) -> int:
        return int(self.row_offsets.shape[0] - 1)

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def token_offsets(self) -> np.ndarray:
        """Window ``i`` is ``tokens[token_offsets[i]:token_offsets[i+1]]``, int64 [k+1]."""
        out = np.zeros(self.lengths.shape[0] + 1, dtype=np.int64)
        np.cumsum(self.lengths + 1, out=out[1:])
        return out

    @property
    def target_offsets(self) -> np.ndarray:
        """Flags of occurrence ``i`` are ``loss_mask[target_offsets[i]:...[i+1]]``, int64 [k+1]."""
        out = np.zeros(self.lengths.shape[0] + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=out[1:])
        return out

    def labels(self, use_numba: bool = True) -> np.ndarray:
        """HF-style labels aligned with ``tokens`` (see :func:`window_labels`)."""
        return window_labels(self.tokens, self.loss_mask, self.lengths, use_numba)

    @property
    def row_of(self) -> np.ndarray:
        """Local row of each occurrence, int64 [k]."""
        return np.repeat(np.arange(self.num_rows, dtype=np.int64), np.diff(self.row_offsets))

    def slice_rows(self, start: int, stop: int) -> CompactRows:
        """Rows ``[start, stop)`` (local numbering) as views."""
        o0, o1 = int(self.row_offsets[start]), int(self.row_offsets[stop])
        tok = self.token_offsets
        return replace(
            self,
            tokens=self.tokens[tok[o0] : tok[o1]],
            loss_mask=self.loss_mask[tok[o0] - o0 : tok[o1] - o1],
            lengths=self.lengths[o0:o1],
            starts=self.starts[o0:o1],
            row_offsets=self.row_offsets[start : stop + 1] - o0,
            ordinals=self.ordinals[o0:o1],
            source_ids=self.source_ids[o0:o1],
            example_ids=self.example_ids[o0:o1],
            range_starts=self.range_starts[o0:o1],
            range_ends=self.range_ends[o0:o1],
            first_row=self.first_row + start,
        )

    def to_batch(self) -> PackedBatch:
        """These rows as one padded model call, identical to :func:`seqpack.materialize`'s."""
        cells = fill_cells(
            (self.num_rows, self.capacity),
            self.row_of,
            self.starts,
            self.lengths,
            self.ordinals,
            self.tokens,
            self.token_offsets,
            self.loss_mask,
        )
        occurrences = Occurrences.placed(
            self.ordinals,
            self.row_of,
            self.starts,
            self.lengths,
            self.source_ids,
            self.example_ids,
            self.range_starts,
            self.range_ends,
        )
        return PackedBatch.from_cells(
            cells, occurrences, self.partition, self.binding, self.first_row
        )

    def batches(self, max_rows_per_batch: int) -> Iterator[PackedBatch]:
        """Model calls of ``max_rows_per_batch`` rows (the last keeps its real count)."""
        for first in range(0, self.num_rows, max_rows_per_batch):
            yield self.slice_rows(first, min(first + max_rows_per_batch, self.num_rows)).to_batch()


@engine.kernel
def gather_loop(src, starts, lens, out):  # pragma: no cover - compiled by numba
    # Unsigned indices let LLVM drop the negative-index wraparound and vectorise the copy
    # (about 4x faster than slice assignment; near memcpy speed).
    pos = np.uint64(0)
    for i in range(starts.shape[0]):
        s = np.uint64(starts[i])
        n = np.uint64(lens[i])
        for j in range(n):
            out[pos + j] = src[s + j]
        pos += n


@engine.kernel
def labels_loop(tokens, mask, lens, out):  # pragma: no cover - compiled by numba
    one = np.uint64(1)  # keep every index unsigned (uint64 + int64 would be float64)
    p = np.uint64(0)
    q = np.uint64(0)
    for i in range(lens.shape[0]):
        n = np.uint64(lens[i])
        out[p] = IGNORE_INDEX
        for j in range(n):
            out[p + one + j] = tokens[p + one + j] if mask[q + j] else IGNORE_INDEX
        p += n + one
        q += n


def window_labels(
    tokens: np.ndarray, loss_mask: np.ndarray, lengths: np.ndarray, use_numba: bool = True
) -> np.ndarray:
    """HF-style labels for windows back to back, int32 [Σ(len+1)].

    Window ``i`` has ``lengths[i] + 1`` tokens and ``lengths[i]`` flags; its
    label is the token where that token's pair is supervised, and
    :data:`IGNORE_INDEX` otherwise and on its first token (no pair predicts it).
    """
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    out = np.empty(tokens.shape[0], dtype=np.int32)
    kernel = engine.compiled("labels_loop") if use_numba else None
    if kernel is not None:
        kernel(tokens, loss_mask, lengths, out)
        return out
    firsts = np.zeros(lengths.shape[0], dtype=np.int64)
    np.cumsum(lengths[:-1] + 1, out=firsts[1:])
    supervised = np.zeros(tokens.shape[0], dtype=bool)
    keep = np.ones(tokens.shape[0], dtype=bool)
    keep[firsts] = False
    supervised[keep] = loss_mask
    np.copyto(out, np.where(supervised, tokens, IGNORE_INDEX))
    return out


def gather_segments(
    src: np.ndarray, starts: np.ndarray, lens: np.ndarray, use_numba: bool = True
) -> np.ndarray:
    """Concatenate ``src[starts[i]:starts[i]+lens[i]]`` for every ``i`` (one output array).

    Memory: the output plus, without numba, an int64 index of at most
    :data:`GATHER_CHUNK` entries at a time.
    """
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    lens = np.ascontiguousarray(lens, dtype=np.int64)
    out = np.empty(int(lens.sum()), dtype=src.dtype)
    kernel = engine.compiled("gather_loop") if use_numba else None
    if kernel is not None:
        kernel(np.ascontiguousarray(src), starts, lens, out)
        return out
    ends = np.cumsum(lens)
    cut = np.searchsorted(ends, np.arange(GATHER_CHUNK, out.shape[0], GATHER_CHUNK), "left")
    bounds = np.unique(np.concatenate([[0], cut, [lens.shape[0]]]))
    pos = 0
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        index = concat_ranges(starts[a:b], lens[a:b])
        out[pos : pos + index.shape[0]] = src[index]
        pos += index.shape[0]
    return out


def _gather_flags(
    table: ExampleTable, order: np.ndarray, lengths: np.ndarray, use_numba: bool
) -> np.ndarray:
    """Loss flags in storage order; uniform flags (all supervised) need no gather."""
    flags = table.loss_mask
    if flags.size == 0 or flags.all() or not flags.any():
        return flags
    return gather_segments(flags, table.target_offsets[order], lengths, use_numba)


def compact_rows(table: ExampleTable, plan: Plan, use_numba: bool = True) -> CompactRows:
    """Materialise ``plan`` over ``table`` as compact rows (storage order, no padding).

    Memory: one copy of the windows and flags plus per-occurrence arrays; when
    the plan keeps the supplied order (next-fit, padded) the windows, flags and
    per-example arrays of ``table`` and ``plan`` are shared, not copied, and
    uniform flags (every target supervised) are always shared.
    """
    n = len(table)
    if plan.lengths.shape[0] != n or not np.array_equal(plan.lengths, table.lengths):
        raise InvalidInput("plan lengths do not match the examples supplied")
    check_segment_namespace(n)
    # One unique int64 key per placement sorts faster than lexsort((start, row)).
    key = plan.row_of * plan.capacity + plan.start_of
    if bool(np.all(key[1:] > key[:-1])):  # already in storage order: share, do not gather
        del key
        order = np.arange(n, dtype=np.int64)
        rows, lengths, starts = plan.row_of, plan.lengths, plan.start_of
        tokens, mask = table.windows, table.loss_mask
        sources, examples = table.source_ids, table.example_ids
        range_starts, range_ends = table.range_starts, table.range_ends
    else:
        order = np.argsort(key).astype(np.int64, copy=False)
        del key
        rows, lengths, starts = plan.row_of[order], plan.lengths[order], plan.start_of[order]
        tokens = gather_segments(table.windows, table.offsets[order], lengths + 1, use_numba)
        mask = _gather_flags(table, order, lengths, use_numba)
        sources = table.source_ids[order]
        same = table.example_ids is table.source_ids
        examples = sources if same else table.example_ids[order]
        range_starts, range_ends = table.range_starts[order], table.range_ends[order]
    row_offsets = np.searchsorted(rows, np.arange(plan.num_rows + 1, dtype=np.int64))
    return CompactRows(
        tokens=tokens,
        loss_mask=mask,
        lengths=lengths,
        starts=starts,
        row_offsets=row_offsets.astype(np.int64, copy=False),
        ordinals=order,
        source_ids=sources,
        example_ids=examples,
        range_starts=range_starts.astype(np.int64, copy=False),
        range_ends=range_ends.astype(np.int64, copy=False),
        capacity=plan.capacity,
        partition=table.partition,
        binding=table.binding,
    )
