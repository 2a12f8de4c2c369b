"""Planning kernels: the search trees and the in-memory policies' loops.

Run through :mod:`seqpack.core.engine` (numba when installed, else the same
source in plain Python). Two search trees recur (``leaves`` a power of two,
node ``k`` has children ``2k`` and ``2k+1``, leaf ``i`` is node
``leaves + i``, every inner node holds the maximum of its children):

- over rows by remaining capacity: the leftmost leaf holding at least ``n``
  is the first row an item of length ``n`` fits in (first fit);
- over remaining capacities ``r``: leaf ``r`` holds ``r`` while some row has
  exactly ``r`` cells left, else 0, so the leftmost leaf holding at least
  ``n`` is the tightest row that fits (best fit) — O(log capacity) per item,
  as in "Fewer Truncations Improve Language Modeling" (Ding et al., 2024).
"""

from __future__ import annotations

from seqpack.core.engine import kernel

# --------------------------------------------------------------- trees


@kernel
def tree_set(tree, leaves, index, value):
    """Set leaf ``index`` to ``value`` and restore the maxima above it."""
    node = leaves + index
    tree[node] = value
    node //= 2
    while node > 0:
        left = tree[2 * node]
        right = tree[2 * node + 1]
        best = left if left >= right else right
        if tree[node] == best:
            break  # unchanged here, so unchanged above
        tree[node] = best
        node //= 2


@kernel
def tree_first_at_least(tree, leaves, n):
    """Index of the leftmost leaf holding ``>= n``, or -1."""
    if tree[1] < n:
        return -1
    node = 1
    while node < leaves:
        node = 2 * node + (tree[2 * node] < n)  # branch-free: the comparison is 0 or 1
    return node - leaves


@kernel
def tree_last_at_most(tree, leaves, r):
    """Index of the rightmost non-zero leaf at or left of ``r``, or -1."""
    node = leaves + r
    if tree[node] > 0:
        return r
    while node > 1:
        if node % 2 == 1 and tree[node - 1] > 0:
            node -= 1
            while node < leaves:  # rightmost non-zero leaf below
                node = 2 * node + (tree[2 * node + 1] > 0)
            return node - leaves
        node //= 2
    return -1


@kernel
def bucket_push(tree, leaves, head, tail, nxt, r, item):
    """Append ``item`` to FIFO bucket ``r``; mark ``r`` non-empty in ``tree``."""
    nxt[item] = -1
    if tail[r] == -1:
        head[r] = item
        tree_set(tree, leaves, r, r)
    else:
        nxt[tail[r]] = item
    tail[r] = item


@kernel
def bucket_pop(tree, leaves, head, tail, nxt, r):
    """Remove and return the oldest item of bucket ``r``."""
    item = head[r]
    head[r] = nxt[item]
    if head[r] == -1:
        tail[r] = -1
        tree_set(tree, leaves, r, 0)
    return item


# --------------------------------------------------------------- in-memory policies


@kernel
def next_fit(lengths, capacity, row_of, start_of):
    """Supplied order, only the current row; returns the number of rows."""
    row = 0
    used = 0
    for i in range(len(lengths)):
        n = lengths[i]
        if n > capacity - used:
            row += 1
            used = 0
        row_of[i] = row
        start_of[i] = used
        used += n
    return row + 1 if len(lengths) > 0 else 0


@kernel
def decreasing_order(lengths, capacity, counts, order):
    """Counting sort: indices by length descending, ties by index (stable).

    ``counts`` is int64 [capacity + 2] of zeros.
    """
    n = len(order)
    for i in range(n):
        counts[capacity - lengths[i] + 1] += 1
    for k in range(1, capacity + 2):
        counts[k] += counts[k - 1]
    for i in range(n):
        k = capacity - lengths[i]
        order[counts[k]] = i
        counts[k] += 1


@kernel
def first_fit(sizes, capacity, tree, leaves, row_of, start_of):
    """First fit of items ``sizes[j]``, j = 0, 1, ...: the lowest-numbered row
    with room. Writes ``row_of[j]``, ``start_of[j]``; returns the row count.

    ``tree`` is int64 [2 * leaves] filled with ``capacity`` (every row not
    yet opened is empty, so the leftmost fitting leaf is either an open row
    or the next row to open).
    """
    rows = 0
    for j in range(len(sizes)):
        n = sizes[j]
        row = tree_first_at_least(tree, leaves, n)
        left = tree[leaves + row]
        if row == rows:
            rows += 1
        row_of[j] = row
        start_of[j] = capacity - left
        tree_set(tree, leaves, row, left - n)
    return rows


@kernel
def best_fit(sizes, capacity, tree, leaves, head, tail, nxt, row_of, start_of):
    """Best fit of items ``sizes[j]``, j = 0, 1, ...: the open row with the
    fewest cells left that still fit; rows with equal room oldest first.
    Writes ``row_of[j]``, ``start_of[j]``; returns the row count.

    ``tree`` int64 [2 * leaves] zeros over remaining capacities
    ``0..capacity-1``; ``head``/``tail`` int64 [capacity] of -1; ``nxt``
    int64 [max rows].
    """
    rows = 0
    for j in range(len(sizes)):
        n = sizes[j]
        left = tree_first_at_least(tree, leaves, n)
        if left >= 0:
            row = bucket_pop(tree, leaves, head, tail, nxt, left)
        else:
            row = rows
            rows += 1
            left = capacity
        row_of[j] = row
        start_of[j] = capacity - left
        if left > n:
            bucket_push(tree, leaves, head, tail, nxt, left - n, row)
    return rows
