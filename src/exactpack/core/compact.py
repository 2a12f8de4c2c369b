"""Compact rows: packed rows without padding, and the one gather that builds them.

:class:`CompactRows` is the one struct of arrays for packed rows, written and read
back alike. A row holds its occurrences' windows (``len + 1`` tokens each) back to
back and the column each starts at, so the padded :class:`PackedBatch` is rebuilt
exactly. The fixture (capacity 6, next-fit)::

    row 0: tokens [0 99 100 1 | 0 101 1]   lengths [3, 2]  starts [0, 3]
    row 1: tokens [0 102 103 104 1]        lengths [4]     starts [0]

:func:`gather_rows` builds rows ``[a, b)`` of a :class:`Storage` (a plan in storage order)
from a :class:`TokenSource`; every copy is :func:`gather_into` (C, else chunked NumPy).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from exactpack.core import engine
from exactpack.core.batch import IGNORE_INDEX, Occurrences, PackedBatch, fill_cells
from exactpack.core.binding import Binding, Split
from exactpack.core.config import PackConfig, check_segment_namespace, enforce, plan_metadata_bytes
from exactpack.core.errors import InvalidInput, SplitMismatch
from exactpack.core.examples import (
    ExampleTable,
    SequenceExample,
    concat_ranges,
    next_at_most,
    offsets_of,
)
from exactpack.core.plan import Plan
from exactpack.core.policies import plan_rows

#: Elements copied per NumPy step without the C kernels (bounds the int64 index arrays).
GATHER_CHUNK = 1 << 22


@dataclass(frozen=True, eq=False)
class CompactRows:
    """Rows ``first_row ..`` of a packing, unpadded: row ``r`` holds occurrences
    ``row_offsets[r]:row_offsets[r+1]`` (int64 [rows+1]); per occurrence [k] ``lengths``
    (pairs), ``starts`` (column), ``ordinals`` (segment id); ``tokens`` int32 [Σ(len+1)].
    None where derivable (:meth:`full`): ``loss_mask`` (all supervised), ``source_ids``
    (NumPy or Arrow; the ordinal's decimal), ``example_ids`` (the source ids),
    ``range_starts``/``range_ends`` (``[0, len + 1)``).

    Forest rows (:mod:`exactpack.core.tree`) set the node arrays, None on flat rows: an
    occurrence is a node (pre-order in its row), ``parents`` int64 [k] its parent's index
    among these occurrences (-1: a root), ``depths`` int64 [k] its first cell's position,
    ``weights`` int32 [Σ len] the sequences supervising each pair (``loss_mask``: > 0); per
    sequence [S] ``seq_index``, ``seq_nodes`` (the occurrence it ends at, non-decreasing)
    and ``seq_mask`` bool [Σ L] (its pairs' supervision, depth order).
    """

    tokens: np.ndarray
    lengths: np.ndarray
    starts: np.ndarray
    row_offsets: np.ndarray
    ordinals: np.ndarray
    capacity: int
    partition: Split
    binding: Binding
    loss_mask: np.ndarray | None = None
    source_ids: Any = None
    example_ids: Any = None
    range_starts: np.ndarray | None = None
    range_ends: np.ndarray | None = None
    first_row: int = 0
    parents: np.ndarray | None = None
    depths: np.ndarray | None = None
    weights: np.ndarray | None = None
    seq_index: np.ndarray | None = None
    seq_nodes: np.ndarray | None = None
    seq_mask: np.ndarray | None = None

    @property
    def num_rows(self) -> int:
        return int(self.row_offsets.shape[0] - 1)

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def token_offsets(self) -> np.ndarray:
        """Window ``i`` is ``tokens[token_offsets[i]:token_offsets[i+1]]``, int64 [k+1]."""
        return offsets_of(self.lengths + 1)

    @property
    def target_offsets(self) -> np.ndarray:
        """Flags of occurrence ``i`` are ``loss_mask[target_offsets[i]:...[i+1]]``, int64 [k+1]."""
        return offsets_of(self.lengths)

    @property
    def row_of(self) -> np.ndarray:
        """Local row of each occurrence, int64 [k]."""
        return np.repeat(np.arange(self.num_rows, dtype=np.int64), np.diff(self.row_offsets))

    def full(self) -> CompactRows:
        """These rows with every derivable part filled in (NumPy arrays)."""
        mask, starts, ends = self.loss_mask, self.range_starts, self.range_ends
        sources = _strings(self.source_ids, self.ordinals)
        same = self.example_ids is None or self.example_ids is self.source_ids
        if mask is None:
            mask = (
                np.ones(int(self.lengths.sum()), bool) if self.weights is None else self.weights > 0
            )
        return replace(
            self,
            loss_mask=mask,
            source_ids=sources,
            example_ids=sources if same else _strings(self.example_ids, None),
            range_starts=np.zeros(len(self), np.int64) if starts is None else starts,
            range_ends=self.lengths + 1 if ends is None else ends,
        )

    def labels(self, native: bool = True) -> np.ndarray:
        """HF-style labels aligned with ``tokens`` (see :func:`span_labels`)."""
        return span_labels(self.tokens, self.full().loss_mask, self.lengths, native)

    def slice_rows(self, start: int, stop: int) -> CompactRows:
        """Rows ``[start, stop)`` (local numbering) as views."""
        o0, o1 = int(self.row_offsets[start]), int(self.row_offsets[stop])
        t0, t1 = self.token_offsets[[o0, o1]]

        def cut(values: Any) -> Any:
            return None if values is None else values[o0:o1]

        sources = cut(self.source_ids)
        forest = {}
        if self.parents is not None:  # a row's nodes and sequences stay together
            s0, s1 = np.searchsorted(self.seq_nodes, [o0, o1])  # type: ignore[arg-type]
            ends = self.depths[self.seq_nodes] + self.lengths[self.seq_nodes]  # type: ignore[index]
            m0, m1 = offsets_of(ends)[[s0, s1]]
            forest = {
                "parents": np.where(self.parents[o0:o1] >= 0, self.parents[o0:o1] - o0, -1),
                "depths": cut(self.depths),
                "weights": self.weights[t0 - o0 : t1 - o1],  # type: ignore[index]
                "seq_index": self.seq_index[s0:s1],  # type: ignore[index]
                "seq_nodes": self.seq_nodes[s0:s1] - o0,  # type: ignore[index]
                "seq_mask": self.seq_mask[m0:m1],  # type: ignore[index]
            }
        return replace(
            self,
            tokens=self.tokens[t0:t1],
            loss_mask=None if self.loss_mask is None else self.loss_mask[t0 - o0 : t1 - o1],
            lengths=self.lengths[o0:o1],
            starts=self.starts[o0:o1],
            row_offsets=self.row_offsets[start : stop + 1] - o0,
            ordinals=self.ordinals[o0:o1],
            source_ids=sources,
            example_ids=sources if self.example_ids is self.source_ids else cut(self.example_ids),
            range_starts=cut(self.range_starts),
            range_ends=cut(self.range_ends),
            first_row=self.first_row + start,
            **forest,
        )

    def to_batch(self) -> PackedBatch:
        """These rows as one padded model call, identical to :func:`materialize`'s (forest
        rows: nodes numbered ``0..k-1``, their ends derived from ``parents``' pre-order)."""
        rows, tree = self.full(), self.parents is not None
        row_of, k = rows.row_of, len(self)
        segment = np.arange(k, dtype=np.int64) if tree else rows.ordinals
        cells = fill_cells(
            (rows.num_rows, rows.capacity), row_of, rows.starts, rows.lengths, segment,
            rows.tokens, rows.token_offsets, rows.loss_mask if rows.weights is None else
            rows.weights, rows.depths,
        )  # fmt: skip
        forest = {}
        if tree:  # a node's subtree ends at the next node of its row no deeper than it
            last = rows.depths + rows.lengths - 1  # type: ignore[operator]
            ids, ends = np.arange(k), rows.row_offsets[row_of + 1]
            node_end = np.append(next_at_most(rows.depths, last, ids + 1, ends), -1)
            weights = cells[5]
            cells = (*cells[:5], weights > 0)
            forest = {
                "node_ends": node_end[cells[2]].astype(np.int32),
                "weights": weights,
                "node_parent": rows.parents,
                "seq_index": rows.seq_index,
                "seq_nodes": rows.seq_nodes,
                "seq_loss_mask": rows.seq_mask,
            }
        starts, int64 = rows.starts.astype(np.int64), {"dtype": np.int64, "copy": False}
        occurrences = Occurrences(
            ordinal=rows.ordinals.astype(np.int64), row=row_of, col_start=starts,
            col_end=starts + rows.lengths, segment=segment.astype(np.int32),
            source_ids=rows.source_ids, example_ids=rows.example_ids,
            range_starts=rows.range_starts.astype(**int64),
            range_ends=rows.range_ends.astype(**int64),
        )  # fmt: skip
        return PackedBatch.from_cells(
            cells, occurrences, rows.partition, rows.binding, rows.first_row, **forest
        )

    def batches(self, max_rows_per_batch: int) -> Iterator[PackedBatch]:
        """Model calls of ``max_rows_per_batch`` rows (the last keeps its real count)."""
        for first in range(0, self.num_rows, max_rows_per_batch):
            yield self.slice_rows(first, min(first + max_rows_per_batch, self.num_rows)).to_batch()


def _strings(values: Any, ordinals: np.ndarray | None) -> np.ndarray:
    """Ids as a NumPy object array (Arrow strings converted; None: the ordinals' decimal)."""
    if values is None:
        return ordinals.astype(str).astype(object)  # type: ignore[union-attr]
    if isinstance(values, np.ndarray):
        return values
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=object)


# ----------------------------------------------------------------- the gather


@engine.kernel
def scatter_loop(src, src_starts, lens, out, out_starts):  # pragma: no cover - the C twin runs
    for i in range(len(lens)):
        s = src_starts[i]
        d = out_starts[i]
        for j in range(lens[i]):
            out[d + j] = src[s + j]


def _native_ok(*arrays: np.ndarray) -> bool:
    """Whether the C kernels take these arrays: C-contiguous, native-order ints or bools."""
    return all(a.flags.c_contiguous and a.dtype.kind in "iub" and a.dtype.isnative for a in arrays)


def gather_into(
    src: np.ndarray,
    src_starts: np.ndarray,
    lens: np.ndarray,
    out: np.ndarray,
    out_starts: np.ndarray,
    native: bool = True,
) -> None:
    """Copy ``src[src_starts[i]:][:lens[i]]`` to ``out[out_starts[i]:][:lens[i]]`` for every
    ``i``, cast to ``out``'s dtype (``src`` may be a memory map; bounds unchecked)::

        src [5 6 7 8 9]   src_starts [3, 0]  lens [2, 1]  out_starts [1, 0]
        out [5 8 9]
    """
    src_starts = np.ascontiguousarray(src_starts, dtype=np.int64)
    lens = np.ascontiguousarray(lens, dtype=np.int64)
    out_starts = np.ascontiguousarray(out_starts, dtype=np.int64)
    kernel = engine.compiled("scatter_loop") if native and _native_ok(src, out) else None
    if kernel is not None:
        kernel(src, src_starts, lens, out, out_starts)
        return
    ends = np.cumsum(lens)
    cut = np.searchsorted(
        ends, np.arange(GATHER_CHUNK, int(ends[-1]) if ends.size else 0, GATHER_CHUNK)
    )
    bounds = np.unique(np.concatenate([[0], cut, [lens.shape[0]]]))
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        part = lens[a:b]
        out[concat_ranges(out_starts[a:b], part)] = src[concat_ranges(src_starts[a:b], part)]


def gather_segments(
    src: np.ndarray, starts: np.ndarray, lens: np.ndarray, native: bool = True
) -> np.ndarray:
    """Concatenate ``src[starts[i]:starts[i]+lens[i]]`` for every ``i`` (one output array)."""
    lens = np.ascontiguousarray(lens, dtype=np.int64)
    out_starts = offsets_of(lens)
    out = np.empty(int(out_starts[-1]), dtype=src.dtype)
    gather_into(np.ascontiguousarray(src), starts, lens, out, out_starts[:-1], native)
    return out


@engine.kernel
def labels_loop(tokens, mask, lens, out):  # pragma: no cover - the C twin runs
    p = 0
    q = 0
    for i in range(len(lens)):
        n = lens[i]
        out[p] = IGNORE_INDEX
        for j in range(n):
            out[p + 1 + j] = tokens[p + 1 + j] if mask[q + j] else IGNORE_INDEX
        p += n + 1
        q += n


def span_labels(
    tokens: np.ndarray, loss_mask: np.ndarray, lengths: np.ndarray, native: bool = True
) -> np.ndarray:
    """HF-style labels of windows back to back (``lengths[i] + 1`` tokens, ``lengths[i]``
    flags each), int32 [Σ(len+1)]: the token where its pair is supervised, else
    :data:`IGNORE_INDEX` (always on a window's first token)."""
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    out = np.empty(tokens.shape[0], dtype=np.int32)
    usable = native and _native_ok(tokens, loss_mask) and loss_mask.dtype == np.bool_
    kernel = engine.compiled("labels_loop") if usable else None
    if kernel is not None:
        kernel(tokens, loss_mask, lengths, out)
        return out
    firsts = offsets_of(lengths + 1)[:-1]
    keep = np.ones(tokens.shape[0], dtype=bool)
    keep[firsts] = False
    supervised = np.zeros(tokens.shape[0], dtype=bool)
    supervised[keep] = loss_mask
    # an int32 -100 (a bare -100 wraps to 65436 beside uint16 tokens under NumPy 2);
    # unsafe: uint64 tokens and int32 promote to float64, exact for any int32 id
    np.copyto(out, np.where(supervised, tokens, np.int32(IGNORE_INDEX)), casting="unsafe")
    return out


@engine.kernel
def range_loop(values, out):  # pragma: no cover - the C twin runs
    lo = values[0]
    hi = values[0]
    for i in range(len(values)):  # branch-free, so the compiler vectorises it
        lo = min(lo, values[i])
        hi = max(hi, values[i])
    out[0] = lo
    out[1] = hi


def value_range(values: np.ndarray, native: bool = True) -> tuple[int, int]:
    """``(min, max)`` of a non-empty integer array in one pass (two with NumPy only)."""
    usable = native and values.dtype.kind in "iu" and _native_ok(values) and values.size > 0
    kernel = engine.compiled("range_loop") if usable else None
    if kernel is None:
        return int(values.min()), int(values.max())
    out = np.zeros(2, dtype=np.int64 if values.dtype.kind == "i" else np.uint64)
    kernel(values, out)
    return int(out[0]), int(out[1])


# ----------------------------------------------------------------- plan -> rows


@dataclass(frozen=True, eq=False)
class Storage:
    """A plan in storage order: occurrence ``k`` is example ``order[k]``; row ``r`` holds
    occurrences ``row_offsets[r]:row_offsets[r+1]`` after ``row_tokens[r]`` tokens;
    ``kept``: ``order`` is ``0..n-1`` (next-fit, padded)."""

    plan: Plan
    order: np.ndarray
    row_offsets: np.ndarray
    row_tokens: np.ndarray
    kept: bool

    @classmethod
    def of(cls, plan: Plan, window_extra: int = 1) -> Storage:
        """``plan`` in storage order; an example planned as ``plan.lengths[i]`` holds
        ``plan.lengths[i] + window_extra`` tokens (1: lengths are pairs; 0: tokens)."""
        # one unique int64 key per placement sorts faster than lexsort((start, row))
        key = plan.row_of * plan.capacity + plan.start_of
        kept = bool(np.all(key[1:] > key[:-1]))
        n = key.shape[0]
        order = np.arange(n, dtype=np.int64) if kept else np.argsort(key).astype(np.int64)
        del key
        rows = plan.row_of if kept else plan.row_of[order]
        row_offsets = np.searchsorted(rows, np.arange(plan.num_rows + 1, dtype=np.int64))
        del rows
        tokens = offsets_of(plan.lengths[order] + window_extra)
        return cls(plan, order, row_offsets.astype(np.int64), tokens[row_offsets], kept)


class TokenSource(Protocol):
    """What :func:`gather_rows` reads: ``lengths`` int64 [n] (pairs); ``take(ex,
    contiguous)``: the windows of examples ``ex`` back to back (int32 [Σ(len+1)]) and the
    :class:`CompactRows` derivable fields it has (``contiguous``: ``ex`` is a run). A unit
    of several occurrences (a trie: :class:`~exactpack.core.tree.TrieSource`) gives their
    ``units`` (occurrences per unit), ``lengths`` and ``starts`` (from the unit's start)."""

    lengths: np.ndarray
    binding: Binding
    partition: Split

    def take(self, ex: np.ndarray, contiguous: bool) -> tuple[np.ndarray, dict[str, Any]]: ...


def gather_rows(source: TokenSource, storage: Storage, a: int, b: int) -> CompactRows:
    """Rows ``[a, b)`` of ``storage``'s plan, gathered from ``source``."""
    o0, o1 = int(storage.row_offsets[a]), int(storage.row_offsets[b])
    ex = storage.order[o0:o1]
    tokens, parts = source.take(ex, storage.kept)
    starts, row_offsets = storage.plan.start_of[ex], storage.row_offsets[a : b + 1] - o0
    fields = {"lengths": source.lengths[ex], "starts": starts, "ordinals": ex}
    if "units" in parts:  # a unit of several occurrences (a trie's nodes), from its start on
        unit = np.repeat(np.arange(ex.shape[0]), parts["units"])
        row_offsets = offsets_of(parts.pop("units"))[row_offsets]
        fields = {"lengths": parts.pop("lengths"), "starts": starts[unit] + parts.pop("starts"),
                  "ordinals": ex[unit]}  # fmt: skip
    return CompactRows(
        tokens=tokens,
        row_offsets=row_offsets,
        capacity=storage.plan.capacity,
        partition=source.partition,
        binding=source.binding,
        first_row=a,
        **fields,
        **parts,
    )


class TableSource:
    """An :class:`ExampleTable` as a :class:`TokenSource` (a contiguous run is views)."""

    def __init__(self, table: ExampleTable, native: bool = True) -> None:
        self.table, self.native = table, native
        self.lengths, self.binding, self.partition = table.lengths, table.binding, table.partition

    def take(self, ex: np.ndarray, contiguous: bool) -> tuple[np.ndarray, dict[str, Any]]:
        t = self.table
        if contiguous:
            lo, hi = (int(ex[0]), int(ex[-1]) + 1) if ex.size else (0, 0)
            sel: Any = slice(lo, hi)
            tokens = t.windows[t.offsets[lo] : t.offsets[hi]]
            mask = t.loss_mask[t.offsets[lo] - lo : t.offsets[hi] - hi]
        else:
            sel, lengths = ex, t.lengths[ex]
            tokens = gather_segments(t.windows, t.offsets[ex], lengths + 1, self.native)
            mask = t.loss_mask
            if mask.size and mask.any() and not mask.all():
                mask = gather_segments(mask, t.target_offsets[ex], lengths, self.native)
            else:  # uniform flags: any run of them is these rows' flags (a view)
                mask = mask[: int(lengths.sum())]
        ids = {n: getattr(t, n)[sel] for n in ("source_ids", "range_starts", "range_ends")}
        same = t.example_ids is t.source_ids
        ids["example_ids"] = ids["source_ids"] if same else t.example_ids[sel]
        ranges = {n: ids[n].astype(np.int64, copy=False) for n in ("range_starts", "range_ends")}
        return tokens, ids | ranges | {"loss_mask": mask}


def _check_plan(table: ExampleTable, plan: Plan) -> None:
    if plan.lengths.shape[0] != len(table) or not np.array_equal(plan.lengths, table.lengths):
        raise InvalidInput("plan lengths do not match the examples supplied")
    check_segment_namespace(len(table))


def compact_rows(table: ExampleTable, plan: Plan, native: bool = True) -> CompactRows:
    """``plan`` over ``table`` as compact rows: one copy of windows and flags, none when
    the plan keeps the supplied order (next-fit, padded); uniform flags are shared."""
    _check_plan(table, plan)
    return gather_rows(TableSource(table, native), Storage.of(plan), 0, plan.num_rows)


@dataclass(frozen=True, eq=False)
class PackedEpoch:
    """All model calls of one packing: ``batches`` in row order."""

    batches: list[PackedBatch]
    row_count: int
    occurrence_count: int
    metadata_peak: int
    plan: Plan


def materialize(table: ExampleTable, plan: Plan, config: PackConfig) -> PackedEpoch:
    """Lay ``table`` out as ``plan`` says, in model calls of ``config.max_rows_per_batch`` rows;
    the metadata budget is checked before any batch is allocated, each call gathered alone."""
    _check_plan(table, plan)
    if plan.capacity != config.capacity:
        raise InvalidInput(f"plan capacity {plan.capacity} != config capacity {config.capacity}")
    peak = plan_metadata_bytes(plan, config)
    enforce(peak, config.max_metadata_bytes)
    storage, source, per = Storage.of(plan), TableSource(table), config.max_rows_per_batch
    batches = [
        gather_rows(source, storage, a, min(a + per, plan.num_rows)).to_batch()
        for a in range(0, plan.num_rows, per)
    ]
    return PackedEpoch(batches, plan.num_rows, len(table), peak, plan)


def pack_examples(
    partition: Split | str,
    examples: Sequence[SequenceExample] | ExampleTable,
    expected_binding: Binding,
    config: PackConfig,
    *,
    policy: str = "next-fit",
    **policy_options: Any,
) -> PackedEpoch:
    """Pack whole examples of ``partition`` and ``expected_binding`` into rows of
    ``config.capacity`` pairs (an oversized one is an error naming it); occurrence ``i``
    gets segment id ``i``."""
    part = Split.parse(partition)
    if isinstance(examples, ExampleTable):
        table = examples
        if table.partition is not part:
            raise SplitMismatch(
                f"examples belong to partition {table.partition.value!r}, not {part.value!r}"
                " — a batch holds one partition only; pack them separately"
            )
        expected_binding.require(table.binding, "the example table")
    else:
        check_segment_namespace(len(examples))
        table = ExampleTable.from_examples(examples, part, expected_binding)
    plan = plan_rows(table.lengths, config.capacity, policy, labels=table.label, **policy_options)
    return materialize(table, plan, config)
