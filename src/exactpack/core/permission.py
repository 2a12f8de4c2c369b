"""The permission predicate and every view derived from it.

:func:`permitted` is the one specification, over broadcastable NumPy or torch arrays:
key ``k`` is allowed for query ``q`` iff both cells hold an input, ``k``'s node is an
ancestor-or-self of ``q``'s (``node[k] <= node[q] < node_end[k]``; flat: the same
segment) and ``0 <= pos[q] - pos[k] < sliding_window``. Every view and attention backend
uses it or its closed form :func:`key_bounds`.

Fixture row 0 (A at columns 0-2, B at 3-4, padding at 5), permitted keys::

    q\\k 0 1 2 3 4 5          sliding_window=2
    0    1 . . . . .          1 . . . . .
    1    1 1 . . . .          1 1 . . . .
    2    1 1 1 . . .          . 1 1 . . .    A's last query drops key 0
    3    . . . 1 . .          . . . 1 . .    B's first query: range [3, 4)
    4    . . . 1 1 .          . . . 1 1 .    B's second query: range [3, 5)
    5    . . . . . .          . . . . . .    padding: no edge, zero mixture
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from exactpack.core.errors import InvalidInput, is_int

if TYPE_CHECKING:
    from exactpack.core.batch import PackedBatch

#: A NumPy array or a torch tensor (``&``, ``==``, ``-``, ``<``, ``*``, ``.clip`` only).
Array = TypeVar("Array")


def check_sliding_window(sliding_window: Any) -> int | None:
    """``sliding_window`` as a positive int, or ``None`` (unbounded)."""
    if sliding_window is None:
        return None
    if not is_int(sliding_window) or sliding_window < 1:
        raise InvalidInput(
            "attention window must be a positive number of positions or None,"
            f" got {sliding_window!r}"
        )
    return int(sliding_window)


def permitted(
    valid_q: Array,
    valid_k: Array,
    seg_q: Array,
    seg_k: Array,
    pos_q: Array,
    pos_k: Array,
    sliding_window: int | None = None,
    seg_end_k: Array | None = None,
) -> Array:
    """True where query ``q`` may attend to key ``k``: THE permission predicate. Both
    valid, ``seg_k <= seg_q < seg_end_k`` (None: the same segment), ``0 <= pos_q - pos_k <
    sliding_window`` (None: unbounded); broadcastable NumPy arrays, torch tensors or scalars.
    """
    lag = pos_q - pos_k
    inside = seg_q == seg_k if seg_end_k is None else (seg_k <= seg_q) & (seg_q < seg_end_k)
    allowed = valid_q & valid_k & inside & (lag >= 0)
    return allowed if sliding_window is None else allowed & (lag < sliding_window)


def pairwise(
    valid: Array,
    segments: Array,
    positions: Array,
    sliding_window: int | None = None,
    segment_ends: Array | None = None,
) -> Array:
    """:func:`permitted` over every (query, key) pair of ``(R, T)`` arrays: bool ``(R, T, T)``
    (``segment_ends``: each cell's node exit, tree packing; ``None``: flat)."""
    return permitted(
        valid[:, :, None],
        valid[:, None, :],
        segments[:, :, None],
        segments[:, None, :],
        positions[:, :, None],
        positions[:, None, :],
        sliding_window,
        None if segment_ends is None else segment_ends[:, None, :],
    )


def key_bounds(
    valid: Array, positions: Array, columns: Array, sliding_window: int | None = None
) -> tuple[Array, Array]:
    """Closed form of :func:`permitted`'s keys per query, ``(R, T)`` NumPy or torch: a real
    query at column ``c``, position ``p`` sees ``[c - min(p, sliding_window - 1), c + 1)``,
    a padding query ``[c, c)``."""
    back = positions if sliding_window is None else positions.clip(max=sliding_window - 1)
    return columns - back * valid, columns + valid


def allowed_key(
    batch: PackedBatch, row: int, query: int, key: int, sliding_window: int | None = None
) -> bool:
    """True when ``query`` may attend to ``key`` in ``row`` (coordinates checked)."""
    rows, width = batch.shape
    for name, value, limit in (("row", row, rows), ("query", query, width), ("key", key, width)):
        if not 0 <= value < limit:
            raise InvalidInput(
                f"attention coordinate {name}={value} is outside this batch of shape {batch.shape}"
            )
    v, s, p = batch.input_valid[row], batch.segments[row], batch.positions[row]
    w = check_sliding_window(sliding_window)
    end = None if batch.node_ends is None else batch.node_ends[row, key]
    return bool(permitted(v[query], v[key], s[query], s[key], int(p[query]), int(p[key]), w, end))


@dataclass(frozen=True)
class KeyRanges:
    """Per-query key range ``[starts, ends)``, int64 [R, T] (:func:`key_bounds`), and
    per-row valid length [R]."""

    starts: np.ndarray
    ends: np.ndarray
    row_lengths: np.ndarray

    def get(self, row: int, query: int) -> tuple[int, int] | None:
        s, e = int(self.starts[row, query]), int(self.ends[row, query])
        return None if s == e else (s, e)


def key_ranges(batch: PackedBatch, sliding_window: int | None = None) -> KeyRanges:
    rows, width = batch.shape
    cols = np.broadcast_to(np.arange(width, dtype=np.int64), (rows, width))
    valid = batch.input_valid
    starts, ends = key_bounds(
        valid, batch.positions.astype(np.int64), cols, check_sliding_window(sliding_window)
    )
    return KeyRanges(starts, ends, valid.sum(axis=1).astype(np.int64))


@dataclass(frozen=True)
class CuSeqlens:
    """flash-attn varlen metadata over the valid cells, row-major: ``cu_seqlens`` int32
    [S+1], ``max_seqlen``, ``valid_index`` int64 [Σl] (flat cell indices into ``[R*T]``),
    ``segment_rows`` int64 [S]."""

    cu_seqlens: np.ndarray
    max_seqlen: int
    valid_index: np.ndarray
    segment_rows: np.ndarray


def cu_seqlens(batch: PackedBatch) -> CuSeqlens:
    valid_index = np.flatnonzero(batch.input_valid).astype(np.int64)
    starts = valid_index[batch.positions.reshape(-1)[valid_index] == 0]
    # each segment start's place among the gathered valid tokens
    cu = np.append(np.searchsorted(valid_index, starts), valid_index.shape[0]).astype(np.int32)
    lens = np.diff(cu)
    return CuSeqlens(cu, int(lens.max()) if lens.size else 0, valid_index, starts // batch.shape[1])


def position_ids(batch: PackedBatch) -> np.ndarray:
    """Hugging Face style ``position_ids``, int64 [R, T]: local positions, 0 on padding."""
    return np.where(batch.input_valid, batch.positions, 0).astype(np.int64)


def dense_mask(batch: PackedBatch, sliding_window: int | None = None) -> np.ndarray:
    """Boolean mask [R, T, T] (True = permitted), for SDPA and eager attention."""
    return pairwise(
        batch.input_valid,
        batch.segments,
        batch.positions,
        check_sliding_window(sliding_window),
        batch.node_ends,
    )


def edges(batch: PackedBatch, sliding_window: int | None = None) -> np.ndarray:
    """Permitted edges ``(row, query, key)`` in query order, int64 [E, 3]."""
    r, q, k = np.nonzero(dense_mask(batch, sliding_window))
    return np.stack([r, q, k], axis=1).astype(np.int64)


def tiled_edges(
    batch: PackedBatch, tile_width: int = 2, sliding_window: int | None = None
) -> np.ndarray:
    """The same edges visited tile by tile (query tile, then key tile), int64 [E, 3]."""
    if tile_width < 1:
        raise InvalidInput(f"tile_width must be positive, got {tile_width}")
    rows, width = batch.shape
    out = []
    for row in range(rows):
        for q0 in range(0, width, tile_width):
            for k0 in range(0, width, tile_width):
                for q in range(q0, min(q0 + tile_width, width)):
                    for k in range(k0, min(k0 + tile_width, width)):
                        if allowed_key(batch, row, q, k, sliding_window):
                            out.append((row, q, k))
    return np.asarray(out, dtype=np.int64).reshape(-1, 3)
