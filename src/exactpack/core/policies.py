"""Packing policies: which row and column each whole example starts at.

A policy sees only prediction lengths and returns a :class:`Plan`; each example is
placed exactly once and whole. Next-fit (the seed's) also keeps the supplied order::

    lengths [3, 2, 4], capacity 6, next-fit
    row 0: A A A B B .      A at column 0, B at column 3
    row 1: C C C C . .      C does not fit in the one free cell

======================  ==========================================  ============
policy                  rule                                        per example
======================  ==========================================  ============
next-fit                supplied order, current row only            O(1)
first-fit-decreasing    longest first, first row with room          O(log rows)
best-fit-decreasing     longest first, tightest row (fewest rows)   O(log cap)
stream-best-fit         bounded look-ahead and open rows            O(log cap)
padded                  one example per row (the baseline)          O(1)
======================  ==========================================  ============

The per-example loops are :mod:`exactpack.core.engine` kernels (C or Python, one plan).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from exactpack.core import engine
from exactpack.core.engine import bucket_pop, bucket_push, kernel, tree_first_at_least, tree_set
from exactpack.core.errors import InvalidInput, check_lengths, check_max_length, did_you_mean
from exactpack.core.plan import Plan
from exactpack.core.stream_packer import DEFAULT_LOOKAHEAD, DEFAULT_MAX_OPEN_ROWS, StreamPacker

PolicyFn = Callable[..., tuple[np.ndarray, np.ndarray]]


@kernel
def next_fit_loop(lengths, capacity, row_of, start_of):
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
def counting_sort(lengths, capacity, counts, order):
    """Indices by length descending, ties by index; ``counts`` int64 [capacity + 2] zeros."""
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
    """First fit of ``sizes`` in order (lowest-numbered row with room) into ``row_of``,
    ``start_of``; returns the row count. ``tree`` int64 [2 * leaves] of ``capacity``."""
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
    """Best fit of ``sizes`` in order (fewest cells left that fit, oldest first) into
    ``row_of``, ``start_of``; returns the row count. ``tree`` int64 [2 * leaves] zeros,
    ``head``/``tail`` int64 [capacity] of -1, ``nxt`` int64 [max rows]."""
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


def next_fit(
    lengths: np.ndarray, capacity: int, *, kernels: str = "auto"
) -> tuple[np.ndarray, np.ndarray]:
    """Supplied order, only the current row; a new row when the next example does not fit."""
    row_of, start_of = np.empty((2, lengths.shape[0]), dtype=np.int64)
    kernels = engine.resolve(kernels)
    engine.call(kernels, "next_fit_loop", lengths, capacity, row_of, start_of, inputs=1)
    return row_of, start_of


def padded(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Right padding: example ``i`` alone in row ``i`` (the unpacked baseline)."""
    n = lengths.shape[0]
    return np.arange(n, dtype=np.int64), np.zeros(n, dtype=np.int64)


def decreasing_order(lengths: np.ndarray, capacity: int, kernels: str = "auto") -> np.ndarray:
    """Example indices by length, longest first, ties in supplied order; int64 [n]."""
    if engine.resolve(kernels) == "python" or capacity > 4 * lengths.shape[0] + 65536:
        # the same order; a counting sort would spend more on its counts
        return np.argsort(-lengths, kind="stable").astype(np.int64)
    order = np.empty(lengths.shape[0], dtype=np.int64)
    counts = np.zeros(capacity + 2, dtype=np.int64)
    engine.call("native", "counting_sort", lengths, capacity, counts, order)
    return order


def _row_bound(lengths: np.ndarray, capacity: int) -> int:
    """Rows any fit-into-an-open-row policy can need: ``min(n, 2 * lower + 1)`` (two rows
    always hold more than ``capacity`` together)."""
    lower = -(-int(lengths.sum()) // capacity)
    return max(min(lengths.shape[0], 2 * lower + 1), 1)


def first_fit_decreasing(
    lengths: np.ndarray, capacity: int, *, kernels: str = "auto"
) -> tuple[np.ndarray, np.ndarray]:
    """Longest first (ties in supplied order), each into the lowest-numbered row with room."""
    leaves = engine.pow2_at_least(_row_bound(lengths, capacity))
    tree = np.full(2 * leaves, capacity, dtype=np.int64)
    return _decreasing(lengths, capacity, engine.resolve(kernels), "first_fit", tree, leaves)


def best_fit_decreasing(
    lengths: np.ndarray, capacity: int, *, kernels: str = "auto"
) -> tuple[np.ndarray, np.ndarray]:
    """Longest first, each into the open row it fills most tightly (O(log capacity)); equal
    room oldest first, ties in length in supplied order; rows numbered as they open::

        lengths [3, 2, 4], capacity 6: order C(4) A(3) B(2)
        row 0: C C C C B B      B fills row 0 exactly (2 cells left)
        row 1: A A A . . .
    """
    kernels = engine.resolve(kernels)
    check_max_length(capacity, "best-fit-decreasing")
    leaves = engine.pow2_at_least(capacity)
    tree = np.zeros(2 * leaves, dtype=np.int64)
    head, tail = np.full((2, capacity), -1, dtype=np.int64)
    nxt = np.full(_row_bound(lengths, capacity), -1, dtype=np.int64)
    return _decreasing(lengths, capacity, kernels, "best_fit", tree, leaves, head, tail, nxt)


def _decreasing(
    lengths: np.ndarray, capacity: int, kernels: str, fit: str, *state: Any
) -> tuple[np.ndarray, np.ndarray]:
    """Run kernel ``fit`` over the examples longest first (in sorted order, scattered back
    after: sequential memory access); placements by example."""
    order = decreasing_order(lengths, capacity, kernels)
    rows, starts = np.empty((2, lengths.shape[0]), dtype=np.int64)
    engine.call(kernels, fit, lengths[order], capacity, *state, rows, starts, inputs=1)
    row_of, start_of = np.empty((2, lengths.shape[0]), dtype=np.int64)
    row_of[order], start_of[order] = rows, starts
    return row_of, start_of


def stream_best_fit(
    lengths: np.ndarray,
    capacity: int,
    *,
    lookahead: int | None = None,
    max_open_rows: int | None = None,
    seed: int = 0,
    kernels: str = "auto",
) -> tuple[np.ndarray, np.ndarray]:
    """:class:`~exactpack.core.stream_packer.StreamPacker` over an array (None: its defaults).

    ``lookahead`` and ``max_open_rows`` above the number of examples ``n`` plan as ``n``
    (the same plan: no example is forced out before :meth:`finish`, at most ``n`` rows
    open), so the buffers follow the input, never a huge setting."""
    lookahead = DEFAULT_LOOKAHEAD if lookahead is None else lookahead
    max_open_rows = DEFAULT_MAX_OPEN_ROWS if max_open_rows is None else max_open_rows
    StreamPacker.check_settings(capacity, lookahead, max_open_rows, seed, kernels)
    most = max(int(lengths.shape[0]), 1)
    packer = StreamPacker(
        capacity,
        lookahead=min(lookahead, most),
        max_open_rows=min(max_open_rows, most),
        seed=seed,
        kernels=kernels,
        max_bytes=None,  # bounded by the input, which is already in memory
    )
    row_of, start_of = np.empty((2, lengths.shape[0]), dtype=np.int64)
    for part in (packer.push(lengths), packer.finish()):
        row_of[part.example], start_of[part.example] = part.row, part.start
    return row_of, start_of


POLICIES: dict[str, PolicyFn] = {
    "next-fit": next_fit,
    "first-fit-decreasing": first_fit_decreasing,
    "best-fit-decreasing": best_fit_decreasing,
    "stream-best-fit": stream_best_fit,
    "padded": padded,
}


def _options_of(fn: PolicyFn) -> set[str]:
    params = inspect.signature(fn).parameters.values()
    return {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def policy_option_names() -> set[str]:
    """Every option any policy takes (``lookahead``, ``kernels``, ...)."""
    return set().union(*(_options_of(fn) for fn in POLICIES.values()))


def check_policy_options(policy: str, options: Mapping[str, Any], capacity: int = 1) -> None:
    """Raise :class:`InvalidInput` unless ``policy`` exists and takes ``options`` (its
    keyword-only parameters, values checked as it checks them), allocating nothing."""
    if policy not in POLICIES:
        raise InvalidInput(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    known = _options_of(POLICIES[policy])
    unknown = set(options) - known
    if unknown:
        first = sorted(unknown)[0]
        owners = [name for name, fn in POLICIES.items() if first in _options_of(fn)]
        whose = f" ({first} is {owners[0]}'s: policy={owners[0]!r})" if owners else ""
        raise InvalidInput(
            f"policy {policy!r} takes no option {', '.join(sorted(unknown))};"
            f" its options: {', '.join(sorted(known)) or 'none'}{whose}"
            f"{did_you_mean(first, known) if not owners else ''}"
        )
    if policy == "stream-best-fit":
        StreamPacker.check_settings(capacity, **{k: v for k, v in options.items() if v is not None})
    elif "kernels" in options:
        engine.resolve(options["kernels"])


def plan_rows(lengths: Any, capacity: int, policy: str = "next-fit", **options: Any) -> Plan:
    """Plan whole examples of prediction ``lengths`` into rows with a :data:`POLICIES` name
    (``stream-best-fit`` takes ``lookahead``, ``max_open_rows``, ``seed``; every policy but
    ``padded`` takes ``kernels="auto"|"native"|"python"``, with the same plan).

    >>> plan = plan_rows([3, 2, 4], 6)
    >>> plan.row_of.tolist(), plan.start_of.tolist(), plan.num_rows
    ([0, 0, 1], [0, 3, 0], 2)
    >>> plan_rows([3, 2, 4], 6, "best-fit-decreasing").row_of.tolist()
    [1, 0, 0]
    """
    labels = options.pop("labels", None)
    check_policy_options(policy, options)
    return plan_lengths(check_lengths(lengths, capacity, labels), int(capacity), policy, options)


def plan_lengths(
    lengths: np.ndarray, capacity: int, policy: str, options: Mapping[str, Any]
) -> Plan:
    """:func:`plan_rows` for checked lengths (int64 [n] in ``[1, capacity]``) and options."""
    row_of, start_of = POLICIES[policy](lengths, capacity, **options)
    num_rows = int(row_of.max()) + 1 if lengths.shape[0] else 0
    return Plan(lengths, row_of, start_of, num_rows, capacity, policy)


# ------------------------------------------------------------ counts
# ``B`` rows of width ``T``: ``B*T`` cells, ``B*T^2`` dense scores per head; a causal
# segment of ``l`` pairs permits ``l(l+1)/2`` edges (legal, not computed).


def layout_counts(rows: int, width: int, lengths: Any) -> dict[str, Any]:
    """Counts for ``rows`` x ``width`` storage holding segments of ``lengths``."""
    lens = np.asarray(lengths, dtype=np.int64)
    cells = rows * width
    valid = int(lens.sum())
    return {
        "rows": rows,
        "width": width,
        "cells": cells,
        "valid_cells": valid,
        "dense_scores_per_head": rows * width * width,
        "semantic_edges": int((lens * (lens + 1) // 2).sum()),
        "valid_density": valid / cells if cells else 0.0,
    }


def batch_counts(batch: Any) -> dict[str, Any]:
    """:func:`layout_counts` of a :class:`~exactpack.core.batch.PackedBatch`."""
    occ = batch.occurrences
    rows, width = batch.shape
    return layout_counts(rows, width, occ.col_end - occ.col_start)


def compare_layouts(lengths: Any, capacity: int, policy: str = "next-fit") -> dict[str, Any]:
    """Padded (one example per row, width = longest) versus packed at ``capacity``."""
    lens = np.asarray(lengths, dtype=np.int64)
    plan = plan_rows(lens, capacity, policy)
    return {
        "padded": layout_counts(int(lens.shape[0]), int(lens.max()), lens),
        "packed": layout_counts(plan.num_rows, capacity, lens),
    }
