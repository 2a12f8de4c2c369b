"""The permission predicate and every view derived from it.

``allowed_key(row, q, k)`` is the one specification: both cells hold an
input, both belong to the same occurrence segment, and the key's local
position is no later than the query's. Each view below (key ranges,
``cu_seqlens``, ``position_ids``, the dense mask, the edge inventory, the
tiled traversal) is computed from the batch's arrays and tested against the
predicate on random layouts.

Fixture row 0 (A at columns 0-2, B at 3-4, padding at 5), permitted keys::

    q\\k 0 1 2 3 4 5
    0    1 . . . . .
    1    1 1 . . . .
    2    1 1 1 . . .
    3    . . . 1 . .      B's first query: range [3, 4)
    4    . . . 1 1 .      B's second query: range [3, 5)
    5    . . . . . .      padding: no edge, zero mixture
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from seqpack.core.errors import InvalidInput

if TYPE_CHECKING:
    from seqpack.core.batch import PackedBatch


def allowed_key(batch: PackedBatch, row: int, query: int, key: int) -> bool:
    """True when ``query`` may attend to ``key`` in ``row`` (coordinates checked)."""
    rows, width = batch.shape
    for name, value, limit in (("row", row, rows), ("query", query, width), ("key", key, width)):
        if not 0 <= value < limit:
            raise InvalidInput(
                f"attention coordinate {name}={value} is outside this batch of shape {batch.shape}"
            )
    valid = batch.input_valid
    return bool(
        valid[row, query]
        and valid[row, key]
        and batch.segments[row, query] == batch.segments[row, key]
        and batch.positions[row, key] <= batch.positions[row, query]
    )


@dataclass(frozen=True)
class KeyRanges:
    """Per-query key range ``[starts, ends)``, int64 [R, T], and per-row valid length [R].

    A real query at column ``q`` of a segment starting at column ``s`` has
    ``[s, q+1)``; a padding query has the empty range ``[q, q)``.
    """

    starts: np.ndarray
    ends: np.ndarray
    row_lengths: np.ndarray

    def get(self, row: int, query: int) -> tuple[int, int] | None:
        s, e = int(self.starts[row, query]), int(self.ends[row, query])
        return None if s == e else (s, e)


def key_ranges(batch: PackedBatch) -> KeyRanges:
    rows, width = batch.shape
    cols = np.broadcast_to(np.arange(width, dtype=np.int64), (rows, width))
    valid = batch.input_valid
    seg_start = cols - batch.positions.astype(np.int64)  # occurrences are contiguous
    starts = np.where(valid, seg_start, cols)
    ends = np.where(valid, cols + 1, cols)
    return KeyRanges(starts, ends, valid.sum(axis=1).astype(np.int64))


@dataclass(frozen=True)
class CuSeqlens:
    """flash-attn varlen metadata over the valid cells, in row-major order.

    ``cu_seqlens`` int32 [S+1] (cumulative segment lengths, padding
    excluded), ``max_seqlen`` int, ``valid_index`` int64 [Σl] (flat cell
    indices into ``[R*T]`` that gather the packed tokens), ``segment_rows``
    int64 [S] (the row each segment lives in).
    """

    cu_seqlens: np.ndarray
    max_seqlen: int
    valid_index: np.ndarray
    segment_rows: np.ndarray


def cu_seqlens(batch: PackedBatch) -> CuSeqlens:
    flat_valid = batch.input_valid.reshape(-1)
    valid_index = np.flatnonzero(flat_valid).astype(np.int64)
    starts = valid_index[batch.positions.reshape(-1)[valid_index] == 0]
    n_valid = valid_index.shape[0]
    # Position of each segment start within the gathered valid tokens.
    first = np.searchsorted(valid_index, starts)
    cu = np.append(first, n_valid).astype(np.int32)
    lens = np.diff(cu)
    max_len = int(lens.max()) if lens.size else 0
    return CuSeqlens(cu, max_len, valid_index, starts // batch.shape[1])


def position_ids(batch: PackedBatch) -> np.ndarray:
    """Hugging Face style ``position_ids``, int64 [R, T]: local positions, 0 on padding."""
    return np.where(batch.input_valid, batch.positions, 0).astype(np.int64)


def dense_mask(batch: PackedBatch) -> np.ndarray:
    """Boolean mask [R, T, T] (True = permitted), for SDPA and eager attention."""
    valid = batch.input_valid
    seg = batch.segments
    pos = batch.positions
    same = seg[:, :, None] == seg[:, None, :]
    causal = pos[:, None, :] <= pos[:, :, None]
    return same & causal & valid[:, :, None] & valid[:, None, :]


def edges(batch: PackedBatch) -> np.ndarray:
    """Permitted edges ``(row, query, key)`` in query order, int64 [E, 3]."""
    r, q, k = np.nonzero(dense_mask(batch))
    return np.stack([r, q, k], axis=1).astype(np.int64)


def tiled_edges(batch: PackedBatch, tile_width: int = 2) -> np.ndarray:
    """The same edges visited tile by tile (query tile, then key tile), int64 [E, 3].

    A different traversal order of one relation: sorted, it equals :func:`edges`.
    """
    if tile_width < 1:
        raise InvalidInput(f"tile_width must be positive, got {tile_width}")
    rows, width = batch.shape
    out = []
    for row in range(rows):
        for q0 in range(0, width, tile_width):
            for k0 in range(0, width, tile_width):
                for q in range(q0, min(q0 + tile_width, width)):
                    for k in range(k0, min(k0 + tile_width, width)):
                        if allowed_key(batch, row, q, k):
                            out.append((row, q, k))
    return np.asarray(out, dtype=np.int64).reshape(-1, 3)
