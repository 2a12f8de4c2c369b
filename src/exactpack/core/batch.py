"""The packed batch: the single source of truth every view is derived from.

The fixture (A=[0,99,100,1], B=[0,101,1], C=[0,102,103,104,1], capacity 6, next-fit)::

    column      0    1    2    3    4    5
    inputs    [ 0,  99, 100,   0, 101,  -1]   [  0, 102, 103, 104, -1, -1]
    targets   [99, 100,   1, 101,   1,  -1]   [102, 103, 104,   1, -1, -1]
    segments  [ 0,   0,   0,   1,   1,  -1]   [  2,   2,   2,   2, -1, -1]
    positions [ 0,   1,   2,   0,   1,   0]   [  0,   1,   2,   3,  0,  0]

``PAD_CELL = -1`` marks an empty cell (never a vocabulary id), ``NO_SEGMENT = -1`` its
segment, position 0. B's queries at columns 3 and 4 may use keys ``[3,4)`` and ``[3,5)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from exactpack.core import permission
from exactpack.core.binding import Binding, Split
from exactpack.core.examples import concat_ranges, offsets_of, spread

PAD_CELL = -1
NO_SEGMENT = -1
#: The label of a target outside the loss (PyTorch's ``cross_entropy`` ``ignore_index`` and
#: the Hugging Face ``labels`` convention); also every window's first token.
IGNORE_INDEX = -100
#: The per-cell arrays of a :class:`PackedBatch`, each of shape [rows, capacity].
CELL_FIELDS = (
    "inputs",
    "targets",
    "segments",
    "positions",
    "input_valid",
    "target_valid",
    "loss_mask",
)


@dataclass(frozen=True, eq=False)
class Occurrences:
    """Per occurrence, storage order, [k]: ``ordinal`` (int64, index among the supplied
    examples), ``row`` (batch-local), ``col_start``/``col_end``, ``segment`` (int32),
    ``source_ids``/``example_ids`` (str), ``range_starts``/``range_ends`` (the span)."""

    ordinal: np.ndarray
    row: np.ndarray
    col_start: np.ndarray
    col_end: np.ndarray
    segment: np.ndarray
    source_ids: np.ndarray
    example_ids: np.ndarray
    range_starts: np.ndarray
    range_ends: np.ndarray

    def __len__(self) -> int:
        return int(self.ordinal.shape[0])

    @property
    def lengths(self) -> np.ndarray:
        """Cells of each occurrence, int64 [k]."""
        return (self.col_end - self.col_start).astype(np.int64)

    @property
    def nbytes(self) -> int:
        ids = 8 * (self.source_ids.shape[0] + self.example_ids.shape[0])
        arrays = (self.ordinal, self.row, self.col_start, self.col_end, self.segment)
        ranges = self.range_starts.nbytes + self.range_ends.nbytes
        return sum(a.nbytes for a in arrays) + ranges + ids

    def records(self) -> list[dict[str, Any]]:
        """Plain dicts for JSON: ordinal, row, columns, segment, source_id, example_id, range."""
        return [
            {
                "ordinal": int(self.ordinal[i]),
                "row": int(self.row[i]),
                "columns": [int(self.col_start[i]), int(self.col_end[i])],
                "segment": int(self.segment[i]),
                "source_id": str(self.source_ids[i]),
                "example_id": str(self.example_ids[i]),
                "range": [int(self.range_starts[i]), int(self.range_ends[i])],
            }
            for i in range(len(self))
        ]


@dataclass(frozen=True, eq=False)
class PackedBatch:
    """One model call, cell arrays [rows, capacity]: ``inputs``/``targets`` int32
    (``PAD_CELL`` on padding), ``segments`` int32 (``NO_SEGMENT``), ``positions`` int32
    (local, 0 on padding), ``input_valid``/``target_valid``/``loss_mask`` bool;
    ``first_row``: the global index of row 0 in its epoch.

    Forest rows (:mod:`exactpack.core.tree`) are the same batch with the node fields set;
    ``None`` on flat rows, where every occurrence is a root node (``node_end = segment + 1``,
    ``weight = loss_mask``). A node is an occurrence: ``segments`` hold its index [M] in
    ``occurrences``; ``node_ends`` int32 [R, T] the exit of a cell's node in pre-order
    (:func:`~exactpack.core.permission.permitted`), ``weights`` int32 [R, T] the sequences
    that supervise a cell's target, ``node_parent`` int64 [M] (-1: a root). Sequences [S],
    layout order: ``seq_index`` (index in the supplied sequences), ``seq_nodes`` (the node
    each ends at) and ``seq_loss_mask`` bool [Σ L] (:meth:`sequences`).
    """

    inputs: np.ndarray
    targets: np.ndarray
    segments: np.ndarray
    positions: np.ndarray
    input_valid: np.ndarray
    target_valid: np.ndarray
    loss_mask: np.ndarray
    occurrences: Occurrences
    partition: Split
    binding: Binding
    first_row: int = 0
    node_ends: np.ndarray | None = None
    weights: np.ndarray | None = None
    node_parent: np.ndarray | None = None
    seq_index: np.ndarray | None = None
    seq_nodes: np.ndarray | None = None
    seq_loss_mask: np.ndarray | None = None

    @classmethod
    def from_cells(
        cls,
        cells: tuple[np.ndarray, ...],
        occurrences: Occurrences,
        partition: Split,
        binding: Binding,
        first_row: int = 0,
        **forest: Any,
    ) -> PackedBatch:
        """A batch from :func:`fill_cells`' six arrays (target validity: input validity)
        and, for forest rows, the node fields."""
        inputs, targets, segments, positions, valid, loss_mask = cells
        return cls(inputs, targets, segments, positions, valid, valid.copy(), loss_mask,
                   occurrences, partition, binding, first_row, **forest)  # fmt: skip

    @property
    def is_tree(self) -> bool:
        """Whether these are forest rows (a node may have a parent)."""
        return self.node_parent is not None

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.inputs.shape[0]), int(self.inputs.shape[1]))

    @property
    def valid(self) -> np.ndarray:
        """Cells that hold a real query/key: input and target exist, bool [R, T]."""
        return self.input_valid & self.target_valid

    @property
    def eligible_count(self) -> int:
        """N: supervised targets of the examples (``Σ weights``; flat: ``Σ loss_mask``)."""
        return int((self.loss_mask if self.weights is None else self.weights).sum())

    @property
    def longest(self) -> int:
        """Pairs of the longest example (on forest rows: of the longest sequence, its path's
        depth): the largest position + 1, for a model's conditions."""
        return int(self.positions.max(initial=-1, where=self.input_valid)) + 1

    @property
    def tokens_stored(self) -> int:
        return int(self.input_valid.sum())

    @property
    def tokens_flat(self) -> int:
        """Cells flat packing would store for the same sequences."""
        return int(self.sequences()[1][-1])

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, n).nbytes for n in CELL_FIELDS) + self.occurrences.nbytes

    def node_paths(self) -> tuple[np.ndarray, np.ndarray]:
        """Per node (occurrence): the flat cells ``row * T + column`` of its path (its
        ancestors' cells root first, then its own) as ``(cells, bounds)``, int64 [Σ P] and
        [M+1]; a flat row's node is its own path."""
        occ, lens = self.occurrences, self.occurrences.lengths
        first = occ.row.astype(np.int64) * self.shape[1] + occ.col_start
        if not self.is_tree:
            return concat_ranges(first, lens), offsets_of(lens)
        paths: list[list[int]] = []
        for n, parent in enumerate(self.node_parent.tolist()):  # type: ignore[union-attr]
            paths.append([*paths[parent], n] if parent >= 0 else [n])  # parents come first
        order = np.fromiter((a for path in paths for a in path), dtype=np.int64)
        sizes = np.fromiter(map(len, paths), dtype=np.int64, count=len(paths))
        path_len = np.add.reduceat(lens[order], offsets_of(sizes)[:-1]) if paths else lens
        return concat_ranges(first[order], lens[order]), offsets_of(path_len)

    def sequences(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(cells, bounds, supervised)``: every sequence's flat cells ``row * T + column``
        int64 [Σ L] (depth order), ``bounds`` int64 [S + 1] into them, ``supervised`` bool
        [Σ L]. A flat row's sequences are its occurrences, in storage order."""
        cells, bounds = self.node_paths()
        if not self.is_tree:
            return cells, bounds, self.loss_mask.reshape(-1)[cells]
        lo, hi = bounds[self.seq_nodes], bounds[self.seq_nodes + 1]  # type: ignore[index,operator]
        seq_cells = cells[concat_ranges(lo, hi - lo)]
        return seq_cells, offsets_of(hi - lo), self.seq_loss_mask  # type: ignore[return-value]

    def sequence_cells(self, i: int) -> np.ndarray:
        """Flat cell indices of sequence ``i`` (:meth:`sequences` order), int64 [L]."""
        cells, bounds, _ = self.sequences()
        return cells[bounds[i] : bounds[i + 1]]

    # Permission views (exactpack.core.permission); sliding_window None: unbounded.
    def allowed_key(
        self, row: int, query: int, key: int, sliding_window: int | None = None
    ) -> bool:
        return permission.allowed_key(self, row, query, key, sliding_window)

    def key_ranges(self, sliding_window: int | None = None) -> permission.KeyRanges:
        return permission.key_ranges(self, sliding_window)

    def cu_seqlens(self) -> permission.CuSeqlens:
        return permission.cu_seqlens(self)

    def position_ids(self) -> np.ndarray:
        return permission.position_ids(self)

    def dense_mask(self, sliding_window: int | None = None) -> np.ndarray:
        return permission.dense_mask(self, sliding_window)

    def edges(self, sliding_window: int | None = None) -> np.ndarray:
        return permission.edges(self, sliding_window)

    def key_spans(
        self, row: int, query: int, sliding_window: int | None = None
    ) -> list[tuple[int, int]]:
        """The keys of one query as column spans ``[start, end)``: its ancestors' nodes, root
        first, then its own node up to itself, each clipped to the window; ``[]`` on padding."""
        window = permission.check_sliding_window(sliding_window)
        if not self.input_valid[row, query]:
            return []
        pos = int(self.positions[row, query])
        lowest = -(2**62) if window is None else pos - window + 1
        nodes = [(query - pos, query + 1)]  # a flat query's own node
        if self.is_tree:
            path, occ = [int(self.segments[row, query])], self.occurrences
            while self.node_parent[path[-1]] >= 0:  # type: ignore[index]
                path.append(int(self.node_parent[path[-1]]))  # type: ignore[index]
            nodes = [(int(occ.col_start[n]), int(occ.col_end[n])) for n in reversed(path)]
        spans = []
        for col, end in nodes:  # ancestors lie before the query in the row
            start = col + max(0, lowest - int(self.positions[row, col]))
            if start < min(end, query + 1):
                spans.append((start, min(end, query + 1)))
        return spans

    def rows_as_dicts(self) -> list[dict[str, list[Any]]]:
        """Per row: inputs, targets, segments, positions and the three validity fields."""
        return [
            {n: getattr(self, n)[r].tolist() for n in CELL_FIELDS} for r in range(self.shape[0])
        ]


def fill_cells(
    shape: tuple[int, int],
    row: np.ndarray,
    start: np.ndarray,
    lens: np.ndarray,
    segment: np.ndarray,
    tokens: np.ndarray,
    token_starts: np.ndarray,
    flags: np.ndarray,
    depths: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    """Padded cells ``inputs, targets, segments, positions, valid, loss_mask`` [rows,
    capacity]: occurrence ``i`` fills ``[start[i], start[i] + lens[i])`` of row ``row[i]``
    from ``tokens[token_starts[i]:]``, segment ``segment[i]``, positions from ``depths[i]``
    (None: 0), the next ``lens[i]`` flags (``loss_mask`` takes their dtype: a forest's
    weights)."""
    inputs, targets = np.full((2, *shape), PAD_CELL, dtype=np.int32)
    segments = np.full(shape, NO_SEGMENT, dtype=np.int32)
    positions = np.zeros(shape, dtype=np.int32)
    valid, loss_mask = np.zeros(shape, dtype=bool), np.zeros(shape, dtype=flags.dtype)
    if int(lens.sum()):
        owner, local = spread(lens)  # occurrence and position of each cell
        dest = (row * shape[1] + start)[owner] + local  # flat cell index
        src = token_starts[owner] + local  # index into tokens
        inputs.flat[dest] = tokens[src]
        targets.flat[dest] = tokens[src + 1]
        segments.flat[dest] = segment[owner]
        positions.flat[dest] = local if depths is None else depths[owner] + local
        valid.flat[dest] = True
        loss_mask.flat[dest] = flags
    return inputs, targets, segments, positions, valid, loss_mask
