"""Prefix tries of token sequences, laid out depth-first: integers only, vectorised.

A sequence of ``n`` tokens has ``L = n - 1`` prediction pairs ("cells"):
cell ``d`` holds input ``t[d]`` and target ``t[d+1]`` at position ``d``. Two
sequences share cell ``d`` exactly when their first ``d + 2`` tokens agree:
the same input under the same context computes the same state, and the
same target makes one cell hold one target. So the trie is built over
*pairs*, and its branching cells repeat the branching token: one prompt
``p0 p1 p2`` with completions ``a b`` / ``a c`` / ``e`` gives::

    sequence 0: p0 p1 p2 a b    pairs (p0,p1) (p1,p2) (p2,a) (a,b)
    sequence 1: p0 p1 p2 a c    pairs (p0,p1) (p1,p2) (p2,a) (a,c)
    sequence 2: p0 p1 p2 e      pairs (p0,p1) (p1,p2) (p2,e)

    column     0    1    2    3    4    5        node 0 = columns 0-1 (all three)
    input     p0   p1   p2    a    a   p2        node 1 = column 2   (0 and 1: shared a)
    target    p1   p2    a    b    c    e        node 2 = column 3, node 3 = column 4
    position   0    1    2    3    3    2        node 4 = column 5   (sequence 2)
    node       0    0    1    2    3    4
    parent     .    .    0    1    1    0

``p2`` is stored twice (columns 2 and 5) and ``a`` twice (3 and 4): the head
of each branch repeats its parent's last target as its input, so every
next-token pair of every sequence exists exactly once per branch, 6 cells
instead of 11.

Sequences of a trie are ordered lexicographically (:func:`trie_order`, any
fixed order of token ids works); ``lcp[j]`` is the number of cells sequence
``j`` shares with its predecessor. Sequence ``j`` then *owns* the cells of
depths ``[lcp[j], L[j])``, laid out one after another: that is the trie's
depth-first (pre-order) layout. Nodes are the owned spans cut after every
branching cell; a node's parent, its Euler-tour exit ``node_end`` (one past
its last descendant, in pre-order node ids) and every sequence's path follow
from "previous / next index whose value is at most a limit" searches
(:func:`next_at_most`, a sparse table of minima: ``O(n log k)``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seqpack.core.errors import InvalidInput, OversizedExample


def _levels(span: int) -> int:
    return max(1, int(np.ceil(np.log2(max(span, 1) + 1))))


def next_at_most(
    values: np.ndarray, limits: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> np.ndarray:
    """Per query ``i``: the smallest ``m`` in ``[starts[i], ends[i])``, ``values[m] <= limits[i]``.

    ``ends[i]`` when there is none. ``values`` int64 [n]; the query arrays
    int64 [q]. Binary lifting over a sparse table of range minima, its levels
    bounded by the longest query range (a trie's size, not the whole array).
    """
    n = values.shape[0]
    pos = np.asarray(starts, dtype=np.int64).copy()
    if pos.size == 0 or n == 0:
        return np.minimum(pos, ends)
    levels = _levels(int((ends - pos).max(initial=0)))
    table = [values]
    for p in range(1, levels):
        prev, step = table[-1], 1 << (p - 1)
        nxt = prev.copy()
        nxt[: max(n - step, 0)] = np.minimum(prev[: max(n - step, 0)], prev[step:])
        table.append(nxt)
    for p in range(levels - 1, -1, -1):
        size = 1 << p
        skip = pos + size <= ends
        skip &= table[p][np.minimum(pos, n - 1)] > limits
        pos = pos + size * skip
    return np.minimum(pos, ends)


def prev_at_most(
    values: np.ndarray, limits: np.ndarray, lows: np.ndarray, highs: np.ndarray
) -> np.ndarray:
    """Per query ``i``: the largest ``k`` in ``[lows[i], highs[i]]``, ``values[k] <= limits[i]``.

    ``lows[i] - 1`` when there is none (:func:`next_at_most` on the reversed array).
    """
    n = values.shape[0]
    rev = next_at_most(values[::-1].copy(), limits, n - 1 - highs, n - lows)
    return n - 1 - rev


def group_bounds(group: np.ndarray) -> np.ndarray:
    """Start of each run of equal ``group`` ids and the end, int64 [G+1] (groups contiguous)."""
    group = np.asarray(group, dtype=np.int64)
    n = group.shape[0]
    cuts = np.flatnonzero(group[1:] != group[:-1]) + 1
    starts = np.concatenate([[0], cuts, [n]]).astype(np.int64) if n else np.zeros(1, np.int64)
    seen = group[starts[:-1]]
    if np.unique(seen).shape[0] != seen.shape[0]:
        raise InvalidInput(
            "the rows of one group are not contiguous — sort the rows by their group column"
            " (or give each group once, as a list of sequences)"
        )
    return starts


def trie_order(tokens: np.ndarray, offsets: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Sequence indices, each group's sequences in lexicographic order, int64 [S].

    Any fixed order of token ids gives a valid trie order; the bytes of the
    little-endian int32 ids compare with ``memcmp`` (one Python sort per group
    of two or more sequences, the only per-group step).
    """
    order = np.arange(offsets.shape[0] - 1, dtype=np.int64)
    sizes = np.diff(bounds)
    data = np.ascontiguousarray(tokens, dtype="<i4")
    for g in np.flatnonzero(sizes > 1):
        lo, hi = int(bounds[g]), int(bounds[g + 1])
        keys = [data[offsets[i] : offsets[i + 1]].tobytes() for i in range(lo, hi)]
        order[lo:hi] = lo + np.array(sorted(range(hi - lo), key=keys.__getitem__))
    return order


def adjacent_lcp(
    tokens: np.ndarray, offsets: np.ndarray, order: np.ndarray, bounds: np.ndarray
) -> np.ndarray:
    """Cells (pairs) each sequence of ``order`` shares with its predecessor; 0 at group starts.

    Compares tokens vectorised over all adjacent pairs at once: two
    sequences of ``n`` and ``m`` tokens agreeing on their first ``t`` tokens
    share ``max(t - 1, 0)`` cells. int64 [S].
    """
    s = order.shape[0]
    lcp = np.zeros(s, dtype=np.int64)
    first = np.zeros(s, dtype=bool)
    first[bounds[:-1][bounds[:-1] < s]] = True
    pairs = np.flatnonzero(~first)
    if pairs.size == 0:
        return lcp
    a, b = offsets[order[pairs - 1]], offsets[order[pairs]]
    n_a, n_b = offsets[order[pairs - 1] + 1] - a, offsets[order[pairs] + 1] - b
    m = np.minimum(n_a, n_b)
    starts = np.zeros(m.shape[0], dtype=np.int64)
    np.cumsum(m[:-1], out=starts[1:])
    owner = np.repeat(np.arange(m.shape[0]), m)
    local = np.arange(int(m.sum()), dtype=np.int64) - starts[owner]
    differ = tokens[a[owner] + local] != tokens[b[owner] + local]
    mismatch = np.where(differ, local, m[owner])
    agree = np.minimum.reduceat(mismatch, starts) if m.size else m
    lcp[pairs] = np.maximum(agree - 1, 0)
    return lcp


@dataclass(frozen=True, eq=False)
class TrieLayout:
    """The depth-first layout of tries: which cell, node and path each sequence has.

    Per sequence in layout order [S]: ``order`` (index in the supplied
    sequences), ``lengths`` (cells), ``lcp`` (cells shared with the previous
    sequence of its trie), ``trie`` (trie index), ``own_col`` (trie-local
    column of its first owned cell). Per trie [G]: ``sizes`` (cells stored),
    ``seq_bounds`` / ``node_bounds`` int64 [G+1]. Per node [M] in pre-order
    (global ids): ``node_trie``, ``node_col`` (trie-local first column),
    ``node_len``, ``node_pos`` (position of its first cell = its depth),
    ``node_parent`` (node id, ``-1`` for a root), ``node_end`` (one past its
    last descendant: the Euler-tour exit, so ``k`` is an ancestor-or-self of
    ``q`` iff ``k <= q < node_end[k]``).
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
    node_end: np.ndarray

    @property
    def flat_cells(self) -> int:
        """Cells flat packing stores for the same sequences (``Σ L``)."""
        return int(self.lengths.sum())

    def path_columns(self, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Trie-local column of every cell of sequences ``seqs`` (layout indices), in depth order.

        Returns ``(columns, bounds)``: int64 [Σ L], and [len(seqs)+1] offsets.
        The cell of depth ``d`` of sequence ``j`` is owned by the last
        sequence ``k <= j`` of its trie with ``lcp[k] <= d``.
        """
        seqs = np.asarray(seqs, dtype=np.int64)
        lens = self.lengths[seqs]
        bounds = np.zeros(seqs.shape[0] + 1, dtype=np.int64)
        np.cumsum(lens, out=bounds[1:])
        owner_seq = np.repeat(seqs, lens)
        depth = np.arange(int(bounds[-1]), dtype=np.int64) - np.repeat(bounds[:-1], lens)
        lows = self.seq_bounds[self.trie[owner_seq]]
        owner = prev_at_most(self.lcp, depth, lows, owner_seq)
        return self.own_col[owner] + depth - self.lcp[owner], bounds


def layout_tries(lengths: np.ndarray, lcp: np.ndarray, seq_bounds: np.ndarray) -> TrieLayout:
    """The depth-first layout of tries whose sequences (in trie order) have these lengths.

    ``lengths`` and ``lcp`` int64 [S] (``lcp`` 0 at each trie's first
    sequence, ``<=`` both neighbours' lengths), ``seq_bounds`` int64 [G+1].
    Integers only (the planning step): vectorised, no per-sequence loop.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    lcp = np.asarray(lcp, dtype=np.int64)
    s, g = lengths.shape[0], seq_bounds.shape[0] - 1
    trie = np.repeat(np.arange(g, dtype=np.int64), np.diff(seq_bounds))
    own = lengths - lcp
    csum = np.concatenate([[0], np.cumsum(own)]).astype(np.int64)
    sizes = csum[seq_bounds[1:]] - csum[seq_bounds[:-1]]
    cell_base = csum[seq_bounds[:-1]]  # global column of each trie's first cell
    own_start = csum[:-1]  # global column of each sequence's first owned cell
    own_col = own_start - cell_base[trie]
    total = int(csum[-1])
    # The cell each sequence branches from: depth lcp-1 of the last earlier sequence
    # of its trie whose owned span reaches that depth.
    branches = np.flatnonzero((lcp > 0) & (own > 0))
    owner = prev_at_most(lcp, lcp[branches] - 1, seq_bounds[trie[branches]], branches - 1)
    parent_cell = own_start[owner] + (lcp[branches] - 1 - lcp[owner])
    # Nodes start at every owned span and after every branching cell: O(S), no per-cell array.
    node_start = np.sort(np.concatenate([own_start[own > 0], parent_cell + 1]))
    node_start = node_start[np.r_[True, node_start[1:] != node_start[:-1]]]  # sorted unique
    node_len = np.diff(np.append(node_start, total))
    owners = np.flatnonzero(own > 0)
    node_owner = owners[np.searchsorted(own_start[owners], node_start, side="right") - 1]
    node_pos = lcp[node_owner] + node_start - own_start[node_owner]
    span_start = node_start == own_start[node_owner]
    branch_parent = np.full(s, -1, dtype=np.int64)
    branch_parent[branches] = parent_cell
    parent_cell_of_node = np.where(span_start, branch_parent[node_owner], node_start - 1)
    parent_node = np.searchsorted(node_start, np.maximum(parent_cell_of_node, 0), side="right") - 1
    node_parent = np.where(node_pos > 0, parent_node, -1)
    node_trie = trie[node_owner]
    node_bounds = np.searchsorted(node_trie, np.arange(g + 1), side="left").astype(np.int64)
    ids = np.arange(node_start.shape[0], dtype=np.int64)
    limit = node_pos + node_len - 1  # a later node starting no deeper leaves the subtree
    node_end = next_at_most(node_pos, limit, ids + 1, node_bounds[node_trie + 1])
    return TrieLayout(
        order=np.arange(s, dtype=np.int64),
        lengths=lengths,
        lcp=lcp,
        trie=trie,
        own_col=own_col,
        sizes=sizes,
        seq_bounds=np.asarray(seq_bounds, dtype=np.int64),
        node_bounds=node_bounds,
        node_trie=node_trie,
        node_col=node_start - cell_base[node_trie],
        node_len=node_len,
        node_pos=node_pos,
        node_parent=node_parent,
        node_end=node_end,
    )


def split_oversized(
    lengths: np.ndarray, lcp: np.ndarray, seq_bounds: np.ndarray, capacity: int
) -> tuple[np.ndarray, np.ndarray]:
    """Cut tries larger than ``capacity`` into sub-tries that each repeat their shared prefix.

    Sequences stay whole and in trie order; a sub-trie starts a new chunk
    (its first ``lcp`` becomes 0, so the shared prefix is stored again)
    whenever the next sequence's owned cells would overflow the row. A
    sequence longer than ``capacity`` is an :class:`OversizedExample`.
    Returns new ``(lcp, seq_bounds)``; tries that fit are untouched.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and int(lengths.max()) > capacity:
        i = int(np.argmax(lengths > capacity))
        raise OversizedExample(
            f"sequence {i} (in trie order) has {int(lengths[i])} prediction pairs; capacity is"
            f" {capacity} — raise --max-length or drop the sequence"
        )
    own = lengths - lcp
    csum = np.concatenate([[0], np.cumsum(own)])
    sizes = csum[seq_bounds[1:]] - csum[seq_bounds[:-1]]
    big = np.flatnonzero(sizes > capacity)
    if big.size == 0:
        return lcp, seq_bounds
    lcp = lcp.copy()
    cuts = [seq_bounds]
    for t in big:  # rare: only oversized tries take the sequential greedy cut
        lo, hi = int(seq_bounds[t]), int(seq_bounds[t + 1])
        used = int(lengths[lo])
        for j in range(lo + 1, hi):
            if used + int(own[j]) > capacity:
                lcp[j] = 0
                cuts.append(np.array([j]))
                used = int(lengths[j])
            else:
                used += int(own[j])
    return lcp, np.unique(np.concatenate(cuts)).astype(np.int64)


__all__ = [
    "TrieLayout",
    "adjacent_lcp",
    "group_bounds",
    "layout_tries",
    "next_at_most",
    "prev_at_most",
    "split_oversized",
    "trie_order",
]
