"""The 4-D attention masks ``transformers`` models take, as views of the one permission predicate.

Every mask is :func:`exactpack.core.permission.permitted` plus one rule: a padding cell
attends to itself only (no fully masked row). Fixture row 0 (A = columns 0-2, B = 3-4,
padding at 5) under a window of 2::

    q\\k 0 1 2 3 4 5
    0    1 . . . . .
    1    1 1 . . . .
    2    . 1 1 . . .     the window drops A's key 0
    3    . . . 1 . .
    4    . . . 1 1 .
    5    . . . . . 1     padding: itself only

Forms: ``float`` (additive ``(R, 1, T, T)``, 0 or ``finfo.min``: eager and sdpa),
``bool`` (True = attend: sdpa only) and a FlexAttention ``BlockMask``; a mask per layer
type is a dict ``{layer_type: mask}``.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from exactpack.core.batch import PackedBatch
from exactpack.core.errors import InvalidInput
from exactpack.hf.architectures import CHUNKED, MASKED_LAYERS, Architecture
from exactpack.hf.kinds import FLEX, SDPA
from exactpack.nn.flex import permission_mod

#: Forms of the 4-D mask for ``eager`` / ``sdpa``.
MASKS = ("float", "bool")


def hf_allowed(
    batch: PackedBatch, sliding_window: int | None = None, chunk: int | None = None
) -> np.ndarray:
    """The permission plus each padding cell attending to itself only, bool ``[R, T, T]``;
    ``chunk``: keys only in the query's chunk of ``chunk`` positions (Llama 4)."""
    allowed = batch.dense_mask(sliding_window)
    if chunk is not None:
        part = batch.positions // chunk  # (R, T)
        allowed &= part[:, :, None] == part[:, None, :]
    pad_r, pad_c = np.nonzero(~batch.input_valid)
    allowed[pad_r, pad_c, pad_c] = True
    return allowed


def bool_mask(
    batch: PackedBatch,
    device: torch.device | str | None = None,
    sliding_window: int | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """:func:`hf_allowed` as a boolean mask ``(R, 1, T, T)``, True = attend (``sdpa`` only)."""
    return torch.as_tensor(hf_allowed(batch, sliding_window, chunk), device=device)[:, None]


def additive_mask(
    batch: PackedBatch,
    dtype: torch.dtype,
    device: torch.device | str | None = None,
    sliding_window: int | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """:func:`hf_allowed` as a float additive mask ``(R, 1, T, T)``: 0 or ``finfo(dtype).min``."""
    if not dtype.is_floating_point:
        raise InvalidInput(f"an additive mask needs a floating dtype (the model's), got {dtype}")
    allowed = bool_mask(batch, device, sliding_window, chunk)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)


def block_mask(
    batch: PackedBatch,
    device: torch.device | str | None = None,
    sliding_window: int | None = None,
    chunk: int | None = None,
) -> Any:
    """:func:`hf_allowed` as a FlexAttention ``BlockMask`` over ``(R, 1, T, T)``: its
    ``mask_mod`` is the predicate itself (compiled flex kernels read it per cell)."""
    from torch.nn.attention.flex_attention import create_block_mask

    t = functools.partial(torch.as_tensor, device=device)
    valid = t(batch.input_valid)
    positions = t(batch.positions)
    ends = None if batch.node_ends is None else t(batch.node_ends)  # forest: ancestor-or-self
    allowed = permission_mod(valid, t(batch.segments), positions, sliding_window, ends)
    part = positions // (chunk or (batch.shape[1] + 1))  # one chunk: no chunking

    def mask_mod(b: Any, h: Any, q: Any, k: Any) -> Any:
        same = part[b, q] == part[b, k]
        return (allowed(b, h, q, k) & same) | (~valid[b, q] & (q == k))

    rows, width = batch.shape
    return create_block_mask(mask_mod, rows, None, width, width, device=valid.device)


def check_mask(mask: str, kind: str) -> str:
    """``mask`` if implementations of ``kind`` read it correctly, else a clear error."""
    if mask not in MASKS:
        raise InvalidInput(f"mask={mask!r} is not one of {', '.join(MASKS)}")
    if mask == "bool" and kind != SDPA:
        raise InvalidInput(
            f"mask='bool' is right on the sdpa kind only; an implementation of kind {kind!r}"
            " adds a boolean mask to its scores as numbers (True = 1) — use mask='float'"
        )
    return mask


def layer_masks(
    batch: PackedBatch,
    kind: str,
    arch: Architecture | None,
    *,
    mask: str = "float",
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Any:
    """The ``attention_mask`` argument for ``kind`` (sdpa, eager, flex): one mask, or
    ``{layer_type: mask}`` per layer type. ``arch=None``: one unwindowed mask; layer types
    that are not attention (run only to measure a refused hybrid) get ``None``."""
    check_mask(mask, kind)

    @functools.cache  # layer types of one reach share one mask
    def one(window: int | None, chunk: int | None) -> Any:
        if kind == FLEX:
            return block_mask(batch, device, window, chunk)
        if mask == "bool":
            return bool_mask(batch, device, window, chunk)
        return additive_mask(batch, dtype, device, window, chunk)

    def reach(window: int | None, chunk: int | None = None) -> Any:
        # a window (or chunk) no shorter than the row is none
        return one(*(None if x is None or x >= batch.shape[1] else x for x in (window, chunk)))

    if arch is None or not arch.mask_types:
        return reach(None if arch is None else arch.window)
    return {
        name: reach(window, arch.chunk if name == CHUNKED else None)
        if name in MASKED_LAYERS
        else None
        for name, window in arch.windows.items()
    }
