"""Packing policies: which row and column each whole example starts at.

A policy sees only prediction lengths (integers, no tokens) and returns a
:class:`Plan`. Every policy places each example exactly once and whole;
none splits, drops or duplicates. Next-fit (the seed's) also keeps the
supplied order::

    lengths [3, 2, 4], capacity 6, next-fit
    row 0: A A A B B .      A at column 0, B at column 3
    row 1: C C C C . .      C does not fit in the one free cell
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import InvalidInput, OversizedExample

PolicyFn = Callable[..., tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True, eq=False)
class Plan:
    """Placements of whole examples: example ``i`` occupies row ``row_of[i]``,
    columns ``[start_of[i], start_of[i] + lengths[i])``.

    Shapes: ``lengths``, ``row_of``, ``start_of`` int64 [n]. Rows are
    numbered ``0..num_rows-1`` with no empty row.
    """

    lengths: np.ndarray
    row_of: np.ndarray
    start_of: np.ndarray
    num_rows: int
    capacity: int
    policy: str

    def stats(self) -> dict[str, Any]:
        """examples, tokens (prediction pairs), rows, lower bound, efficiency."""
        tokens = int(self.lengths.sum())
        lower = -(-tokens // self.capacity)
        cells = self.num_rows * self.capacity
        return {
            "policy": self.policy,
            "capacity": self.capacity,
            "examples": int(self.lengths.shape[0]),
            "tokens": tokens,
            "rows": self.num_rows,
            "lower_bound": lower,
            "efficiency": tokens / cells if cells else 0.0,
        }

    def row_order(self) -> np.ndarray:
        """Example indices sorted by (row, start): storage order, int64 [n]."""
        return np.lexsort((self.start_of, self.row_of)).astype(np.int64)

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "capacity": self.capacity,
            "num_rows": self.num_rows,
            "lengths": self.lengths.tolist(),
            "row_of": self.row_of.tolist(),
            "start_of": self.start_of.tolist(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        plan = cls(
            lengths=np.asarray(data["lengths"], dtype=np.int64),
            row_of=np.asarray(data["row_of"], dtype=np.int64),
            start_of=np.asarray(data["start_of"], dtype=np.int64),
            num_rows=int(data["num_rows"]),
            capacity=int(data["capacity"]),
            policy=str(data["policy"]),
        )
        validate_plan(plan)
        return plan


def validate_plan(plan: Plan) -> None:
    """Check a plan places every example once, whole, inside a row, without overlap."""
    n = plan.lengths.shape[0]
    if plan.row_of.shape != (n,) or plan.start_of.shape != (n,):
        raise InvalidInput("plan arrays must have one entry per example")
    if n == 0:
        if plan.num_rows:
            raise InvalidInput("an empty plan has no rows")
        return
    ends = plan.start_of + plan.lengths
    if plan.start_of.min() < 0 or ends.max() > plan.capacity:
        raise InvalidInput("plan places an example outside its row")
    if plan.row_of.min() < 0 or plan.row_of.max() >= plan.num_rows:
        raise InvalidInput("plan refers to a row outside 0..num_rows-1")
    order = plan.row_order()
    r, s, e = plan.row_of[order], plan.start_of[order], ends[order]
    same = r[1:] == r[:-1]
    if np.any(same & (s[1:] < e[:-1])):
        raise InvalidInput("plan places two examples on the same cells")
    if np.unique(plan.row_of).shape[0] != plan.num_rows:
        raise InvalidInput("plan has an empty row")


def check_lengths(
    lengths: Any, capacity: int, labels: Callable[[int], str] | None = None
) -> np.ndarray:
    """Validate lengths against ``capacity``; return int64 [n]."""
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
        raise InvalidInput(f"capacity must be a positive integer, got {capacity!r}")
    arr = np.asarray(lengths)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise InvalidInput("lengths must be a 1-D integer array of prediction pairs per example")
    arr = arr.astype(np.int64, copy=False)
    if arr.size:
        if arr.min() < 1:
            i = int(np.argmin(arr))
            name = labels(i) if labels else f"example {i}"
            raise InvalidInput(f"{name} has {int(arr[i])} prediction pairs; each needs at least 1")
        if arr.max() > capacity:
            i = int(np.argmax(arr > capacity))
            name = labels(i) if labels else f"example {i}"
            raise OversizedExample(
                f"{name} has {int(arr[i])} prediction pairs; capacity is {capacity}"
                " — raise --capacity or pre-split with --split-long"
            )
    return arr


def next_fit(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """The seed's policy: supplied order, fill only the current row, never revisit.

    An exact fill makes no empty row: a new row opens only when the next
    example does not fit in the cells left.
    """
    n = lengths.shape[0]
    row_of = np.empty(n, dtype=np.int64)
    start_of = np.empty(n, dtype=np.int64)
    row, used = 0, 0
    for i, length in enumerate(lengths.tolist()):
        if length > capacity - used:
            row += 1
            used = 0
        row_of[i] = row
        start_of[i] = used
        used += length
    return row_of, start_of


def one_per_row(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Right padding: example ``i`` alone in row ``i`` (the unpacked baseline)."""
    n = lengths.shape[0]
    return np.arange(n, dtype=np.int64), np.zeros(n, dtype=np.int64)


POLICIES: dict[str, PolicyFn] = {
    "next-fit": next_fit,
    "padded": one_per_row,
}


def plan_rows(lengths: Any, capacity: int, policy: str = "next-fit", **options: Any) -> Plan:
    """Plan whole examples of the given prediction ``lengths`` into rows.

    >>> plan = plan_rows([3, 2, 4], 6)
    >>> plan.row_of.tolist(), plan.start_of.tolist(), plan.num_rows
    ([0, 0, 1], [0, 3, 0], 2)
    """
    if policy not in POLICIES:
        raise InvalidInput(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    labels = options.pop("labels", None)
    arr = check_lengths(lengths, capacity, labels)
    row_of, start_of = POLICIES[policy](arr, int(capacity), **options)
    num_rows = int(row_of.max()) + 1 if arr.shape[0] else 0
    return Plan(arr, row_of, start_of, num_rows, int(capacity), policy)
