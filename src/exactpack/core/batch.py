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
from exactpack.core.examples import spread

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
    ``first_row``: the global index of row 0 in its epoch."""

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

    @classmethod
    def from_cells(
        cls,
        cells: tuple[np.ndarray, ...],
        occurrences: Occurrences,
        partition: Split,
        binding: Binding,
        first_row: int = 0,
    ) -> PackedBatch:
        """A batch from :func:`fill_cells`' six arrays (target validity: input validity)."""
        inputs, targets, segments, positions, valid, loss_mask = cells
        return cls(inputs, targets, segments, positions, valid, valid.copy(), loss_mask,
                   occurrences, partition, binding, first_row)  # fmt: skip

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.inputs.shape[0]), int(self.inputs.shape[1]))

    @property
    def valid(self) -> np.ndarray:
        """Cells that hold a real query/key: input and target exist, bool [R, T]."""
        return self.input_valid & self.target_valid

    @property
    def eligible_count(self) -> int:
        """N: targets that count in the loss."""
        return int(self.loss_mask.sum())

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, n).nbytes for n in CELL_FIELDS) + self.occurrences.nbytes

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
) -> tuple[np.ndarray, ...]:
    """Padded cells ``inputs, targets, segments, positions, valid, loss_mask`` [rows,
    capacity]: occurrence ``i`` fills ``[start[i], start[i] + lens[i])`` of row ``row[i]``
    from ``tokens[token_starts[i]:]``, segment ``segment[i]``, the next ``lens[i]`` flags."""
    inputs, targets = np.full((2, *shape), PAD_CELL, dtype=np.int32)
    segments = np.full(shape, NO_SEGMENT, dtype=np.int32)
    positions = np.zeros(shape, dtype=np.int32)
    valid, loss_mask = np.zeros((2, *shape), dtype=bool)
    if int(lens.sum()):
        owner, local = spread(lens)  # occurrence and position of each cell
        dest = (row * shape[1] + start)[owner] + local  # flat cell index
        src = token_starts[owner] + local  # index into tokens
        inputs.flat[dest] = tokens[src]
        targets.flat[dest] = tokens[src + 1]
        segments.flat[dest] = segment[owner]
        positions.flat[dest] = local
        valid.flat[dest] = True
        loss_mask.flat[dest] = flags
    return inputs, targets, segments, positions, valid, loss_mask
