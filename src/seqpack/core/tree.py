"""Tree packing: sequences that share a prefix store it once, every branch exact.

Groups of token sequences (a prompt and its completions, a DPO pair, an SFT
question with many answers) become compressed prefix tries built from the
actual tokens (:mod:`seqpack.core.trie`). Each trie is one packing unit:
laid out depth-first in one row, node spans contiguous, positions the depth
along the path. One prompt ``P = p0..p3`` and three completions ``a b c``,
``a d``, ``e f`` (two share their first token ``a``), capacity 12::

    column     0   1   2   3   4   5   6   7   8   9  10  11
    input     p0  p1  p2  p3   a   b   a  p3   e   .   .   .
    target    p1  p2  p3   a   b   c   d   e   f   .   .   .
    position   0   1   2   3   4   5   4   3   4   .   .   .
    node       0   0   0   1   2   2   3   4   4   .   .   .
    node_end   5   5   5   4   3   3   4   5   5   .   .   .
    weight     0   0   0   2   1   1   1   1   1   .   .   .   (prompt not supervised)

    node tree:  0 (p0..p2, all three) ── 1 (p3→a, shared by 1st and 2nd)
                                        ├── 2 (a→b, b→c)
                                        └── 3 (a→d)
                 0 ── 4 (p3→e, e→f)

Attention (:func:`seqpack.core.permission.permitted`): a key is allowed
when its node is an ancestor-or-self of the query's node
(``node[k] <= node[q] < node_end[k]``), both valid, and
``0 <= pos[q] - pos[k] < window``. Column 6 (``a→d``) sees columns 0-3 and
itself, never 4-5 (its sibling). The pair from the last shared token to
each branch's first token exists once per branch: ``p3`` is stored in
node 1 (target ``a``) and again at the head of node 4 (target ``e``), ``a``
at the head of nodes 2 and 3. A cell shared by ``m`` sequences carries
weight ``m`` for each that supervises its target, so the token-weighted
loss ``Σ weight·nll / Σ weight`` equals the flat packing's objective over
the original sequences: flat packing stores 16 cells, 7 of them supervised
(the prompt's targets are not); the tree stores 9, with
``N = Σ weight = 2+1+1+1+1+1 = 7``.

:func:`pack_tree` plans tries with any flat policy (a trie is one unit of
its stored size; a trie larger than the capacity is split into sub-tries
that repeat their shared prefix) and materialises :class:`TreeBatch` model
calls. Each batch keeps every original sequence's cells
(``seq_cells``), so logits unpack to per-sequence views exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from seqpack.core.binding import Binding
from seqpack.core.errors import EmptyObjective, InvalidInput
from seqpack.core.permission import check_window, pairwise
from seqpack.core.plan import Plan
from seqpack.core.policies import plan_rows
from seqpack.core.tree_input import SequenceGroups
from seqpack.core.trie import (
    TrieLayout,
    adjacent_lcp,
    group_bounds,
    layout_tries,
    split_oversized,
    trie_order,
)

NO_NODE = -1


@dataclass(frozen=True, eq=False)
class TreeBatch:
    """One model call of tree-packed rows.

    Cells [R, T]: ``inputs``/``targets`` int32 (-1 on padding), ``nodes``
    int32 (pre-order node id, -1 on padding), ``node_ends`` int32 (the
    cell's node exit), ``positions`` int32 (depth along the path),
    ``input_valid``/``loss_mask`` bool, ``weights`` int32 (how many original
    sequences supervise the cell's target). Nodes [M]: ``node_row``,
    ``node_col``, ``node_len``, ``node_pos``, ``node_parent`` (-1: root),
    ``node_end``. Sequences [S] in layout order: ``seq_index`` (index in the
    supplied sequences), ``seq_group``, ``seq_bounds`` [S+1] into
    ``seq_cells`` (flat cell index ``row * T + column`` of each of the
    sequence's cells, depth order) and ``seq_loss_mask`` (its own targets'
    supervision).
    """

    inputs: np.ndarray
    targets: np.ndarray
    nodes: np.ndarray
    node_ends: np.ndarray
    positions: np.ndarray
    input_valid: np.ndarray
    loss_mask: np.ndarray
    weights: np.ndarray
    node_row: np.ndarray
    node_col: np.ndarray
    node_len: np.ndarray
    node_pos: np.ndarray
    node_parent: np.ndarray
    node_end: np.ndarray
    seq_index: np.ndarray
    seq_group: np.ndarray
    seq_bounds: np.ndarray
    seq_cells: np.ndarray
    seq_loss_mask: np.ndarray
    binding: Binding
    first_row: int = 0

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.inputs.shape[0]), int(self.inputs.shape[1]))

    @property
    def segments(self) -> np.ndarray:
        """The permission's node ids (the flat batch's name for them)."""
        return self.nodes

    @property
    def eligible_count(self) -> int:
        """N: supervised targets of the original sequences (``Σ weights``)."""
        return int(self.weights.sum())

    @property
    def tokens_stored(self) -> int:
        return int(self.input_valid.sum())

    @property
    def tokens_flat(self) -> int:
        """Cells flat packing would store for the same sequences."""
        return int(self.seq_bounds[-1])

    def position_ids(self) -> np.ndarray:
        return np.where(self.input_valid, self.positions, 0).astype(np.int64)

    def dense_mask(self, window: int | None = None) -> np.ndarray:
        """:func:`~seqpack.core.permission.permitted` over every pair, bool [R, T, T]."""
        return pairwise(
            self.input_valid, self.nodes, self.positions, check_window(window), self.node_ends
        )

    def allowed_key(self, row: int, query: int, key: int, window: int | None = None) -> bool:
        return bool(self.dense_mask(window)[row, query, key])

    def node_path(self, node: int) -> np.ndarray:
        """Node ids from the root down to ``node`` (inclusive), int64."""
        path = []
        while node >= 0:
            path.append(node)
            node = int(self.node_parent[node])
        return np.asarray(path[::-1], dtype=np.int64)

    def key_spans(self, row: int, query: int, window: int | None = None) -> list[tuple[int, int]]:
        """The keys of one query as column spans ``[start, end)``: its ancestors' nodes, root
        first, then its own node up to itself, each clipped to the window; ``[]`` on padding."""
        window = check_window(window)
        node = int(self.nodes[row, query])
        if node < 0 or not self.input_valid[row, query]:
            return []
        pos_q = int(self.positions[row, query])
        lowest = -(2**62) if window is None else pos_q - window + 1
        spans = []
        for n in self.node_path(node):
            col, pos = int(self.node_col[n]), int(self.node_pos[n])
            end = query + 1 if n == node else col + int(self.node_len[n])
            start = col + max(0, lowest - pos)
            if start < end:
                spans.append((start, end))
        return spans

    def sequence_cells(self, i: int) -> np.ndarray:
        """Flat cell indices of sequence ``i`` (layout order in this batch), int64 [L]."""
        return self.seq_cells[self.seq_bounds[i] : self.seq_bounds[i + 1]]


@dataclass(frozen=True, eq=False)
class TreeEpoch:
    """Every model call of one tree packing, with the layout and the plan of its tries."""

    batches: list[TreeBatch]
    layout: TrieLayout
    plan: Plan

    def stats(self) -> dict[str, Any]:
        """tokens_stored / tokens_flat (cells), rows, tries, nodes, sequences."""
        stored, flat = int(self.layout.sizes.sum()), self.layout.flat_cells
        return {
            "sequences": int(self.layout.lengths.shape[0]),
            "tries": int(self.layout.sizes.shape[0]),
            "nodes": int(self.layout.node_len.shape[0]),
            "tokens_stored": stored,
            "tokens_flat": flat,
            "stored_over_flat": stored / flat if flat else 0.0,
            "rows": self.plan.num_rows,
            "capacity": self.plan.capacity,
        }


def plan_tries(
    lengths: np.ndarray, lcp: np.ndarray, seq_bounds: np.ndarray, capacity: int
) -> TrieLayout:
    """Integer-only planning: split oversized tries, then lay every trie out (vectorised)."""
    lcp, seq_bounds = split_oversized(lengths, lcp, seq_bounds, capacity)
    return layout_tries(lengths, lcp, seq_bounds)


def build_layout(groups: SequenceGroups, capacity: int) -> TrieLayout:
    """The tries of ``groups`` (from their tokens) laid out for rows of ``capacity`` cells."""
    bounds = group_bounds(groups.group)
    order = trie_order(groups.tokens, groups.offsets, bounds)
    lcp = adjacent_lcp(groups.tokens, groups.offsets, order, bounds)
    lengths = groups.lengths[order]
    layout = plan_tries(lengths, lcp, bounds, capacity)
    return _with_order(layout, order)


def _with_order(layout: TrieLayout, order: np.ndarray) -> TrieLayout:
    fields = {name: getattr(layout, name) for name in layout.__dataclass_fields__}
    fields["order"] = order
    return TrieLayout(**fields)


def pack_tree(
    groups: SequenceGroups,
    capacity: int,
    *,
    policy: str = "next-fit",
    max_rows_per_batch: int | None = None,
    **policy_options: Any,
) -> TreeEpoch:
    """Tree-pack ``groups`` into rows of ``capacity`` cells, in model calls of at most
    ``max_rows_per_batch`` rows (default: one call). Any flat policy places the tries."""
    layout = build_layout(groups, capacity)
    plan = plan_rows(layout.sizes, capacity, policy, **policy_options)
    rows_per = max_rows_per_batch or max(plan.num_rows, 1)
    order = plan.row_order()
    bounds = np.searchsorted(plan.row_of[order], np.arange(0, plan.num_rows + rows_per, rows_per))
    batches = []
    for b, first in enumerate(range(0, plan.num_rows, rows_per)):
        rows = min(rows_per, plan.num_rows - first)
        tries = order[bounds[b] : bounds[b + 1]]
        batches.append(materialize(groups, layout, plan, tries, first, rows))
    return TreeEpoch(batches, layout, plan)


def _ranges(starts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Owner index and offset of every element of ranges ``[starts, starts + lens)``."""
    owner = np.repeat(np.arange(lens.shape[0], dtype=np.int64), lens)
    firsts = np.zeros(lens.shape[0], dtype=np.int64)
    np.cumsum(lens[:-1], out=firsts[1:])
    return owner, np.arange(int(lens.sum()), dtype=np.int64) - firsts[owner]


def materialize(
    groups: SequenceGroups,
    layout: TrieLayout,
    plan: Plan,
    tries: np.ndarray,
    first_row: int,
    rows: int,
) -> TreeBatch:
    """The cells of ``tries`` (placed by ``plan`` in rows ``first_row..+rows``), vectorised."""
    width = plan.capacity
    tries = tries[np.lexsort((plan.start_of[tries], plan.row_of[tries]))]
    base = (plan.row_of[tries] - first_row) * width + plan.start_of[tries]  # flat cell of col 0
    base_of = np.zeros(layout.sizes.shape[0], dtype=np.int64)
    base_of[tries] = base
    shape = (rows, width)
    cells = rows * width
    # Owned spans: every stored cell, its token from the sequence that owns it.
    seqs = np.concatenate(
        [np.arange(layout.seq_bounds[t], layout.seq_bounds[t + 1]) for t in tries]
    ).astype(np.int64)
    own = layout.lengths[seqs] - layout.lcp[seqs]
    owner, local = _ranges(np.zeros_like(own), own)
    dest = base_of[layout.trie[seqs]][owner] + layout.own_col[seqs][owner] + local
    depth = layout.lcp[seqs][owner] + local
    src = groups.offsets[layout.order[seqs]][owner] + depth
    inputs = np.full(cells, -1, dtype=np.int32)
    targets = np.full(cells, -1, dtype=np.int32)
    positions = np.zeros(cells, dtype=np.int32)
    valid = np.zeros(cells, dtype=bool)
    inputs[dest], targets[dest] = groups.tokens[src], groups.tokens[src + 1]
    positions[dest], valid[dest] = depth, True
    # Nodes, renumbered in (row, column) order: each trie keeps one contiguous id range.
    lo, hi = layout.node_bounds[tries], layout.node_bounds[tries + 1]
    counts = hi - lo
    new_base = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    t_of, k = _ranges(lo, counts)
    gids = lo[t_of] + k
    shift = (new_base - lo)[t_of]
    parent = layout.node_parent[gids]
    node_parent = np.where(parent >= 0, parent + shift, -1)
    node_end = layout.node_end[gids] + shift
    node_flat = base[t_of] + layout.node_col[gids]
    nodes = np.full(cells, -1, dtype=np.int32)
    node_ends = np.full(cells, -1, dtype=np.int32)
    n_of, off = _ranges(node_flat, layout.node_len[gids])
    nodes[node_flat[n_of] + off] = n_of
    node_ends[node_flat[n_of] + off] = node_end[n_of]
    # Every sequence's own cells, and the weights of the targets it supervises.
    cols, seq_bounds = layout.path_columns(seqs)
    seq_cells = np.repeat(base_of[layout.trie[seqs]], layout.lengths[seqs]) + cols
    mask = groups.pair_mask(layout.order[seqs])
    weights = np.bincount(seq_cells[mask], minlength=cells).astype(np.int32)
    return TreeBatch(
        inputs=inputs.reshape(shape),
        targets=targets.reshape(shape),
        nodes=nodes.reshape(shape),
        node_ends=node_ends.reshape(shape),
        positions=positions.reshape(shape),
        input_valid=valid.reshape(shape),
        loss_mask=(weights > 0).reshape(shape),
        weights=weights.reshape(shape),
        node_row=node_flat // width,
        node_col=node_flat % width,
        node_len=layout.node_len[gids],
        node_pos=layout.node_pos[gids],
        node_parent=node_parent,
        node_end=node_end,
        seq_index=layout.order[seqs],
        seq_group=groups.group[layout.order[seqs]],
        seq_bounds=seq_bounds,
        seq_cells=seq_cells,
        seq_loss_mask=mask,
        binding=groups.binding,
        first_row=first_row,
    )


def tree_loss(logits: np.ndarray, batch: TreeBatch) -> dict[str, float]:
    """Float64 reference: ``Σ weight·nll / Σ weight`` over the supervised cells (logits NumPy).

    Cells outside the loss are never read, so a NaN in a padding cell does not matter.
    """
    n = batch.eligible_count
    if n == 0:
        raise EmptyObjective(
            "this tree batch has 0 supervised targets — skip it or accumulate raw sums"
        )
    cells = np.flatnonzero(batch.loss_mask)
    rows = np.asarray(logits, dtype=np.float64).reshape(-1, logits.shape[-1])[cells]
    gold = batch.targets.reshape(-1)[cells].astype(np.int64)
    top = rows.max(axis=1, keepdims=True)
    nll = top[:, 0] + np.log(np.exp(rows - top).sum(axis=1)) - rows[np.arange(cells.size), gold]
    total = float(np.sum(nll * batch.weights.reshape(-1)[cells]))
    return {"sum": total, "count": n, "mean": total / n}


def from_lists(
    groups: Sequence[Sequence[Any]],
    binding: Binding,
    loss_masks: Sequence[Sequence[Any]] | None = None,
) -> SequenceGroups:
    """Shorthand for :meth:`SequenceGroups.from_lists`."""
    return SequenceGroups.from_lists(groups, binding, loss_masks)


def check_tree_batch(batch: Any) -> TreeBatch:
    if not isinstance(batch, TreeBatch):
        raise InvalidInput(f"expected a TreeBatch (from pack_tree), got {type(batch).__name__}")
    return batch


__all__ = [
    "NO_NODE",
    "SequenceGroups",
    "TreeBatch",
    "TreeEpoch",
    "build_layout",
    "check_tree_batch",
    "from_lists",
    "materialize",
    "pack_tree",
    "plan_tries",
    "tree_loss",
]
