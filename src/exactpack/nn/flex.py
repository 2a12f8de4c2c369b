"""``flex``: PyTorch FlexAttention with a ``BlockMask`` built from the permission predicate.

The ``mask_mod`` *is* :func:`exactpack.core.permission.permitted` on the layout's tensors;
the mask is built once per layout and window (cached) and the kernel skips every 128x128
tile with no permitted edge. CPU inputs that require grad are refused
(:class:`NotAvailable`: no CPU backward). float32 / bfloat16 / float16 run the kernel
compiled with ``fullgraph=True`` (a failure raises); float64 the unfused eager path.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch

from exactpack.core.errors import NotAvailable
from exactpack.core.permission import check_sliding_window, permitted
from exactpack.nn.attention import AttentionLayout, register_backend

#: Dtypes the fused FlexAttention kernel accepts (CPU and CUDA).
COMPILED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _flex_module() -> Any:
    from torch.nn.attention import flex_attention  # torch >= 2.5 (pyproject), on first use

    return flex_attention


@functools.cache
def _compiled_flex() -> Any:
    return torch.compile(_flex_module().flex_attention, dynamic=False, fullgraph=True)


def permission_mod(
    valid: torch.Tensor,
    segments: torch.Tensor,
    positions: torch.Tensor,
    sliding_window: int | None = None,
    node_ends: torch.Tensor | None = None,
) -> Any:
    """:func:`~exactpack.core.permission.permitted` as a FlexAttention ``mask_mod`` on (R, T);
    with ``node_ends`` (each cell's node's exit), ``segments`` are a tree row's node ids."""
    sliding_window = check_sliding_window(sliding_window)

    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return permitted(
            valid[b, q_idx],
            valid[b, kv_idx],
            segments[b, q_idx],
            segments[b, kv_idx],
            positions[b, q_idx],
            positions[b, kv_idx],
            sliding_window,
            None if node_ends is None else node_ends[b, kv_idx],
        )

    return mask_mod


def flex_block_mask(layout: AttentionLayout, sliding_window: int | None = None) -> Any:
    """The layout's permission as a FlexAttention ``BlockMask`` over (R, 1, T, T) (cached)."""
    sliding_window = check_sliding_window(sliding_window)
    rows, width = layout.shape
    mod = permission_mod(layout.valid, layout.segments, layout.positions, sliding_window)
    create = _flex_module().create_block_mask
    return layout.cached(
        f"flex_block_mask:{sliding_window}",
        lambda: create(mod, rows, None, width, width, device=layout.valid.device),
    )


def needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(x.requires_grad for x in tensors)


def check_flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise :class:`NotAvailable` when FlexAttention cannot serve these inputs here."""
    if q.device.type == "cpu" and needs_grad(q, k, v):
        raise NotAvailable(
            "FlexAttention has no backward on CPU (inputs require grad); use"
            " backend='varlen' (or 'ranges') to train on CPU, or run flex under torch.no_grad()"
        )


def flex_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: AttentionLayout,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """FlexAttention over ``flex_block_mask(layout)``; ``q, k, v, out`` (R, H, T, D)."""
    check_flex(q, k, v)
    if not needs_grad(q, k, v):  # FlexAttention refuses CPU inputs that merely require grad
        q, k, v = q.detach(), k.detach(), v.detach()
    block_mask = flex_block_mask(layout, sliding_window)
    if q.dtype in COMPILED_DTYPES:
        try:
            out = _compiled_flex()(q, k, v, block_mask=block_mask, scale=scale)
        except Exception as err:  # Dynamo/Inductor raise many types; keep the cause chained
            raise NotAvailable(
                f"compiled FlexAttention failed for {q.dtype} {tuple(q.shape)} on {q.device}:"
                f" {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''};"
                " use backend='varlen'"
            ) from err
    else:
        with warnings.catch_warnings():  # the unfused path is deliberate here
            warnings.filterwarnings("ignore", message=".*without torch.compile.*")
            out = _flex_module().flex_attention(q, k, v, block_mask=block_mask, scale=scale)
    return out * layout.valid[:, None, :, None]


register_backend("flex", flex_attention)
