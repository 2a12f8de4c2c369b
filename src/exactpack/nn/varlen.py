"""``varlen``: attention inside each segment's causal block only, in pure PyTorch.

Segment ``s`` (flat cells ``[start, start + l)`` of ``R*T``) is plain causal attention.
Segments of equal length (``bucketing="exact"``, the default) share one causal SDPA call
on ``(n, H, L, D)`` (``Σ l^2`` score cells, not ``R*T^2``); ``"bucket"`` also stacks
similar lengths, padding a segment with its own last cell (outputs dropped). The fixture
(A = cells 0-2, B = 3-4, C = 6-9 of the flat ``2*6`` cells) under ``exact``::

    group (n=1, L=4): C -> cells [6, 7, 8, 9]
    group (n=1, L=3): A -> cells [0, 1, 2]
    group (n=1, L=2): B -> cells [3, 4]
    scatter: cells 5, 10, 11 (padding) read the zero row

A ``sliding_window`` shorter than ``L`` makes the call's mask the ``(L, L)`` band of
:func:`~exactpack.core.permission.permitted`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from exactpack.core.errors import InvalidInput
from exactpack.core.examples import concat_ranges
from exactpack.core.permission import check_sliding_window, permitted
from exactpack.nn.attention import AttentionLayout, register_backend

#: One call per segment, one per distinct length (the default), or the cost-model grouping.
BUCKETING = ("segment", "exact", "bucket")

#: Cost model of one SDPA forward+backward call on ``n`` segments padded to ``L``:
#: ``CALL_COST + n * L * (L + TOKEN_COST)`` score cells (fitted: docs/design-notes.md).
CALL_COST = 1024
TOKEN_COST = 48


@dataclass(frozen=True, eq=False)
class PathPlan:
    """The attention plan of one layout (flat cells ``R*T``), shared by all layers and heads:
    one SDPA call per group ``(n, m, P)`` of ``n`` blocks of ``m`` queries at positions
    ``P-m..P-1`` of their ``P`` keys — a query's path. A flat segment is its own path
    (``m = P``, ``q_index = k_index``); a tree node's path is its ancestors' cells, root
    first, then its own (:func:`exactpack.nn.tree_attention.tree_plan`). ``q_index`` int64
    (Σ n·m) and ``k_index`` (Σ n·P): flat cells (a bucketed block repeats its last cell);
    ``scatter`` int64 (R*T,): ``1 +`` each valid cell's query slot (0: padding)."""

    groups: tuple[tuple[int, int, int], ...]
    q_index: torch.Tensor
    k_index: torch.Tensor
    scatter: torch.Tensor
    #: run by a varlen (flash) kernel, one sequence a block (``exactpack_tree_varlen``)
    flash: bool = False
    cache: dict = field(default_factory=dict, repr=False)

    @property
    def cells(self) -> int:
        return int(self.scatter.shape[0])

    @property
    def padded_slots(self) -> int:
        return int(self.q_index.shape[0])

    @property
    def score_cells(self) -> int:
        """``Σ n·m·P``: the attention scores the plan computes (not ``R*T^2``)."""
        return sum(n * m * p for n, m, p in self.groups)

    def varlen(self) -> dict[str, Any]:
        """The blocks as a varlen kernel's sequences (``flash_attn_varlen_func``'s, cached):
        block ``b``'s ``m`` queries (``q_index``, ``cu_q``) against its ``P`` keys
        (``k_index``, ``cu_k``), causal bottom-right; for the two-part merge, the blocks
        with ancestors (their query slots ``inner_q``, ``cu_inner``) against the keys
        before their own (``ancestors``, ``cu_a``); a block's own keys are its queries."""
        if "varlen" not in self.cache:
            n = [g[0] for g in self.groups]
            m, p = (np.repeat([g[i] for g in self.groups], n).astype(np.int64) for i in (1, 2))
            inner = np.flatnonzero(p > m)
            q_at, k_at = np.r_[0, np.cumsum(m)], np.r_[0, np.cumsum(p)]
            ancestors = concat_ranges(k_at[:-1][inner], (p - m)[inner])
            device = self.q_index.device

            def cu(lengths: np.ndarray) -> torch.Tensor:
                return torch.as_tensor(
                    np.r_[0, np.cumsum(lengths)], dtype=torch.int32, device=device
                )

            self.cache["varlen"] = {
                "cu_q": cu(m),
                "cu_k": cu(p),
                "inner_q": torch.as_tensor(
                    concat_ranges(q_at[:-1][inner], m[inner]), device=device
                ),
                "cu_inner": cu(m[inner]),
                "ancestors": self.k_index.index_select(
                    0, torch.as_tensor(ancestors, device=device)
                ),
                "cu_a": cu((p - m)[inner]),
                "max_q": int(m.max(initial=0)),
                "max_k": int(p.max(initial=0)),
            }
        return self.cache["varlen"]


def group_segments(
    lengths: np.ndarray,
    bucketing: str = "exact",
    call_cost: float = CALL_COST,
    token_cost: float = TOKEN_COST,
) -> list[np.ndarray]:
    """Split segment indices into SDPA calls, each sorted longest first; ``bucket``: the
    contiguous grouping of least ``Σ_g call_cost + n_g * L_g * (L_g + token_cost)``.

    >>> [g.tolist() for g in group_segments(np.array([3, 2, 3]), "exact")]
    [[0, 2], [1]]
    """
    if bucketing not in BUCKETING:
        raise InvalidInput(f"unknown bucketing {bucketing!r}; choose one of {', '.join(BUCKETING)}")
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    if bucketing == "segment" or order.size == 0:
        return [order[i : i + 1] for i in range(order.size)]
    sorted_lengths = lengths[order]
    run_starts = np.flatnonzero(np.r_[True, sorted_lengths[1:] != sorted_lengths[:-1]])
    if bucketing == "exact":
        return np.split(order, run_starts[1:])
    run_length = sorted_lengths[run_starts].astype(np.float64)  # descending
    before = np.r_[run_starts, order.size]  # segments before run u
    runs = run_starts.size
    best = np.zeros(runs + 1)
    cut = np.zeros(runs + 1, dtype=np.int64)
    for i in range(1, runs + 1):
        n = before[i] - before[:i]  # segments in runs j..i-1, padded to run j's length
        cost = best[:i] + call_cost + n * run_length[:i] * (run_length[:i] + token_cost)
        cut[i] = int(np.argmin(cost))
        best[i] = cost[cut[i]]
    groups = []
    i = runs
    while i > 0:
        groups.append(order[before[cut[i]] : before[i]])
        i = int(cut[i])
    return groups[::-1]


def segment_plan(
    starts: np.ndarray,
    lengths: np.ndarray,
    cells: int,
    device: torch.device | str | None = None,
    bucketing: str = "exact",
) -> PathPlan:
    """The plan of segments ``[starts[s], starts[s] + lengths[s])`` (int64 (S,),
    positions ``0..l-1``) of ``cells`` flat cells; cells outside every segment read the zero
    row. :func:`varlen_plan` builds it once per layout, ``exactpack_varlen`` from ``cu_seqlens``."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    scatter = np.zeros(cells, dtype=np.int64)
    gather_parts, groups = [], []
    offset = 0
    for members in group_segments(lengths, bucketing):
        n, size = members.size, int(lengths[members].max())
        steps = np.arange(size, dtype=np.int64)
        first, seg_len = starts[members][:, None], lengths[members][:, None]  # (n, 1)
        gather_parts.append((first + np.minimum(steps, seg_len - 1)).ravel())
        real = steps < seg_len  # (n, L)
        slot = offset + np.arange(n, dtype=np.int64)[:, None] * size + steps
        scatter[(first + steps)[real]] = slot[real] + 1
        groups.append((n, size, size))
        offset += n * size
    gather = np.concatenate(gather_parts) if gather_parts else np.zeros(0, dtype=np.int64)
    index = torch.as_tensor(gather, device=device)
    return PathPlan(tuple(groups), index, index, torch.as_tensor(scatter, device=device))


def varlen_plan(layout: AttentionLayout, bucketing: str = "exact") -> PathPlan:
    """The (cached) plan of ``layout`` under ``bucketing``."""

    def build() -> PathPlan:
        cu = layout.cu_seqlens.cpu().numpy().astype(np.int64)
        starts = layout.valid_index.cpu().numpy()[cu[:-1]]  # flat cell of each position 0
        cells = layout.shape[0] * layout.shape[1]
        return segment_plan(starts, layout.lengths, cells, layout.valid.device, bucketing)

    return layout.cached(f"varlen:{bucketing}", build)


def as_tokens(x: torch.Tensor) -> torch.Tensor:
    """``(R, H, T, D)`` rows as ``(R*T, H, D)`` tokens (cell ``r*T + t``)."""
    return x.transpose(1, 2).reshape(x.shape[0] * x.shape[2], x.shape[1], x.shape[-1])


def band_mask(m: int, p: int, sliding_window: int | None, device: Any = None) -> torch.Tensor:
    """bool (m, P): :func:`~exactpack.core.permission.permitted` for queries at positions
    ``P-m..P-1`` of one segment (or tree path) against its keys ``0..P-1``."""
    pos_k = torch.arange(p, device=device)
    live = torch.ones(p, dtype=torch.bool, device=device)
    node = torch.zeros(p, dtype=torch.int64, device=device)
    q = slice(p - m, None)
    return permitted(
        live[q, None], live, node[q, None], node, pos_k[q, None], pos_k, sliding_window
    )


def path_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: PathPlan,
    scale: float,
    sliding_window: int | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Attention of every query against its path under ``plan`` (a flat segment's causal
    block, or a tree node's ancestors then itself), one SDPA call per group ``(n, m, P)``:
    ``n`` blocks of ``m`` queries (``plan.q_index``, Σ n·m) at positions ``P-m..P-1`` of
    their ``P`` keys (``plan.k_index``, Σ n·P). Tokens ``q`` (N, H, D), ``k``/``v``
    (N, Hkv, D), ``Hkv`` dividing ``H``; returns ``(N, H, Dv)``, cell ``i`` reading slot
    ``plan.scatter[i]`` (0: zeros). The band masks are cached in ``plan.cache``.
    """
    sliding_window = check_sliding_window(sliding_window)
    heads, dim_v, groups = q.shape[1], v.shape[-1], plan.groups
    gqa = {"enable_gqa": True} if k.shape[1] != heads else {}
    # One gather per tensor, split into groups (split's backward is one cat).
    qs = q.index_select(0, plan.q_index).split([n * m for n, m, _ in groups])
    ks, vs = (x.index_select(0, plan.k_index).split([n * p for n, _, p in groups]) for x in (k, v))
    outs = [v.new_zeros(1, heads, dim_v)]  # the zero row read by cells outside every block
    for (n, m, p), qg, kg, vg in zip(groups, qs, ks, vs, strict=True):
        qg = qg.view(n, m, heads, -1).transpose(1, 2)  # (n, H, m, D)
        kg, vg = (x.view(n, p, x.shape[1], -1).transpose(1, 2) for x in (kg, vg))  # (n, Hkv, P, D)
        mask: dict[str, Any] = {"is_causal": True}  # a whole segment (or root node)
        if m != p or (sliding_window is not None and p > sliding_window):
            key = (m, p, sliding_window, q.device)
            if key not in plan.cache:
                plan.cache[key] = band_mask(m, p, sliding_window, q.device)
            mask = {"attn_mask": plan.cache[key]}
        o = F.scaled_dot_product_attention(
            qg, kg, vg, dropout_p=dropout, scale=scale, **mask, **gqa
        )
        outs.append(o.transpose(1, 2).reshape(n * m, heads, dim_v))  # (n*m, H, Dv)
    return torch.cat(outs).index_select(0, plan.scatter)


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: AttentionLayout,
    scale: float,
    bucketing: str = "exact",
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Block-causal attention computed per segment group; ``q, k, v, out`` (R, H, T, D)."""
    rows, heads, width, _ = q.shape
    plan = varlen_plan(layout, bucketing)
    out = path_attention(as_tokens(q), as_tokens(k), as_tokens(v), plan, scale, sliding_window)
    return out.view(rows, width, heads, v.shape[-1]).transpose(1, 2)


register_backend("varlen", varlen_attention)
