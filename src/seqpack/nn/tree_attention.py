"""Attention over tree-packed rows: each node's queries against its path, never ``T^2``.

A node of ``m`` cells whose path (its ancestors' cells, root first, then its own) holds
``P`` cells attends with one ``(m, P)`` block, its queries at path positions
``P-m .. P-1`` (:func:`~seqpack.nn.varlen.grouped_attention`, shared with ``varlen``);
nodes of the same ``(m, P)`` share one SDPA call. For the layout drawn in
:mod:`seqpack.core.tree`::

    node 0 (cols 0-2)  queries 0-2  keys 0-2          3 x 3
    node 1 (col 3)     query 3      keys 0-3          1 x 4
    node 2 (cols 4-5)  queries 4-5  keys 0-3, 4-5     2 x 6
    node 3 (col 6)     query 6      keys 0-3, 6       1 x 5
    node 4 (cols 7-8)  queries 7-8  keys 0-2, 7-8     2 x 5      (36 of 81 dense cells)

Gather indices are built once per batch (:func:`tree_plan`); a shared prefix gets its
gradient once per consumer (``index_select``'s backward adds them), which is the flat
objective's gradient. Also: the FlexAttention ``mask_mod``, the weighted loss over tree
cells, and per-sequence views (:func:`token_logprobs`, :func:`sequence_logprobs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from seqpack.core.examples import concat_ranges
from seqpack.core.loss import check_logits, eligible_nll
from seqpack.core.tree import TreeBatch, tree_loss, tree_loss_sum
from seqpack.nn.flex import permission_mod
from seqpack.nn.varlen import grouped_attention


@dataclass(frozen=True, eq=False)
class TreePlan:
    """Gather/scatter indices of one tree batch (flat cells ``R*T``), shared by all layers.

    ``groups``: per call ``(n, m, P, q_index (n*m,), k_index (n*P,))``;
    ``scatter`` int64 (R*T,): ``1 +`` the output slot of each stored cell, 0
    (the zero row) for padding; ``score_cells``: ``Σ m × P``; ``cache``: the
    block masks and concatenated gathers, built on first use.
    """

    groups: tuple[tuple[int, int, int, torch.Tensor, torch.Tensor], ...]
    scatter: torch.Tensor
    cells: int
    score_cells: int
    cache: dict = field(default_factory=dict, repr=False)

    def gathers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All groups' query and key indices, concatenated (cached)."""
        if "gathers" not in self.cache:
            self.cache["gathers"] = (
                torch.cat([g[3] for g in self.groups]),
                torch.cat([g[4] for g in self.groups]),
            )
        return self.cache["gathers"]


def node_keys(batch: TreeBatch) -> tuple[np.ndarray, np.ndarray]:
    """Per node: the flat cells of its path (ancestors' spans root first, then its own).

    Returns ``(cells, bounds)``, int64 [Σ P] and [M+1]. Nodes are in
    pre-order, so a parent's path is known before its children's.
    """
    first = batch.node_row * batch.shape[1] + batch.node_col
    paths: list[list[int]] = []
    for n, parent in enumerate(batch.node_parent.tolist()):
        paths.append([*paths[parent], n] if parent >= 0 else [n])
    order = np.fromiter((a for path in paths for a in path), dtype=np.int64)
    lens = batch.node_len[order].astype(np.int64)
    sizes = np.fromiter(map(len, paths), dtype=np.int64, count=len(paths))
    path_len = np.add.reduceat(lens, np.r_[0, np.cumsum(sizes)[:-1]]) if paths else lens
    return concat_ranges(first[order], lens), np.r_[0, np.cumsum(path_len)].astype(np.int64)


def tree_plan(batch: TreeBatch, device: torch.device | str | None = None) -> TreePlan:
    """The (m, P)-grouped gather/scatter plan of ``batch``."""
    keys, bounds = node_keys(batch)
    first = batch.node_row * batch.shape[1] + batch.node_col
    m, p = batch.node_len.astype(np.int64), np.diff(bounds)
    shapes, inverse = np.unique(np.stack([m, p], axis=1), axis=0, return_inverse=True)
    scatter = np.zeros(batch.shape[0] * batch.shape[1], dtype=np.int64)
    groups, slot = [], 0
    for g, (mg, pg) in enumerate(shapes.tolist()):
        members = np.flatnonzero(inverse.reshape(-1) == g)
        q_index = (first[members][:, None] + np.arange(mg)).reshape(-1)
        k_index = (bounds[members][:, None] + np.arange(pg)).reshape(-1)
        scatter[q_index] = slot + 1 + np.arange(q_index.shape[0])
        slot += q_index.shape[0]
        q_t, k_t = (torch.as_tensor(x, device=device) for x in (q_index, keys[k_index]))
        groups.append((int(members.shape[0]), int(mg), int(pg), q_t, k_t))
    cells = int(scatter.shape[0])
    return TreePlan(tuple(groups), torch.as_tensor(scatter, device=device), cells, int(m @ p))


def tree_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: TreePlan,
    scale: float,
    window: int | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Attention of tokens ``q`` (N, H, D), ``k``/``v`` (N, Hkv, D) under ``plan``: (N, H, Dv)."""
    groups = [(n, m, p) for n, m, p, _, _ in plan.groups]
    q_index, k_index = plan.gathers()
    return grouped_attention(
        q, k, v, groups, q_index, k_index, plan.scatter, scale, window, dropout, plan.cache
    )


def tree_mask_mod(
    valid: torch.Tensor,
    nodes: torch.Tensor,
    node_ends: torch.Tensor,
    positions: torch.Tensor,
    window: int | None = None,
) -> Any:
    """:func:`~seqpack.core.permission.permitted` on a tree row as a FlexAttention
    ``mask_mod`` over (R, T): :func:`~seqpack.nn.flex.permission_mod` with node ends."""
    return permission_mod(valid, nodes, positions, window, node_ends)


def cell_logprobs(logits: torch.Tensor, batch: TreeBatch) -> torch.Tensor:
    """Log-probability of each stored cell's target, (R*T,) (0 at padding, never computed)."""
    check_logits(logits, batch.shape, batch.binding.vocab_size)
    cells, nll = eligible_nll(logits, batch.targets, batch.input_valid)
    index = torch.as_tensor(cells, device=logits.device)
    return nll.new_zeros(batch.inputs.size).index_copy(0, index, -nll)


def _per_sequence(logits: torch.Tensor, batch: TreeBatch) -> torch.Tensor:
    """Each sequence's target log-probs, concatenated in layout order, (Σ L,)."""
    index = torch.as_tensor(batch.seq_cells, device=logits.device)
    return cell_logprobs(logits, batch).index_select(0, index)


def token_logprobs(logits: torch.Tensor, batch: TreeBatch) -> list[torch.Tensor]:
    """Per original sequence (layout order, ``batch.seq_index``): its targets' log-probs, (L,)."""
    return list(_per_sequence(logits, batch).split(np.diff(batch.seq_bounds).tolist()))


def sequence_logprobs(logits: torch.Tensor, batch: TreeBatch) -> torch.Tensor:
    """Sum of each original sequence's supervised target log-probs, (S,) in layout order.

    The DPO / SimPO / reward-model quantity: ``Σ log p(target)`` over the
    cells where the sequence's own loss mask is True.
    """
    mask = torch.as_tensor(batch.seq_loss_mask, device=logits.device)
    flat = _per_sequence(logits, batch) * mask
    owner = np.repeat(np.arange(batch.seq_index.shape[0]), np.diff(batch.seq_bounds))
    owner = torch.as_tensor(owner, device=logits.device)
    return flat.new_zeros(batch.seq_index.shape[0]).index_add(0, owner, flat)


__all__ = [
    "TreePlan",
    "cell_logprobs",
    "node_keys",
    "sequence_logprobs",
    "token_logprobs",
    "tree_attention",
    "tree_loss",
    "tree_loss_sum",
    "tree_mask_mod",
    "tree_plan",
]
