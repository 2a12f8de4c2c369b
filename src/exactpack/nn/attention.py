"""Block-causal attention over a packed layout, behind one small interface.

Every backend computes ``softmax(q k^T * scale)`` over the keys
:func:`exactpack.core.permission.permitted` allows (``sliding_window``: the last that many
positions); a padding query gets zeros, never NaN, and no gradient crosses segments::

    q, k, v : (R, H, T, D)     R rows, H heads, T = capacity, D head width
    out     : (R, H, T, D)     zeros at padding queries

Backends register by name in :data:`BACKENDS`; :class:`AttentionLayout` is built once
per forward and shared by every layer and head.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from exactpack.core.batch import NO_SEGMENT, PackedBatch
from exactpack.core.errors import InvalidInput
from exactpack.core.permission import check_sliding_window, key_bounds, pairwise


@dataclass(eq=False)
class AttentionLayout:
    """Torch views of one batch's permission, built once and shared by all layers.

    ``valid`` bool (R, T); ``segments``, ``positions`` int64 (R, T) (each query's keys:
    :meth:`key_bounds`); ``cu_seqlens`` int32 (S+1,),
    ``max_seqlen``, ``valid_index`` int64 (N,) valid cells' flat indices, ``lengths`` (S,).
    """

    valid: torch.Tensor
    segments: torch.Tensor
    positions: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    valid_index: torch.Tensor
    lengths: np.ndarray
    cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.valid.shape[0]), int(self.valid.shape[1]))

    @classmethod
    def from_segments(
        cls,
        shape: tuple[int, int],
        rows: np.ndarray,
        starts: np.ndarray,
        lengths: np.ndarray,
        segments: np.ndarray,
        device: torch.device | str | None = None,
    ) -> AttentionLayout:
        """THE constructor: segments ``s`` (storage order) cover cells ``[starts[s],
        starts[s] + lengths[s])`` of row ``rows[s]`` with id ``segments[s]``; arrays [S]."""
        rows_n, width = shape
        rows, starts = np.asarray(rows, np.int64), np.asarray(starts, np.int64)
        order = np.lexsort((starts, rows))  # row-major, as varlen kernels read tokens
        rows, starts, segments = rows[order], starts[order], np.asarray(segments)[order]
        lengths = np.asarray(lengths, dtype=np.int64)[order]
        cu = np.r_[0, np.cumsum(lengths)].astype(np.int64)
        owner = np.repeat(np.arange(lengths.shape[0]), lengths)
        local = np.arange(cu[-1], dtype=np.int64) - cu[:-1][owner]
        index = (rows * width + starts)[owner] + local

        def cells(values: Any, fill: int, dtype: Any) -> np.ndarray:
            out = np.full(rows_n * width, fill, dtype=dtype)
            out[index] = values
            return out.reshape(rows_n, width)

        valid, positions = cells(True, 0, bool), cells(local, 0, np.int64)

        def t(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
            return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype, device=device)

        return cls(
            valid=t(valid, torch.bool),
            segments=t(cells(segments[owner], NO_SEGMENT, np.int64), torch.int64),
            positions=t(positions, torch.int64),
            cu_seqlens=t(cu, torch.int32),
            max_seqlen=int(lengths.max()) if lengths.size else 0,
            valid_index=t(index, torch.int64),
            lengths=lengths,
        )

    @classmethod
    def from_batch(
        cls, batch: PackedBatch, device: torch.device | str | None = None
    ) -> AttentionLayout:
        """:meth:`from_segments` of ``batch``'s occurrences."""
        occ = batch.occurrences
        lengths = occ.col_end - occ.col_start
        return cls.from_segments(batch.shape, occ.row, occ.col_start, lengths, occ.segment, device)

    def cached(self, key: str, build: Callable[[], Any]) -> Any:
        """``build()`` once per layout and ``key``: the views every layer and head share."""
        if key not in self.cache:
            self.cache[key] = build()
        return self.cache[key]

    def key_bounds(self, sliding_window: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Each query's permitted key columns ``[starts, ends)``, int64 (R, T) (cached)."""
        sliding_window = check_sliding_window(sliding_window)

        def build() -> tuple[torch.Tensor, torch.Tensor]:
            cols = torch.arange(self.shape[1], device=self.valid.device).expand_as(self.positions)
            return key_bounds(self.valid, self.positions, cols, sliding_window)

        return self.cached(f"key_bounds:{sliding_window}", build)

    def dense_mask(self, sliding_window: int | None = None) -> torch.Tensor:
        """The permission predicate as a bool (R, T, T) mask (cached per window)."""
        sliding_window = check_sliding_window(sliding_window)
        mask = lambda: pairwise(self.valid, self.segments, self.positions, sliding_window)  # noqa: E731
        return self.cached(f"dense_mask:{sliding_window}", mask)

    def range_mask(self, sliding_window: int | None = None) -> torch.Tensor:
        """Key ``k`` inside :meth:`key_bounds` of query ``q``, bool (R, T, T) (cached)."""
        starts, ends = self.key_bounds(sliding_window)

        def build() -> torch.Tensor:
            keys = torch.arange(self.shape[1], device=self.valid.device)
            return (keys >= starts[:, :, None]) & (keys < ends[:, :, None])

        return self.cached(f"range_mask:{check_sliding_window(sliding_window)}", build)


#: ``fn(q, k, v, layout, scale, sliding_window=None) -> out``, all (R, H, T, D); a backend
#: without windows may omit ``sliding_window`` (it is passed only when one is set).
Backend = Callable[..., torch.Tensor]


def ranges_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: AttentionLayout,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Reference: softmax over each query's key range (``-inf`` outside, so exactly zero
    gradient); a query with an empty range is zeroed before softmax (no NaN)."""
    starts, ends = layout.key_bounds(sliding_window)
    inside = layout.range_mask(sliding_window)[:, None]  # (R, 1, T, T)
    active = (ends > starts)[:, None, :, None]  # (R, 1, T, 1)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale  # (R, H, T, T)
    scores = scores.masked_fill(~inside, float("-inf"))
    scores = scores.masked_fill(~active, 0.0)  # inactive rows: finite, then zeroed
    weights = torch.softmax(scores, dim=-1) * active
    return torch.matmul(weights, v)  # (R, H, T, D)


def dense_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: AttentionLayout,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with the boolean (R, 1, T, T) permission mask
    (the whole ``R*T^2`` rectangle); padding queries return exact zeros."""
    mask = layout.dense_mask(sliding_window)[:, None]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out * layout.valid[:, None, :, None]


BACKENDS: dict[str, Backend] = {
    "ranges": ranges_attention,
    "dense": dense_attention,
}


def register_backend(name: str, fn: Backend) -> None:
    """Make ``fn`` selectable as ``attention(..., backend=name)``."""
    BACKENDS[name] = fn


def resolve_backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise InvalidInput(
            f"unknown attention backend {name!r}; choose one of {', '.join(sorted(BACKENDS))}"
        )
    return BACKENDS[name]


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    batch: PackedBatch | AttentionLayout,
    backend: str = "ranges",
    scale: float | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Block-causal attention of ``q, k, v`` (R, H, T, D) under ``batch``'s permission.

    ``sliding_window``: each query sees at most its last that many positions (``None``:
    its example's whole causal prefix). ``backend``: ``"ranges"`` (reference),
    ``"dense"``, ``"varlen"``, ``"flex"``, ``"flash"`` or ``"auto"`` (README).

    >>> from exactpack.verify.fixture import fixture_batch
    >>> q = k = v = torch.ones(2, 2, 6, 4, dtype=torch.float64)
    >>> out = attention(q, k, v, fixture_batch())
    >>> out[0, 0, 5].abs().sum().item()   # padding query: zero mixture
    0.0
    """
    layout = (
        batch if isinstance(batch, AttentionLayout) else AttentionLayout.from_batch(batch, q.device)
    )
    if q.dim() != 4 or q.shape[0] != layout.shape[0] or q.shape[2] != layout.shape[1]:
        raise InvalidInput(
            f"q has shape {tuple(q.shape)}; expected (rows, heads, capacity, head_dim)"
            f" with rows, capacity = {layout.shape}"
        )
    if k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise InvalidInput(
            f"k {tuple(k.shape)} and v {tuple(v.shape)} must match q {tuple(q.shape)}"
        )
    fn = resolve_backend(backend)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    window = check_sliding_window(sliding_window)  # backends without windows: none passed
    return fn(q, k, v, layout, scale, **({} if window is None else {"sliding_window": window}))
