"""``flash``: fused variable-length flash attention over ``cu_seqlens`` (CUDA only).

The valid cells are gathered row-major into tokens ``(N, H, D)``; segment ``s`` attends
causally inside tokens ``[cu_seqlens[s], cu_seqlens[s+1])`` (fixture: ``cu_seqlens =
[0, 3, 5, 9]``). Kernel: ``flash_attn_varlen_func``, else torch's ``varlen_attn`` (>=
2.10), float16 / bfloat16 on CUDA only (else :class:`NotAvailable`).
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
from collections.abc import Callable

import torch

from exactpack.core.errors import NotAvailable
from exactpack.nn.attention import AttentionLayout, register_backend
from exactpack.nn.varlen import as_tokens

#: Dtypes both varlen flash kernels accept.
FLASH_DTYPES = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256

Tensor = torch.Tensor
Kernel = Callable[..., Tensor]


@functools.cache
def flash_kernel() -> tuple[str, Kernel]:
    """``(name, fn)`` of the varlen flash kernel here, or :class:`NotAvailable`; ``fn(q, k, v,
    cu_seqlens, max_seqlen, scale, sliding_window=None)`` maps tokens ``(N, H, D)``."""
    if not torch.cuda.is_available():
        raise NotAvailable(
            "backend 'flash' needs a CUDA device and none is available;"
            " use backend='varlen' (or 'auto') on CPU"
        )
    if importlib.util.find_spec("flash_attn") is not None:
        from flash_attn import flash_attn_varlen_func

        def flash_attn_kernel(q, k, v, cu, max_len, scale, sliding_window=None):  # type: ignore[no-untyped-def]
            band = {} if sliding_window is None else {"window_size": (sliding_window - 1, 0)}
            return flash_attn_varlen_func(
                q, k, v, cu, cu, max_len, max_len, softmax_scale=scale, causal=True, **band
            )

        return "flash-attn", flash_attn_kernel
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as err:
        raise NotAvailable(
            f"backend 'flash' needs the flash-attn package or torch >= 2.10"
            f" (found torch {torch.__version__}); pip install flash-attn or use backend='flex'"
        ) from err
    # torch 2.10: is_causal=True, later window_size=(-1, 0); no scale: q carries it.
    params = inspect.signature(varlen_attn).parameters
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    takes_scale = "scale" in params

    def torch_kernel(q, k, v, cu, max_len, scale, sliding_window=None):  # type: ignore[no-untyped-def]
        band = causal
        if sliding_window is not None:
            if "window_size" not in params:
                raise NotAvailable(
                    f"torch {torch.__version__} varlen_attn takes no window_size;"
                    " install flash-attn or use backend='varlen' for sliding-window attention"
                )
            band = {"window_size": (sliding_window - 1, 0)}
        if takes_scale:
            return varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scale, **band)
        q = q * (scale * q.shape[-1] ** 0.5)
        return varlen_attn(q, k, v, cu, cu, max_len, max_len, **band)

    return "torch-varlen", torch_kernel


def check_flash(q: torch.Tensor) -> None:
    """Raise :class:`NotAvailable` unless the flash kernels can take ``q`` as it is."""
    if q.device.type != "cuda":
        raise NotAvailable(
            f"backend 'flash' runs on CUDA only; q is on {q.device}."
            " Use backend='varlen' (or 'auto') there"
        )
    if q.dtype not in FLASH_DTYPES:
        raise NotAvailable(
            f"backend 'flash' takes float16/bfloat16, got {q.dtype};"
            " cast the model to bfloat16, or use backend='flex' or 'varlen' for this dtype"
        )
    dim = q.shape[-1]
    if dim % 8 or dim > MAX_HEAD_DIM:
        raise NotAvailable(
            f"backend 'flash' needs a head width that is a multiple of 8 and <= {MAX_HEAD_DIM},"
            f" got {dim}; use backend='flex' or 'varlen'"
        )
    flash_kernel()


def token_slots(layout: AttentionLayout) -> torch.Tensor:
    """int64 (R*T,): ``1 +`` each valid cell's token index, ``0`` on padding (cached)."""
    if "token_slots" not in layout.cache:
        rows, width = layout.shape
        slots = torch.zeros(rows * width, dtype=torch.int64, device=layout.valid.device)
        count = layout.valid_index.shape[0]
        slots[layout.valid_index] = torch.arange(1, count + 1, device=slots.device)
        layout.cache["token_slots"] = slots
    return layout.cache["token_slots"]


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: AttentionLayout,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Varlen flash attention; ``q, k, v, out`` (R, H, T, D), zeros at padding queries."""
    check_flash(q)
    _, fn = flash_kernel()
    rows, heads, width, _ = q.shape
    if layout.valid_index.numel() == 0:
        return torch.zeros_like(q)

    def tokens(x: torch.Tensor) -> torch.Tensor:  # (R, H, T, D) -> (N, H, D)
        return as_tokens(x).index_select(0, layout.valid_index)

    out = fn(
        tokens(q), tokens(k), tokens(v), layout.cu_seqlens, layout.max_seqlen, scale, sliding_window
    )
    out = torch.cat([out.new_zeros(1, heads, out.shape[-1]), out]).index_select(
        0, token_slots(layout)
    )  # (R*T, H, D)
    return out.view(rows, width, heads, out.shape[-1]).transpose(1, 2)


register_backend("flash", flash_attention)
