"""Compute-balanced slots: a cost model from the model's config, and a balanced
Karmarkar–Karp partition of each optimizer step's rows.

Equal token counts are not equal work. Per token, the projections, the MLP (the
routed experts of a MoE) and the LM head cost ``linear`` FLOPs; attention costs
``quadratic`` FLOPs per (query, key) pair it scores. A causal segment of ``l``
tokens scores ``l(l+1)/2`` pairs; a tree node of ``n`` tokens under ``d`` ancestor
tokens scores ``n·d + n(n+1)/2`` (its path, not its row). Two rows of 4096 tokens::

    row A: one example of 4096        pairs 8,390,656
    row B: 64 examples of 64          pairs    133,120

cost the same under token balancing and differ 8.4 M pairs in attention work;
``CostModel.from_config(config).row_costs(stats)`` weighs both terms in FLOPs.

:func:`balanced_groups` splits a step's rows into ``slots`` groups of at most
``cap`` rows each, minimising the largest group cost: the balanced largest
differencing method (Karmarkar–Karp with equal cardinalities), then greedy LPT, the
better of the two kept.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactpack.core.errors import InvalidInput


def causal_pairs(lengths: Any, ancestors: Any = 0) -> np.ndarray:
    """Scored (query, key) pairs of causal units of ``lengths`` tokens, each under
    ``ancestors`` tokens of its path (0 for a flat example), float64.

    >>> causal_pairs([3, 2]).tolist(), causal_pairs([2], [3]).tolist()
    ([6.0, 3.0], [9.0])
    """
    n = np.asarray(lengths, dtype=np.float64)
    return n * np.asarray(ancestors, dtype=np.float64) + n * (n + 1) / 2


def _get(config: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
        if value is not None:
            return value
    return default


@dataclass(frozen=True)
class CostModel:
    """Forward FLOPs of a row: ``linear`` per token plus ``quadratic`` per scored pair
    (backward is about twice the forward for both terms, so ratios are unchanged)."""

    linear: float
    quadratic: float

    def __post_init__(self) -> None:
        for name in ("linear", "quadratic"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise InvalidInput(f"CostModel.{name} must be a number >= 0, got {value!r}")
            if not np.isfinite(value):
                raise InvalidInput(f"CostModel.{name} must be finite, got {value!r}")

    @classmethod
    def from_config(cls, config: Any) -> CostModel:
        """From a transformers config (or its dict): attention projections
        ``2·h·(2·q + 2·kv)`` and gated MLP ``6·h·I`` per layer — for a MoE the
        ``num_experts_per_tok`` routed experts, the shared ones and the router instead
        — plus the LM head ``2·h·V``; attention ``4·q`` per pair on each attention
        layer (``q``, ``kv``: heads × head_dim). Layers whose ``layer_types`` entry is
        not attention (linear attention, mamba, conv) add no quadratic term."""
        h = _get(config, "hidden_size", "n_embd", "d_model")
        layers = _get(config, "num_hidden_layers", "n_layer", "num_layers")
        if not isinstance(h, int) or not isinstance(layers, int) or h < 1 or layers < 1:
            raise InvalidInput(
                "the config has no hidden_size and num_hidden_layers: pass a transformers"
                " config (model.config) or CostModel(linear=..., quadratic=...)"
            )
        heads = _get(config, "num_attention_heads", "n_head", default=1)
        kv_heads = _get(config, "num_key_value_heads", default=heads)
        head_dim = _get(config, "head_dim", default=h // max(heads, 1))
        q, kv = heads * head_dim, kv_heads * head_dim
        experts = _get(config, "num_experts", "n_routed_experts", "num_local_experts", default=0)
        per_tok = _get(config, "num_experts_per_tok", "moe_topk", default=0)
        if experts and per_tok:
            width = _get(config, "moe_intermediate_size", "intermediate_size", default=4 * h)
            shared = _get(config, "n_shared_experts", "num_shared_experts", default=0) or 0
            shared_width = _get(config, "shared_expert_intermediate_size", default=0) or 0
            mlp = 6 * h * (per_tok * width + shared * width + shared_width) + 2 * h * experts
        else:
            mlp = 6 * h * _get(config, "intermediate_size", "n_inner", default=4 * h)
        kinds = list(_get(config, "layer_types", default=None) or ["full_attention"] * layers)
        attention = sum(1 for k in kinds if "attention" in str(k) and "linear" not in str(k))
        vocab = _get(config, "vocab_size", default=0) or 0
        linear = layers * (2 * h * (2 * q + 2 * kv) + mlp) + 2 * h * vocab
        return cls(linear=float(linear), quadratic=float(4 * q * attention))

    def costs(self, tokens: Any, pairs: Any) -> np.ndarray:
        """FLOPs of units (rows, nodes) of ``tokens`` tokens scoring ``pairs`` pairs."""
        tokens = np.asarray(tokens, dtype=np.float64)
        return self.linear * tokens + self.quadratic * np.asarray(pairs, dtype=np.float64)

    def row_costs(self, stats: Any) -> np.ndarray:
        """Per row of a :class:`~exactpack.training.distributed.RowStats`: its pairs are
        ``(Σl² + Σl) / 2`` (its ``attention`` and ``tokens``)."""
        tokens = np.asarray(stats.tokens, dtype=np.float64)
        return self.costs(tokens, (np.asarray(stats.attention, np.float64) + tokens) / 2)


def greedy_groups(costs: np.ndarray, slots: int, cap: int) -> list[list[int]]:
    """Greedy (LPT): each index, heaviest first (stable), into the open slot of least load
    (ties: lowest slot), at most ``cap`` a slot; each group in placing order."""
    groups: list[list[int]] = [[] for _ in range(slots)]
    heap = [(0.0, s) for s in range(slots)]
    for i in np.argsort(-costs, kind="stable").tolist():
        total, target = heapq.heappop(heap)
        groups[target].append(i)
        if len(groups[target]) < cap:
            heapq.heappush(heap, (total + float(costs[i]), target))
    return groups


def _ldm(costs: np.ndarray, slots: int, cap: int) -> list[list[int]]:
    """Balanced largest differencing: pad to ``slots·cap`` items with zeros, start from
    ``cap`` partial partitions of ``slots`` items each (one item a subset, by size),
    and repeatedly merge the two of largest spread, largest subset with smallest."""
    order = np.argsort(-costs, kind="stable").tolist()
    order += [-1] * (slots * cap - len(order))  # zero-cost fillers
    heap: list[tuple[float, int, list[tuple[float, list[int]]]]] = []
    for c in range(cap):
        chunk = order[c * slots : (c + 1) * slots]
        part = [(float(costs[i]) if i >= 0 else 0.0, [i] if i >= 0 else []) for i in chunk]
        part.sort(key=lambda s: -s[0])
        heapq.heappush(heap, (-(part[0][0] - part[-1][0]), c, part))
    tie = cap
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = [(x[0] + y[0], x[1] + y[1]) for x, y in zip(a, reversed(b), strict=True)]
        merged.sort(key=lambda s: -s[0])
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), tie, merged))
        tie += 1
    return [sorted(members) for _, members in heap[0][2]] if heap else [[] for _ in range(slots)]


def _refine(costs: np.ndarray, groups: list[list[int]], cap: int) -> list[list[int]]:
    """Moves and swaps between the largest group and another that lower the larger of
    the two, best first, until none does (each one lowers the sorted loads, so it ends;
    bounded all the same)."""
    loads = [float(costs[g].sum()) for g in groups]
    for _ in range(4 * (len(costs) + 1)):
        top = max(range(len(groups)), key=loads.__getitem__)
        best: tuple[float, int, int, int] | None = None  # (pair max, other, i, j or -1)
        for other, members in enumerate(groups):
            if other == top:
                continue
            for i in groups[top]:
                options = [(j, float(costs[j])) for j in members]
                if len(members) < cap:
                    options.append((-1, 0.0))
                for j, cj in options:
                    delta = float(costs[i]) - cj
                    pair = max(loads[top] - delta, loads[other] + delta)
                    if delta > 0 and pair < loads[top] and (best is None or pair < best[0]):
                        best = (pair, other, i, j)
        if best is None:
            break
        _, other, i, j = best
        groups[top].remove(i)
        groups[other].append(i)
        if j >= 0:
            groups[other].remove(j)
            groups[top].append(j)
        moved = float(costs[i]) - (float(costs[j]) if j >= 0 else 0.0)
        loads[top] -= moved
        loads[other] += moved
    return [sorted(g) for g in groups]


def balanced_groups(costs: Any, slots: int, cap: int) -> list[list[int]]:
    """Indices of ``costs`` in ``slots`` groups of at most ``cap`` each (``slots·cap`` ≥
    the number of items), minimising the largest group's cost: balanced Karmarkar–Karp
    and LPT, each refined by moves and swaps, the better kept. Each group ascending.

    >>> balanced_groups([8, 7, 6, 5, 4], 2, 3)  # 15 + 15 (KK alone: 16 + 14)
    [[2, 3, 4], [0, 1]]
    """
    costs = np.asarray(costs, dtype=np.float64)
    if costs.ndim != 1 or (costs.size and (not np.isfinite(costs).all() or costs.min() < 0)):
        raise InvalidInput("costs must be finite numbers >= 0, one per row")
    if slots < 1 or cap < 1 or slots * cap < costs.size:
        raise InvalidInput(f"{costs.size} rows do not fit {slots} slots of {cap} rows")
    best: list[list[int]] | None = None
    for method in (_ldm, greedy_groups):
        groups = _refine(costs, [list(g) for g in method(costs, slots, cap)], cap)
        largest = max((float(costs[g].sum()) for g in groups), default=0.0)
        if best is None or largest < max(float(costs[g].sum()) for g in best):
            best = groups
    assert best is not None
    return best


def largest_share(costs: Any, groups: list[list[int]]) -> float:
    """The largest group's cost over the mean group's (1.0: perfectly balanced)."""
    costs = np.asarray(costs, dtype=np.float64)
    loads = np.array([costs[g].sum() for g in groups])
    return float(loads.max() / loads.mean()) if loads.size and loads.mean() > 0 else 1.0


__all__ = ["CostModel", "balanced_groups", "causal_pairs", "greedy_groups", "largest_share"]
