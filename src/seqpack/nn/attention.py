"""Block-causal attention over a packed layout, behind one small interface.

Every backend computes, for each head, ``softmax(q k^T * scale)`` over the
keys that :func:`seqpack.permission.allowed_key` permits and mixes ``v``;
an inactive (padding) query gets a zero mixture, never NaN, and no gradient
reaches padding or another segment.

Shapes follow ``F.scaled_dot_product_attention``::

    q, k, v : (R, H, T, D)     R rows, H heads, T = capacity, D head width
    out     : (R, H, T, D)     zeros at padding queries

The layout is converted to tensors once per forward (:class:`AttentionLayout`)
and shared by every layer and head. Backends register by name in
:data:`BACKENDS`; ``attention(q, k, v, batch, backend="ranges")`` picks one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from seqpack.core.batch import PackedBatch
from seqpack.core.errors import InvalidInput, NotAvailable


@dataclass(eq=False)
class AttentionLayout:
    """Torch views of one batch's permission, built once and shared by all layers.

    ``valid`` bool (R, T); ``segments``, ``positions``, ``key_starts``,
    ``key_ends`` int64 (R, T) with ``[key_starts, key_ends)`` the permitted
    key range of each query (empty on padding); ``cu_seqlens`` int32 (S+1,),
    ``max_seqlen``, ``valid_index`` int64 (N,) flat indices of valid cells
    into ``R*T``, row-major; ``lengths`` int64 (S,) segment lengths.
    """

    valid: torch.Tensor
    segments: torch.Tensor
    positions: torch.Tensor
    key_starts: torch.Tensor
    key_ends: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    valid_index: torch.Tensor
    lengths: np.ndarray
    cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.valid.shape[0]), int(self.valid.shape[1]))

    @classmethod
    def from_batch(
        cls, batch: PackedBatch, device: torch.device | str | None = None
    ) -> AttentionLayout:
        ranges = batch.key_ranges()
        cu = batch.cu_seqlens()

        def t(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
            return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype, device=device)

        return cls(
            valid=t(batch.input_valid, torch.bool),
            segments=t(batch.segments, torch.int64),
            positions=t(batch.positions, torch.int64),
            key_starts=t(ranges.starts, torch.int64),
            key_ends=t(ranges.ends, torch.int64),
            cu_seqlens=t(cu.cu_seqlens, torch.int32),
            max_seqlen=cu.max_seqlen,
            valid_index=t(cu.valid_index, torch.int64),
            lengths=np.diff(cu.cu_seqlens).astype(np.int64),
        )

    def dense_mask(self) -> torch.Tensor:
        """The permission predicate as a bool (R, T, T) mask (cached)."""
        if "dense_mask" not in self.cache:
            same = self.segments[:, :, None] == self.segments[:, None, :]
            causal = self.positions[:, None, :] <= self.positions[:, :, None]
            both = self.valid[:, :, None] & self.valid[:, None, :]
            self.cache["dense_mask"] = same & causal & both
        return self.cache["dense_mask"]

    def range_mask(self) -> torch.Tensor:
        """Key ``k`` in ``[key_starts[q], key_ends[q])`` as a bool (R, T, T) mask (cached)."""
        if "range_mask" not in self.cache:
            keys = torch.arange(self.shape[1], device=self.valid.device)
            inside = (keys >= self.key_starts[:, :, None]) & (keys < self.key_ends[:, :, None])
            self.cache["range_mask"] = inside
        return self.cache["range_mask"]


Backend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, AttentionLayout, float], torch.Tensor]


def ranges_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout, scale: float
) -> torch.Tensor:
    """Reference: softmax over each query's key range; inactive queries skip softmax.

    The seed's ``causal_attention_with_ranges``: scores outside
    ``[start, q+1)`` are ``-inf`` (probability exactly 0, so exactly zero
    gradient), and a query with an empty range is replaced by a zero row
    *before* softmax so no NaN is ever formed.
    """
    inside = layout.range_mask()[:, None]  # (R, 1, T, T)
    active = (layout.key_ends > layout.key_starts)[:, None, :, None]  # (R, 1, T, 1)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale  # (R, H, T, T)
    scores = scores.masked_fill(~inside, float("-inf"))
    scores = scores.masked_fill(~active, 0.0)  # inactive rows: finite, then zeroed
    weights = torch.softmax(scores, dim=-1) * active
    return torch.matmul(weights, v)  # (R, H, T, D)


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout, scale: float
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with the boolean (R, 1, T, T) permission mask.

    Computes the whole ``R*T^2`` rectangle per head; a query whose mask row
    is all False returns exact zeros (checked in the tests).
    """
    mask = layout.dense_mask()[:, None]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out * layout.valid[:, None, :, None]


BACKENDS: dict[str, Backend] = {
    "ranges": ranges_attention,
    "dense": dense_attention,
}


def register_backend(name: str, fn: Backend) -> None:
    """Make ``fn`` selectable as ``attention(..., backend=name)``."""
    BACKENDS[name] = fn


def resolve_backend(name: str, q: torch.Tensor | None = None) -> Backend:
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
) -> torch.Tensor:
    """Block-causal attention of ``q, k, v`` (R, H, T, D) under ``batch``'s permission.

    ``backend``: ``"ranges"`` (reference), ``"dense"``, and, registered by
    ``seqpack.nn``, ``"varlen"``, ``"flex"``, ``"flash"`` and ``"auto"``
    (README, "Attention backends").

    >>> from seqpack.core.fixture import fixture_batch
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
    fn = resolve_backend(backend, q)
    return fn(q, k, v, layout, scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))


__all__ = [
    "BACKENDS",
    "AttentionLayout",
    "NotAvailable",
    "attention",
    "dense_attention",
    "ranges_attention",
    "register_backend",
]
