"""``varlen``: attention inside each segment's causal block only, in pure PyTorch.

The dense backend scores the whole ``R*T^2`` rectangle and masks most of it;
this one visits ``Σ l^2`` cells. Segments are contiguous in their row, so a
segment is the cells ``[start, start + l)`` of the flat ``R*T`` cell axis and
its block is plain causal attention over them. Segments of equal length
(``bucketing="exact"``, the default) are stacked into one
``scaled_dot_product_attention`` call on 4-D ``(n, H, L, D)`` inputs with
``is_causal=True`` (4-D inputs are ~10x faster than 3-D on CPU; nested
jagged tensors reject causal attention on CPU).

``bucketing="bucket"`` also stacks similar lengths: a segment shorter than
its group's ``L`` is right-padded by repeating its own last cell, so causal
attention never lets a real query see the pad, the padded queries' outputs
are dropped, and a group never reads another segment's cells. Measured on
this CPU it was never faster than ``exact`` (README, "Attention
backends"). The fixture (A = cells 0-2, B = 3-4, C = 6-9 of the flat
``2*6`` cells; 5, 10, 11 padding) under ``exact``::

    group (n=1, L=4): C -> cells [6, 7, 8, 9]
    group (n=1, L=3): A -> cells [0, 1, 2]
    group (n=1, L=2): B -> cells [3, 4]
    scatter: cells 5, 10, 11 (padding) read the zero row

All index tensors are built once per layout (:func:`varlen_plan`, cached in
``AttentionLayout.cache``) and reused by every layer; a call costs one gather
of ``q, k, v``, one SDPA per group and one gather back.

With a ``window`` shorter than a group's ``L``, that group's call takes the
``(L, L)`` band of :func:`~seqpack.core.permission.permitted` over local
positions ``0..L-1`` as its boolean mask instead of ``is_causal`` (a group
no longer than the window is plain causal attention). The same plan serves
``cu_seqlens`` alone (:func:`segment_plan`): the registered ``transformers``
attention function (:mod:`seqpack.hf.attention_impl`) runs on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from seqpack.core.errors import InvalidInput
from seqpack.core.permission import check_window, permitted
from seqpack.nn.attention import AttentionLayout, register_backend

#: Bucketing policies: one call per segment, one per distinct length (the
#: default: fastest or tied in every measurement, see README), or the
#: cost-model grouping of similar lengths with padding.
BUCKETING = ("segment", "exact", "bucket")

#: Cost model of one fused SDPA forward+backward call on ``n`` segments
#: padded to ``L``: ``CALL_COST + n * L * (L + TOKEN_COST)`` score cells.
#: Fitted on this machine's CPU (H=4, D=64, float32, one thread): a call
#: costs ~28 us, a score cell ~0.025 us, a token ~1.2 us.
CALL_COST = 1024
TOKEN_COST = 48


@dataclass(frozen=True)
class VarlenPlan:
    """Gather/scatter indices of one layout, shared by all layers and heads.

    ``gather`` int64 (P,): flat cell (into ``R*T``) of each padded slot,
    groups laid out one after another, each as ``n`` segments of ``L`` slots;
    ``scatter`` int64 (R*T,): ``1 +`` the slot holding each valid cell's
    output, ``0`` (the zero row) for padding; ``groups``: ``(n, L)`` per call.
    """

    gather: torch.Tensor
    scatter: torch.Tensor
    groups: tuple[tuple[int, int], ...]

    @property
    def padded_slots(self) -> int:
        return int(self.gather.shape[0])


def group_segments(
    lengths: np.ndarray,
    bucketing: str = "exact",
    call_cost: float = CALL_COST,
    token_cost: float = TOKEN_COST,
) -> list[np.ndarray]:
    """Partition segment indices into SDPA calls; each group is sorted longest first.

    ``segment``: one call per segment. ``exact``: one call per distinct
    length (no padding). ``bucket``: the longest-first contiguous grouping
    of minimum modelled cost ``Σ_g call_cost + n_g * L_g * (L_g + token_cost)``
    (dynamic programming over the distinct lengths; merging equal lengths
    is always cheaper, so ``bucket`` never makes more calls than ``exact``).

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
) -> VarlenPlan:
    """Gather/scatter plan of segments ``[starts[s], starts[s] + lengths[s])`` of ``cells``.

    ``starts``, ``lengths`` int64 (S,): each segment's first flat cell and
    length (contiguous cells; positions ``0..l-1``); cells outside every
    segment read the zero row.
    """
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
        groups.append((n, size))
        offset += n * size
    gather = np.concatenate(gather_parts) if gather_parts else np.zeros(0, dtype=np.int64)
    return VarlenPlan(
        gather=torch.as_tensor(gather, device=device),
        scatter=torch.as_tensor(scatter, device=device),
        groups=tuple(groups),
    )


def varlen_plan(layout: AttentionLayout, bucketing: str = "exact") -> VarlenPlan:
    """The (cached) gather/scatter plan of ``layout`` under ``bucketing``."""
    key = f"varlen:{bucketing}"
    if key not in layout.cache:
        rows, width = layout.shape
        cu = layout.cu_seqlens.cpu().numpy().astype(np.int64)
        starts = layout.valid_index.cpu().numpy()[cu[:-1]]  # flat cell of each position 0
        layout.cache[key] = segment_plan(
            starts, layout.lengths, rows * width, layout.valid.device, bucketing
        )
    return layout.cache[key]


def band_mask(size: int, window: int, device: torch.device | str | None = None) -> torch.Tensor:
    """bool (L, L): :func:`~seqpack.core.permission.permitted` inside one segment of ``size``."""
    pos = torch.arange(size, device=device)
    live = torch.ones(size, dtype=torch.bool, device=device)
    seg = torch.zeros(size, dtype=torch.int64, device=device)
    return permitted(live[:, None], live, seg[:, None], seg, pos[:, None], pos, window)


def segment_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: VarlenPlan,
    scale: float,
    window: int | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Causal attention inside each segment of ``plan``, over tokens.

    ``q`` (N, H, D), ``k``/``v`` (N, Hkv, D) where ``Hkv`` divides ``H``
    (grouped-query attention). Returns ``(N, H, Dv)``
    with zeros at cells outside every segment.
    """
    window = check_window(window)
    heads, dim_v = q.shape[1], v.shape[-1]
    gqa = {"enable_gqa": True} if k.shape[1] != heads else {}
    # One gather per tensor, split into groups: split's backward is a single
    # cat, where narrowing each group would zero-fill a full-size gradient per call.
    sizes = [n * size for n, size in plan.groups]
    parts = zip(
        *(x.index_select(0, plan.gather).split(sizes) for x in (q, k, v)), plan.groups, strict=True
    )
    outs = [v.new_zeros(1, heads, dim_v)]  # the zero row read by cells outside segments
    for qg, kg, vg, (n, size) in parts:

        def block(x: torch.Tensor, n: int = n, size: int = size) -> torch.Tensor:
            return x.view(n, size, x.shape[1], x.shape[-1]).transpose(1, 2)  # (n, H, L, D)

        mask = {"is_causal": True}
        if window is not None and size > window:
            mask = {"attn_mask": band_mask(size, window, q.device)}
        o = F.scaled_dot_product_attention(
            block(qg), block(kg), block(vg), dropout_p=dropout, scale=scale, **mask, **gqa
        )
        outs.append(o.transpose(1, 2).reshape(n * size, heads, dim_v))  # (n*L, H, Dv)
    return torch.cat(outs).index_select(0, plan.scatter)


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: AttentionLayout,
    scale: float,
    bucketing: str = "exact",
    window: int | None = None,
) -> torch.Tensor:
    """Block-causal attention computed per segment group; ``q, k, v, out`` (R, H, T, D)."""
    rows, heads, width, _ = q.shape
    plan = varlen_plan(layout, bucketing)

    def tokens(x: torch.Tensor) -> torch.Tensor:  # (R, H, T, D) -> (R*T, H, D)
        return x.transpose(1, 2).reshape(rows * width, x.shape[1], x.shape[-1])

    out = segment_attention(tokens(q), tokens(k), tokens(v), plan, scale, window)
    return out.view(rows, width, heads, v.shape[-1]).transpose(1, 2)


register_backend("varlen", varlen_attention)
