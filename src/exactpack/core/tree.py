"""Tree packing: sequences that share a prefix store it once, every branch exact.

A group (a prompt's completions, a DPO pair, rows sharing a ``group``
column) becomes a compressed prefix trie built from the actual tokens. A
sequence of ``n`` tokens has ``L = n - 1`` cells (input ``t[d]``, target
``t[d+1]``, position ``d``); two sequences share cell ``d`` when their
first ``d + 2`` tokens agree, so each branch's first cell repeats its
parent's last target. Each trie is one packing unit, laid out depth-first
in one row, positions the depth along the path. One prompt ``p0..p3`` and
completions ``a b c``, ``a d``, ``e f``, capacity 12::

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

A key is allowed (:func:`exactpack.core.permission.permitted`) when its node
is an ancestor-or-self of the query's (``node[k] <= node[q] < node_end[k]``),
both valid, and ``0 <= pos[q] - pos[k] < sliding_window``: column 6 sees 0-3 and
itself, never its sibling's 4-5. A cell's weight counts the sequences that
supervise its target, so ``Σ weight·nll / Σ weight`` is the flat objective
(16 cells flat, 9 here, ``N = 7`` either way). :func:`pack_tree` places tries
with any flat policy and keeps every sequence's cells (``batch.sequences()``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactpack.core.batch import PackedBatch
from exactpack.core.binding import Binding, Split
from exactpack.core.compact import Storage, gather_rows, gather_segments
from exactpack.core.errors import InvalidInput, NotAvailable, OversizedExample
from exactpack.core.examples import (
    as_token_array,
    concat_ranges,
    offsets_of,
    pair_offsets,
    prev_at_most,
    spread,
)
from exactpack.core.plan import Plan
from exactpack.core.policies import plan_rows

# Groups of sequences: the input.


@dataclass(frozen=True, eq=False)
class SequenceGroups:
    """``tokens`` int32 [Σ n], ``offsets`` int64 [S+1], ``group`` int64 [S] (contiguous),
    ``loss_mask`` bool [Σ L] (per pair, sequence after sequence), ``binding``::

        prompt [5, 6, 7], completions [8, 9] and [8, 4]
        sequence 0: 5 6 7 8 9   supervised [F, F, T, T]   (targets 8, 9)
        sequence 1: 5 6 7 8 4   supervised [F, F, T, T]   (targets 8, 4)
    """

    tokens: np.ndarray
    offsets: np.ndarray
    group: np.ndarray
    loss_mask: np.ndarray
    binding: Binding

    def __post_init__(self) -> None:
        n = np.diff(self.offsets)
        if n.size and int(n.min()) < 2:
            i = int(np.argmin(n))
            raise InvalidInput(
                f"sequence {i} (group {int(self.group[i])}) has {int(n[i])} tokens; a sequence"
                " needs at least 2 (one prediction pair) — drop it"
            )
        if self.group.shape[0] != n.shape[0] or self.loss_mask.shape[0] != int((n - 1).sum()):
            raise InvalidInput("group / loss_mask do not match the sequences' offsets")
        if self.tokens.size and int(self.tokens.max()) >= self.binding.vocab_size:
            raise InvalidInput(
                f"token id {int(self.tokens.max())} is outside the vocabulary"
                f" ({self.binding.vocab_size}) — pass the tokenizer's or the model's --vocab-size"
            )

    def __len__(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def lengths(self) -> np.ndarray:
        """Prediction pairs per sequence, int64 [S]."""
        return np.diff(self.offsets) - 1

    def pair_mask(self, seqs: np.ndarray) -> np.ndarray:
        """``loss_mask`` of sequences ``seqs``, concatenated in that order, bool [Σ L]."""
        starts = pair_offsets(self.offsets)[:-1][seqs]
        return self.loss_mask[concat_ranges(starts, self.lengths[seqs])]

    def sequence(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    @classmethod
    def of(
        cls, seqs: list[np.ndarray], masks: list[np.ndarray], group: Any, binding: Binding
    ) -> SequenceGroups:
        """From per-sequence token arrays and per-pair masks (``group`` contiguous)."""
        offsets = offsets_of(np.array([s.size for s in seqs], dtype=np.int64))
        tokens = np.concatenate(seqs).astype(np.int32) if seqs else np.zeros(0, np.int32)
        mask = np.concatenate(masks).astype(bool) if masks else np.zeros(0, bool)
        return cls(tokens, offsets, np.asarray(group, dtype=np.int64), mask, binding)

    @classmethod
    def from_lists(
        cls,
        groups: Sequence[Sequence[Any]],
        binding: Binding,
        loss_masks: Sequence[Sequence[Any]] | None = None,
        label: Callable[[int, int], str] | None = None,
    ) -> SequenceGroups:
        """From nested lists: ``groups[g][j]`` a token sequence; ``loss_masks[g][j]`` its
        per-pair supervision (default: every target supervised). ``label(g, j)`` names a
        sequence in errors (default ``group g sequence j``; a file's reader: its line)."""
        label = label or (lambda g, j: f"group {g} sequence {j}")
        seqs, masks, group = [], [], []
        for g, members in enumerate(groups):
            for j, seq in enumerate(members):
                arr = _token_array(seq, binding.vocab_size, lambda g=g, j=j: label(g, j))
                if arr.size < 2:
                    raise InvalidInput(
                        f"{label(g, j)}: {arr.size} token(s); a sequence needs at least 2"
                        " (one prediction pair) — drop it"
                    )
                pairs = arr.size - 1
                m = np.ones(pairs, bool) if loss_masks is None else loss_masks[g][j]
                if (m := np.asarray(m, dtype=bool)).shape != (pairs,):
                    raise InvalidInput(
                        f"{label(g, j)}: loss mask has {m.size} entries for"
                        f" {arr.size - 1} prediction pairs — give one per pair"
                    )
                seqs.append(arr)
                masks.append(m)
                group.append(g)
        return cls.of(seqs, masks, group, binding)

    @classmethod
    def from_prompt_completions(
        cls,
        prompts: Sequence[Any],
        completions: Sequence[Sequence[Any]],
        binding: Binding,
        label: Callable[[int], str] | None = None,
    ) -> SequenceGroups:
        """Group ``g`` = ``prompts[g] + c`` for each ``c`` in ``completions[g]``; only the
        completion's tokens are supervised (targets from the prompt's last token on).
        ``label(g)`` names group ``g`` in errors (default ``group g``; a file: its line)."""
        label = label or (lambda g: f"group {g}")
        if len(prompts) != len(completions):
            raise InvalidInput(
                f"{len(prompts)} prompts but {len(completions)} completion lists — one list per"
                " prompt"
            )
        seqs, masks, group = [], [], []
        for g, (prompt, members) in enumerate(zip(prompts, completions, strict=True)):
            p = _token_array(prompt, binding.vocab_size, lambda g=g: f"{label(g)} prompt")
            if p.size == 0:
                raise InvalidInput(
                    f"{label(g)}: the prompt is empty — a completion needs a context token"
                )
            for j, c in enumerate(members):
                comp = _token_array(
                    c, binding.vocab_size, lambda g=g, j=j: f"{label(g)} completion {j}"
                )
                if comp.size == 0:
                    raise InvalidInput(f"{label(g)} completion {j} is empty — drop it")
                seqs.append(np.concatenate([p, comp]))
                masks.append(np.arange(p.size + comp.size - 1) >= p.size - 1)
                group.append(g)
        return cls.of(seqs, masks, group, binding)


def _token_array(values: Any, vocab_size: int, name: Callable[[], str]) -> np.ndarray:
    """:func:`as_token_array`, naming the sequence (``name()``: a file's line, found by
    reading the file again) only on error."""
    try:
        return as_token_array(values, vocab_size, "")
    except InvalidInput as err:
        raise InvalidInput(f"{name()}{err}") from None


#: Column sets tree packing reads, in the order they are looked for.
TREE_COLUMNS = (
    ("prompt_ids", "completion_ids"),
    ("prompt_ids", "chosen_ids", "rejected_ids"),
    ("prompt_input_ids", "chosen_input_ids", "rejected_input_ids"),
    ("input_ids", "group"),
)
_TEXT = ("prompt", "chosen", "rejected", "completion", "text", "messages")


def max_id(values: Any) -> int:
    """The largest int in nested lists of the tree columns (0 when there is none)."""
    out = 0
    for v in values:
        if isinstance(v, (list, tuple)):
            out = max(out, max_id(v))
        elif isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            out = max(out, int(v))
    return out


def groups_from_columns(
    columns: dict[str, Any], binding: Binding, where: Callable[[int], str] | None = None
) -> tuple[SequenceGroups, np.ndarray]:
    """Groups from record columns (lists per row), by the first column set present, and
    each sequence's index among the input's sequences (int64 [S]):

    * ``prompt_ids`` + ``completion_ids``: a row's completions (a list of id
      lists, GRPO) are one group; a single id list is a group of one;
    * ``prompt_ids`` + ``chosen_ids`` + ``rejected_ids`` (TRL 1.16's DPO columns) or
      ``prompt_input_ids`` + ``chosen_input_ids`` + ``rejected_input_ids`` (TRL < 1):
      each row is a group ``[chosen, rejected]``;
    * ``input_ids`` + ``group``: rows of equal ``group`` (in first-seen order)
      form a group, its rows in input order wherever they are (the index says
      where); every target supervised.

    Text columns (``prompt`` / ``chosen`` / ...) are refused: tokenize first. ``where(row)``
    names a row in errors (a file's reader passes its :meth:`Origin.locate`).
    """
    names = set(columns)
    if {"prompt_ids", "completion_ids"} <= names:
        comps = [
            c if len(c) and isinstance(c[0], (list, tuple, np.ndarray)) else [c]
            for c in columns["completion_ids"]
        ]
        groups = SequenceGroups.from_prompt_completions(
            columns["prompt_ids"], comps, binding, where
        )
        return groups, np.arange(len(groups), dtype=np.int64)
    for prompt, chosen, rejected in TREE_COLUMNS[1:3]:
        if {prompt, chosen, rejected} <= names:
            pairs = list(zip(columns[chosen], columns[rejected], strict=True))
            groups = SequenceGroups.from_prompt_completions(columns[prompt], pairs, binding, where)
            return groups, np.arange(len(groups), dtype=np.int64)
    if {"input_ids", "group"} <= names:
        members: dict[Any, list[int]] = {}
        for i, g in enumerate(columns["group"]):
            members.setdefault(g, []).append(i)
        ids, rows = columns["input_ids"], list(members.values())
        label = None if where is None else (lambda g, j: where(rows[g][j]))
        groups = SequenceGroups.from_lists(
            [[ids[i] for i in m] for m in rows], binding, None, label
        )
        return groups, np.array([i for m in rows for i in m], dtype=np.int64)
    text = sorted(names & set(_TEXT))
    found = ", ".join(sorted(names)) or "none"
    hint = f"; {', '.join(text)} hold text — tokenize them first" if text else ""
    raise InvalidInput(
        "tree packing reads prompt_ids + completion_ids, prompt_ids + chosen_ids + rejected_ids"
        " (or prompt_input_ids + chosen_input_ids + rejected_input_ids), or input_ids + group;"
        f" this input has columns {found}{hint}"
    )


# Tries: integers only, vectorised.


def group_bounds(group: np.ndarray) -> np.ndarray:
    """Start of each run of equal ``group`` ids and the end, int64 [G+1] (groups contiguous)."""
    group = np.asarray(group, dtype=np.int64)
    cuts = np.flatnonzero(group[1:] != group[:-1]) + 1
    starts = np.unique(np.concatenate([[0], cuts, [group.shape[0]]])).astype(np.int64)
    seen = group[starts[:-1]]
    if np.unique(seen).shape[0] != seen.shape[0]:
        raise InvalidInput(
            "the rows of one group are not contiguous — sort the rows by their group column"
            " (or give each group once, as a list of sequences)"
        )
    return starts


def trie_order(tokens: np.ndarray, offsets: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Sequence indices, each group's sequences in a fixed lexicographic order (of
    little-endian int32 bytes), int64 [S]."""
    order = np.arange(offsets.shape[0] - 1, dtype=np.int64)
    data = np.ascontiguousarray(tokens, dtype="<i4")
    for g in np.flatnonzero(np.diff(bounds) > 1):
        lo, hi = int(bounds[g]), int(bounds[g + 1])
        keys = [data[offsets[i] : offsets[i + 1]].tobytes() for i in range(lo, hi)]
        order[lo:hi] = lo + np.array(sorted(range(hi - lo), key=keys.__getitem__))
    return order


def adjacent_lcp(
    tokens: np.ndarray, offsets: np.ndarray, order: np.ndarray, bounds: np.ndarray
) -> np.ndarray:
    """Cells each sequence of ``order`` shares with its predecessor (0 at group starts), int64
    [S]: sequences agreeing on their first ``t`` tokens share ``max(t - 1, 0)`` cells."""
    s = order.shape[0]
    lcp = np.zeros(s, dtype=np.int64)
    first = np.zeros(s, dtype=bool)
    first[bounds[:-1][bounds[:-1] < s]] = True
    pairs = np.flatnonzero(~first)
    if pairs.size == 0:
        return lcp
    a, b = offsets[order[pairs - 1]], offsets[order[pairs]]
    m = np.minimum(offsets[order[pairs - 1] + 1] - a, offsets[order[pairs] + 1] - b)
    owner, local = spread(m)
    mismatch = np.where(tokens[a[owner] + local] != tokens[b[owner] + local], local, m[owner])
    starts = offsets_of(m)[:-1]
    lcp[pairs] = np.maximum(np.minimum.reduceat(mismatch, starts) - 1, 0)
    return lcp


@dataclass(frozen=True, eq=False)
class TrieOrder:
    """The depth-first layout of tries. Per sequence in layout order [S]: ``order`` (index
    in the supplied sequences), ``lengths`` (cells), ``lcp``, ``trie``, ``own_col``
    (trie-local column of its first owned cell). Per trie [G]: ``sizes`` (cells stored),
    ``seq_bounds`` / ``node_bounds`` [G+1]. Per node [M] in pre-order: ``node_trie``,
    ``node_col`` (trie-local), ``node_len``, ``node_pos`` (depth), ``node_parent`` (-1: a
    root), ``node_owner`` (the sequence whose tokens it holds); their ends are derived
    where the rows are gathered (:meth:`~exactpack.core.compact.CompactRows.to_batch`).
    """

    order: np.ndarray
    lengths: np.ndarray
    lcp: np.ndarray
    trie: np.ndarray
    own_col: np.ndarray
    sizes: np.ndarray
    seq_bounds: np.ndarray
    node_bounds: np.ndarray
    node_trie: np.ndarray
    node_col: np.ndarray
    node_len: np.ndarray
    node_pos: np.ndarray
    node_parent: np.ndarray
    node_owner: np.ndarray

    def path_columns(self, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Trie-local column of every cell of sequences ``seqs``, in depth order: int64 [Σ L]
        and [len(seqs)+1] offsets. Depth ``d`` of ``j`` is owned by the last ``k <= j`` of its
        trie with ``lcp[k] <= d``."""
        lens = self.lengths[seqs]
        bounds = offsets_of(lens)
        owner_seq = np.repeat(seqs, lens)
        depth = spread(lens)[1]
        owner = prev_at_most(self.lcp, depth, self.seq_bounds[self.trie[owner_seq]], owner_seq)
        return self.own_col[owner] + depth - self.lcp[owner], bounds


def layout_tries(lengths: np.ndarray, lcp: np.ndarray, seq_bounds: np.ndarray) -> TrieOrder:
    """The layout of tries whose sequences (in trie order) have these ``lengths`` and ``lcp``
    (0 at each trie's first sequence), int64 [S]; ``seq_bounds`` [G+1]."""
    lengths, lcp = np.asarray(lengths, dtype=np.int64), np.asarray(lcp, dtype=np.int64)
    s, g = lengths.shape[0], seq_bounds.shape[0] - 1
    trie = np.repeat(np.arange(g, dtype=np.int64), np.diff(seq_bounds))
    own = lengths - lcp
    csum = offsets_of(own)
    sizes = csum[seq_bounds[1:]] - csum[seq_bounds[:-1]]
    cell_base = csum[seq_bounds[:-1]]  # global column of each trie's first cell
    own_start = csum[:-1]  # global column of each sequence's first owned cell
    total = int(csum[-1])
    # The cell each sequence branches from: depth lcp-1 of the last earlier sequence
    # of its trie whose owned span reaches that depth.
    branches = np.flatnonzero((lcp > 0) & (own > 0))
    owner = prev_at_most(lcp, lcp[branches] - 1, seq_bounds[trie[branches]], branches - 1)
    parent_cell = own_start[owner] + (lcp[branches] - 1 - lcp[owner])
    # Nodes start at every owned span and after every branching cell: O(S), no per-cell array.
    node_start = np.unique(np.concatenate([own_start[own > 0], parent_cell + 1]))
    node_len = np.diff(np.append(node_start, total))
    owners = np.flatnonzero(own > 0)
    node_owner = owners[np.searchsorted(own_start[owners], node_start, side="right") - 1]
    node_pos = lcp[node_owner] + node_start - own_start[node_owner]
    branch_parent = np.full(s, -1, dtype=np.int64)
    branch_parent[branches] = parent_cell
    span_start = node_start == own_start[node_owner]
    parent_cell_of_node = np.where(span_start, branch_parent[node_owner], node_start - 1)
    parent_node = np.searchsorted(node_start, np.maximum(parent_cell_of_node, 0), side="right") - 1
    node_trie = trie[node_owner]
    node_bounds = np.searchsorted(node_trie, np.arange(g + 1), side="left").astype(np.int64)
    return TrieOrder(
        order=np.arange(s, dtype=np.int64),
        lengths=lengths,
        lcp=lcp,
        trie=trie,
        own_col=own_start - cell_base[trie],
        sizes=sizes,
        seq_bounds=np.asarray(seq_bounds, dtype=np.int64),
        node_bounds=node_bounds,
        node_trie=node_trie,
        node_col=node_start - cell_base[node_trie],
        node_len=node_len,
        node_pos=node_pos,
        node_parent=np.where(node_pos > 0, parent_node, -1),
        node_owner=node_owner,
    )


def split_oversized(
    lengths: np.ndarray, lcp: np.ndarray, seq_bounds: np.ndarray, capacity: int
) -> tuple[np.ndarray, np.ndarray]:
    """Cut tries larger than ``capacity``: a sub-trie (``lcp`` 0, repeating the prefix)
    starts where the next sequence's owned cells would overflow; returns ``(lcp,
    seq_bounds)``. A sequence longer than ``capacity`` is an :class:`OversizedExample`."""
    if lengths.size and int(lengths.max()) > capacity:
        i = int(np.argmax(lengths > capacity))
        raise OversizedExample(
            f"sequence {i} (in trie order) has {int(lengths[i])} prediction pairs; capacity is"
            f" {capacity} — raise --max-length or drop the sequence"
        )
    own = lengths - lcp
    csum = offsets_of(own)
    big = np.flatnonzero(csum[seq_bounds[1:]] - csum[seq_bounds[:-1]] > capacity)
    if big.size == 0:
        return lcp, seq_bounds
    lcp, cuts = lcp.copy(), [seq_bounds]
    for t in big:  # rare: only oversized tries take the sequential greedy cut
        lo, hi = int(seq_bounds[t]), int(seq_bounds[t + 1])
        used = int(lengths[lo])
        for j in range(lo + 1, hi):
            if used + int(own[j]) > capacity:
                lcp[j], used = 0, int(lengths[j])
                cuts.append(np.array([j]))
            else:
                used += int(own[j])
    return lcp, np.unique(np.concatenate(cuts)).astype(np.int64)


def plan_tries(
    lengths: np.ndarray, lcp: np.ndarray, seq_bounds: np.ndarray, capacity: int
) -> TrieOrder:
    """Split oversized tries, then lay every trie out (integers only)."""
    lcp, seq_bounds = split_oversized(lengths, lcp, seq_bounds, capacity)
    return layout_tries(lengths, lcp, seq_bounds)


def build_layout(groups: SequenceGroups, capacity: int) -> TrieOrder:
    """The tries of ``groups`` (from their tokens) laid out for rows of ``capacity`` cells."""
    bounds = group_bounds(groups.group)
    order = trie_order(groups.tokens, groups.offsets, bounds)
    lcp = adjacent_lcp(groups.tokens, groups.offsets, order, bounds)
    layout = plan_tries(groups.lengths[order], lcp, bounds, capacity)
    return dataclasses.replace(layout, order=order)


# Rows: the tries as compact rows, gathered as flat rows are.


class TrieSource:
    """The tries of ``groups`` laid out by ``layout`` as a
    :class:`~exactpack.core.compact.TokenSource` for :func:`gather_rows`: a unit is a trie,
    its occurrences its nodes (a node's window: its owner's tokens from the node's depth);
    ``index``: each sequence's number in the input (default: its index in ``groups``)."""

    def __init__(self, groups: SequenceGroups, layout: TrieOrder, index: Any = None) -> None:
        self.groups, self.layout = groups, layout
        self.index = np.arange(len(groups), dtype=np.int64) if index is None else index
        self.lengths, self.binding, self.partition = layout.sizes, groups.binding, Split.TRAIN

    def take(self, tries: np.ndarray, contiguous: bool) -> tuple[np.ndarray, dict[str, Any]]:
        g, lay = self.groups, self.layout
        lo = lay.node_bounds[tries]
        units = lay.node_bounds[tries + 1] - lo
        t_of, k = spread(units)
        nodes = lo[t_of] + k  # layout ids, each trie's in pre-order (= column order)
        start = g.offsets[lay.order[lay.node_owner[nodes]]] + lay.node_pos[nodes]
        tokens = gather_segments(g.tokens, start, lay.node_len[nodes] + 1)
        parent = lay.node_parent[nodes]
        parent = np.where(parent >= 0, parent + (offsets_of(units)[:-1] - lo)[t_of], -1)
        # every sequence's pairs among these tries' (a trie's nodes cover its columns in order)
        s_lo = lay.seq_bounds[tries]
        seqs = concat_ranges(s_lo, lay.seq_bounds[tries + 1] - s_lo)
        cols, bounds = lay.path_columns(seqs)
        base = np.repeat(offsets_of(lay.sizes[tries])[:-1], lay.seq_bounds[tries + 1] - s_lo)
        pairs = np.repeat(base, lay.lengths[seqs]) + cols
        mask = g.pair_mask(lay.order[seqs])
        weights = np.bincount(pairs[mask], minlength=int(lay.sizes[tries].sum()))
        node_first = offsets_of(lay.node_len[nodes])[:-1]
        return tokens, {
            "units": units,
            "lengths": lay.node_len[nodes],
            "starts": lay.node_col[nodes],
            "parents": parent,
            "depths": lay.node_pos[nodes],
            "weights": weights.astype(np.int32),
            "seq_index": self.index[lay.order[seqs]],
            "seq_nodes": np.searchsorted(node_first, pairs[bounds[1:] - 1], side="right") - 1,
            "seq_mask": mask,
        }


def refuse_flattened(what: str, fix: str) -> None:
    """The one refusal of tree rows to a consumer of disjoint intervals (flash
    ``cu_seqlens``, ``exactpack_varlen``, a flattened collator): it cannot say "this key is
    my ancestor". ``what``: the consumer; ``fix``: what to use instead."""
    raise NotAvailable(
        f"{what} reads cu_seqlens, which describe disjoint intervals and cannot say 'this key"
        f" is my ancestor', so it cannot run tree-packed rows — {fix}"
    )


@dataclass(frozen=True, eq=False)
class TreeEpoch:
    """Every model call of one tree packing, with the layout and the plan of its tries."""

    batches: list[PackedBatch]
    layout: TrieOrder
    plan: Plan

    def stats(self) -> dict[str, Any]:
        """tokens_stored / tokens_flat (cells), rows, tries, nodes, sequences."""
        stored, flat = int(self.layout.sizes.sum()), int(self.layout.lengths.sum())
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


def pack_tree(
    groups: SequenceGroups,
    max_length: int,
    *,
    policy: str = "next-fit",
    max_rows_per_batch: int | None = None,
    **policy_options: Any,
) -> TreeEpoch:
    """Tree-pack ``groups`` into rows of ``max_length`` cells, placed by any flat ``policy``,
    in calls of at most ``max_rows_per_batch`` rows (default: one call)."""
    layout = build_layout(groups, max_length)
    plan = plan_rows(layout.sizes, max_length, policy, **policy_options)
    rows = gather_rows(TrieSource(groups, layout), Storage.of(plan), 0, plan.num_rows)
    return TreeEpoch(list(rows.batches(max_rows_per_batch or max(plan.num_rows, 1))), layout, plan)


__all__ = [
    "TREE_COLUMNS",
    "SequenceGroups",
    "TreeEpoch",
    "TrieOrder",
    "TrieSource",
    "build_layout",
    "groups_from_columns",
    "max_id",
    "pack_tree",
    "plan_tries",
    "refuse_flattened",
]
