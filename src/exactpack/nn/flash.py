"""``flash``: fused variable-length flash attention over ``cu_seqlens`` (CUDA only).

The valid cells are gathered row-major into tokens ``(N, H, D)``; segment ``s`` attends
causally inside tokens ``[cu_seqlens[s], cu_seqlens[s+1])`` (fixture: ``cu_seqlens =
[0, 3, 5, 9]``). :func:`flash_varlen` is the one kernel lookup, for flat rows and tree
rows alike: ``flash_attn_varlen_func``, else torch's ``varlen_attn`` (>= 2.10), float16 /
bfloat16 on CUDA only (else :class:`NotAvailable`); on CPU :func:`varlen_reference`,
the same signature in plain torch (the tree path's exact check).
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
from collections.abc import Callable
from typing import Any

import torch

from exactpack.core.errors import NotAvailable
from exactpack.nn.attention import AttentionLayout, register_backend
from exactpack.nn.varlen import as_tokens

#: Dtypes both varlen flash kernels accept.
FLASH_DTYPES = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256

Tensor = torch.Tensor
Kernel = Callable[..., Tensor]


def varlen_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    return_attn_probs: bool = False,
    **_: Any,
) -> Any:
    """``flash_attn_varlen_func`` in plain torch (dense per call: for checks on CPU).

    ``q`` (Nq, H, D), ``k``/``v`` (Nk, Hkv, D); sequence ``i`` is ``q[cu_q[i]:cu_q[i+1]]``
    against ``k[cu_k[i]:cu_k[i+1]]``, causality and ``window_size`` bottom-right aligned
    (query ``j`` of ``Lq`` at key ``j + Lk - Lq``). Returns ``out`` (Nq, H, Dv), or with
    ``return_attn_probs`` ``(out, lse (H, Nq), None)`` (differentiable; no key: 0, -inf).
    """
    if dropout_p:
        raise NotAvailable("varlen_reference has no dropout: it is the exact check")

    def local(cu: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:  # seq, index
        seq = torch.searchsorted(cu.long(), torch.arange(n, device=cu.device), right=True) - 1
        return seq, torch.arange(n, device=cu.device) - cu.long()[seq]

    sq, iq = local(cu_seqlens_q, q.shape[0])
    sk, ik = local(cu_seqlens_k, k.shape[0])
    shift = (cu_seqlens_k.diff() - cu_seqlens_q.diff()).long()[sq]  # Lk - Lq per query
    rel = (iq + shift)[:, None] - ik[None, :]  # (Nq, Nk): aligned key index - key index
    allowed = sq[:, None] == sk[None, :]
    left, right = window_size
    if causal:
        allowed &= rel >= 0
    if left >= 0:
        allowed &= rel <= left
    if right >= 0:
        allowed &= rel >= -right
    heads = q.shape[1]
    k, v = (x.repeat_interleave(heads // x.shape[1], dim=1) for x in (k, v))
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = scores.logsumexp(-1)  # (H, Nq)
    probs = (scores - lse[..., None]).exp().nan_to_num(0.0)
    out = torch.einsum("hqk,khd->qhd", probs, v)
    return (out, lse, None) if return_attn_probs else out


@functools.cache
def flash_varlen(device_type: str) -> Kernel:
    """The varlen kernel for ``device_type``, with ``flash_attn_varlen_func``'s signature:
    flash-attn's on CUDA, else torch's ``varlen_attn`` (>= 2.10; causal, keys = queries),
    and on CPU :func:`varlen_reference`; or :class:`NotAvailable`. The one lookup of the
    flat backend and the tree path (:func:`~exactpack.nn.tree_attention.tree_flash_attention`)."""
    if device_type != "cuda":
        return varlen_reference
    if not torch.cuda.is_available():
        raise NotAvailable(
            "flash attention needs a CUDA device and none is available;"
            " use backend='varlen' (or 'auto') on CPU"
        )
    if importlib.util.find_spec("flash_attn") is not None:
        from flash_attn import flash_attn_varlen_func

        return flash_attn_varlen_func
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as err:
        raise NotAvailable(
            f"flash attention needs the flash-attn package or torch >= 2.10 (found torch"
            f" {torch.__version__}); pip install flash-attn or use backend='flex'"
        ) from err
    # torch 2.10: is_causal=True, later window_size=(-1, 0); no scale: q carries it.
    params = inspect.signature(varlen_attn).parameters

    def torch_varlen(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0, softmax_scale=None,  # type: ignore[no-untyped-def]
                     causal=False, window_size=(-1, -1), return_attn_probs=False, **_):  # fmt: skip
        if cu_q is not cu_k or not causal or dropout_p or return_attn_probs:
            raise NotAvailable(
                "torch's varlen_attn runs causal attention of each sequence on itself only;"
                " the tree path needs the flash-attn package (pip install flash-attn) or"
                " attn_implementation='exactpack_tree'"
            )
        band = {"window_size": (window_size[0], 0)} if "window_size" in params else {}
        if not band and window_size[0] >= 0:
            raise NotAvailable(
                f"torch {torch.__version__} varlen_attn takes no window_size;"
                " install flash-attn or use backend='varlen' for sliding-window attention"
            )
        band = band or {"is_causal": True}
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        if "scale" in params:
            return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, **band)
        q = q * (scale * q.shape[-1] ** 0.5)
        return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, **band)

    return torch_varlen


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
    flash_varlen(q.device.type)


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
    fn = flash_varlen(q.device.type)
    rows, heads, width, _ = q.shape
    if layout.valid_index.numel() == 0:
        return torch.zeros_like(q)

    def tokens(x: torch.Tensor) -> torch.Tensor:  # (R, H, T, D) -> (N, H, D)
        return as_tokens(x).index_select(0, layout.valid_index)

    cu, longest = layout.cu_seqlens, layout.max_seqlen
    left = -1 if sliding_window is None else sliding_window - 1
    out = fn(
        tokens(q), tokens(k), tokens(v), cu, cu, longest, longest,
        softmax_scale=scale, causal=True, window_size=(left, 0),
    )  # fmt: skip
    out = torch.cat([out.new_zeros(1, heads, out.shape[-1]), out]).index_select(
        0, token_slots(layout)
    )  # (R*T, H, D)
    return out.view(rows, width, heads, out.shape[-1]).transpose(1, 2)


register_backend("flash", flash_attention)
