"""Attention over tree-packed rows: each node's queries against its path, never ``T^2``.

A node of ``m`` cells whose path (its ancestors' cells, root first, then its own) holds
``P`` cells attends with one ``(m, P)`` block, its queries at path positions
``P-m .. P-1``: :func:`tree_plan` gives the :class:`~exactpack.nn.varlen.PathPlan` that
:func:`~exactpack.nn.varlen.path_attention` runs (a flat segment is its own path);
nodes of the same ``(m, P)`` share one SDPA call. For the layout drawn in
:mod:`exactpack.core.tree`::

    node 0 (cols 0-2)  queries 0-2  keys 0-2          3 x 3
    node 1 (col 3)     query 3      keys 0-3          1 x 4
    node 2 (cols 4-5)  queries 4-5  keys 0-3, 4-5     2 x 6
    node 3 (col 6)     query 6      keys 0-3, 6       1 x 5
    node 4 (cols 7-8)  queries 7-8  keys 0-2, 7-8     2 x 5      (36 of 81 dense cells)

Gather indices are built once per batch; a shared prefix gets its
gradient once per consumer (``index_select``'s backward adds them): the flat gradient.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from exactpack.core.batch import PackedBatch
from exactpack.core.errors import NotAvailable
from exactpack.nn.flash import flash_varlen, varlen_reference
from exactpack.nn.varlen import PathPlan


def tree_plan(batch: PackedBatch, device: torch.device | str | None = None) -> PathPlan:
    """The :class:`~exactpack.nn.varlen.PathPlan` of ``batch``: one block a node, its queries
    against its path (:meth:`PackedBatch.node_paths`), nodes of the same ``(m, P)`` in one
    group."""
    keys, bounds = batch.node_paths()
    occ = batch.occurrences
    first = occ.row.astype(np.int64) * batch.shape[1] + occ.col_start
    m, p = occ.lengths, np.diff(bounds)
    shapes, inverse = np.unique(np.stack([m, p], axis=1), axis=0, return_inverse=True)
    scatter = np.zeros(batch.shape[0] * batch.shape[1], dtype=np.int64)
    groups, q_parts, k_parts, slot = [], [], [], 0
    for g, (mg, pg) in enumerate(shapes.tolist()):
        members = np.flatnonzero(inverse.reshape(-1) == g)
        q_index = (first[members][:, None] + np.arange(mg)).reshape(-1)
        q_parts.append(q_index)
        k_parts.append(keys[(bounds[members][:, None] + np.arange(pg)).reshape(-1)])
        scatter[q_index] = slot + 1 + np.arange(q_index.shape[0])
        slot += q_index.shape[0]
        groups.append((int(members.shape[0]), int(mg), int(pg)))
    q_t, k_t = (
        torch.as_tensor(np.concatenate(x) if x else np.zeros(0, np.int64), device=device)
        for x in (q_parts, k_parts)
    )
    return PathPlan(tuple(groups), q_t, k_t, torch.as_tensor(scatter, device=device))


def tree_flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: PathPlan,
    scale: float,
    sliding_window: int | None = None,
    dropout: float = 0.0,
    *,
    varlen: Any = None,
    merge: bool = False,
) -> torch.Tensor:
    """``plan`` through a varlen kernel (``flash_attn_varlen_func``'s signature), one
    sequence a block (:meth:`~exactpack.nn.varlen.PathPlan.varlen`).

    Tokens ``q`` (R*T, H, D), ``k``/``v`` (R*T, Hkv, D) -> (R*T, H, Dv), zeros at padding.
    Default: one causal bottom-right call, each node's queries against its gathered path.
    ``merge``: a causal call over the node spans plus one over the ancestors' spans,
    merged by log-sum-exp (full attention; with flash-attn, forwards without gradients).
    """
    varlen = varlen or flash_varlen(q.device.type)
    seq = plan.varlen()
    qs = q.index_select(0, plan.q_index)

    def call(keys: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor, **kw: Any) -> Any:
        return varlen(
            kw.pop("q", qs), k.index_select(0, keys), v.index_select(0, keys), cu_q, cu_k,
            seq["max_q"], seq["max_k"], dropout_p=dropout, softmax_scale=scale, **kw,
        )  # fmt: skip

    if not merge:
        left = -1 if sliding_window is None else sliding_window - 1
        out = call(plan.k_index, seq["cu_q"], seq["cu_k"], causal=True, window_size=(left, 0))
    else:
        if sliding_window is not None:
            raise NotAvailable("the two-part merge serves full attention; use merge=False")
        if torch.is_grad_enabled() and q.requires_grad and varlen is not varlen_reference:
            raise NotAvailable(
                "the two-part merge needs the log-sum-exp's gradient, which flash-attn's"
                " backward drops: run it without gradients, or use merge=False"
            )
        inner = seq["inner_q"]
        own, lse_own, _ = call(
            plan.q_index, seq["cu_q"], seq["cu_q"], causal=True, return_attn_probs=True
        )
        part, lse_part, _ = call(
            seq["ancestors"], seq["cu_inner"], seq["cu_a"], q=qs.index_select(0, inner),
            return_attn_probs=True,
        )  # fmt: skip
        lse_own_inner = lse_own.index_select(1, inner)
        lse = torch.logaddexp(lse_own_inner, lse_part)  # (H, n): both parts' softmax
        merged = own.index_select(0, inner) * (lse_own_inner - lse).exp().T[..., None]
        merged = merged + part * (lse_part - lse).exp().T[..., None]
        out = own.index_copy(0, inner, merged.to(own.dtype))
    return out.new_zeros(plan.cells, *out.shape[1:]).index_copy(0, plan.q_index, out)
