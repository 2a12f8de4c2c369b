"""``auto``: the fastest backend that can serve these inputs on this machine.

CUDA float16/bfloat16: ``flash``; CUDA float32 (or no flash kernel): ``flex``; CUDA
float64 and CPU: ``varlen``. The choice changes speed, never results beyond rounding.
"""

from __future__ import annotations

import contextlib

import torch

from exactpack.core.errors import NotAvailable
from exactpack.nn.attention import BACKENDS, AttentionLayout, register_backend
from exactpack.nn.flash import check_flash
from exactpack.nn.flex import COMPILED_DTYPES


def choose_backend(q: torch.Tensor) -> str:
    """Name of the backend ``auto`` uses for ``q`` (its device and dtype)."""
    if q.device.type != "cuda":
        return "varlen"
    with contextlib.suppress(NotAvailable):
        check_flash(q)
        return "flash"
    return "flex" if q.dtype in COMPILED_DTYPES else "varlen"  # flex runs every CUDA input


def auto_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: AttentionLayout,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Dispatch to :func:`choose_backend`'s pick; ``q, k, v, out`` (R, H, T, D)."""
    return BACKENDS[choose_backend(q)](q, k, v, layout, scale, sliding_window=sliding_window)


register_backend("auto", auto_attention)
