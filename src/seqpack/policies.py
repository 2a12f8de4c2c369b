"""Packing policies: which row and column each whole example starts at.

A policy sees only prediction lengths (integers, no tokens) and returns a
:class:`Plan`. Every policy places each example exactly once and whole;
none splits, drops or duplicates. Next-fit (the seed's) also keeps the
supplied order::

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

The loops run in :mod:`seqpack._kernels` (numba when installed, else the
same code in plain Python; both give identical plans).
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _kernels
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

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan as one ``.npz`` file (int64 arrays plus a JSON header)."""
        header = {"policy": self.policy, "capacity": self.capacity, "num_rows": self.num_rows}
        with open(path, "wb") as fh:
            np.savez(
                fh,
                header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8),
                lengths=self.lengths,
                row_of=self.row_of,
                start_of=self.start_of,
            )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        """Read a plan written by :meth:`save`; it is validated before use."""
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(data["header"].tobytes().decode())
            arrays = {k: data[k].astype(np.int64) for k in ("lengths", "row_of", "start_of")}
        return cls.from_dict({**header, **arrays})


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


def positive_int(name: str, value: Any, maximum: int | None = None) -> int:
    """``value`` as an ``int`` when it is an integer (not a bool) in ``[1, maximum]``.

    Otherwise :class:`~seqpack.errors.InvalidInput` naming ``name``, the value
    and the range.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, np.integer))
        or value < 1
        or (maximum is not None and value > maximum)
    ):
        if maximum is None:
            raise InvalidInput(f"{name} must be a positive integer, got {value!r}")
        raise InvalidInput(
            f"{name} must be an integer in [1, {maximum:,}], got {value!r} — pass a positive"
            " integer within that range"
        )
    return int(value)


def check_lengths(
    lengths: Any, capacity: int, labels: Callable[[int], str] | None = None
) -> np.ndarray:
    """Validate lengths against ``capacity``; return int64 [n]."""
    positive_int("capacity", capacity)
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


def next_fit(
    lengths: np.ndarray, capacity: int, *, engine: str = "auto"
) -> tuple[np.ndarray, np.ndarray]:
    """The seed's policy: supplied order, fill only the current row, never revisit.

    An exact fill makes no empty row: a new row opens only when the next
    example does not fit in the cells left.
    """
    n = lengths.shape[0]
    row_of = np.empty(n, dtype=np.int64)
    start_of = np.empty(n, dtype=np.int64)
    _kernels.call(
        _kernels.resolve(engine), "next_fit", lengths, capacity, row_of, start_of, inputs=1
    )
    return row_of, start_of


def one_per_row(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Right padding: example ``i`` alone in row ``i`` (the unpacked baseline)."""
    n = lengths.shape[0]
    return np.arange(n, dtype=np.int64), np.zeros(n, dtype=np.int64)


def decreasing_order(lengths: np.ndarray, capacity: int, engine: str = "auto") -> np.ndarray:
    """Example indices by length, longest first, ties in supplied order; int64 [n]."""
    if _kernels.resolve(engine) == "python" or capacity > 4 * lengths.shape[0] + 65536:
        # the same order; a counting sort would spend more on its counts
        return np.argsort(-lengths, kind="stable").astype(np.int64)
    order = np.empty(lengths.shape[0], dtype=np.int64)
    counts = np.zeros(capacity + 2, dtype=np.int64)
    _kernels.call("numba", "decreasing_order", lengths, capacity, counts, order, inputs=1)
    return order


def _row_bound(lengths: np.ndarray, capacity: int) -> int:
    """Rows any fit-into-an-open-row policy can need: ``min(n, 2 * lower + 1)``.

    Two rows of such a packing always hold more than ``capacity`` together
    (the first item of the later row did not fit in the earlier one).
    """
    lower = -(-int(lengths.sum()) // capacity)
    return max(min(lengths.shape[0], 2 * lower + 1), 1)


def first_fit_decreasing(
    lengths: np.ndarray, capacity: int, *, engine: str = "auto"
) -> tuple[np.ndarray, np.ndarray]:
    """Longest first, each into the lowest-numbered row with room.

    A max-tree over rows by remaining capacity finds that row in
    O(log rows), so planning is O(n log n). Deterministic: ties in length
    keep the supplied order.
    """
    engine = _kernels.resolve(engine)
    leaves = _kernels.pow2_at_least(_row_bound(lengths, capacity))
    tree = np.full(2 * leaves, capacity, dtype=np.int64)
    return _decreasing(lengths, capacity, engine, "first_fit", tree, leaves)


def best_fit_decreasing(
    lengths: np.ndarray, capacity: int, *, engine: str = "auto"
) -> tuple[np.ndarray, np.ndarray]:
    """Longest first, each into the open row it fills most tightly.

    A max-tree over remaining capacities finds the tightest row in
    O(log capacity); rows with equal room are used oldest first and ties
    in length keep the supplied order, so the plan is deterministic.
    Rows are numbered in the order they open::

        lengths [3, 2, 4], capacity 6: order C(4) A(3) B(2)
        row 0: C C C C B B      B fills row 0 exactly (2 cells left)
        row 1: A A A . . .
    """
    engine = _kernels.resolve(engine)
    check_tree_capacity(capacity, "best-fit-decreasing")
    leaves = _kernels.pow2_at_least(capacity)
    tree = np.zeros(2 * leaves, dtype=np.int64)
    head = np.full(capacity, -1, dtype=np.int64)
    tail = np.full(capacity, -1, dtype=np.int64)
    nxt = np.full(_row_bound(lengths, capacity), -1, dtype=np.int64)
    return _decreasing(lengths, capacity, engine, "best_fit", tree, leaves, head, tail, nxt)


def _decreasing(
    lengths: np.ndarray, capacity: int, engine: str, kernel: str, *state: Any
) -> tuple[np.ndarray, np.ndarray]:
    """Run a fit ``kernel`` over the examples longest first; placements by example."""
    order = decreasing_order(lengths, capacity, engine)
    # The kernel reads lengths and writes placements in sorted order (sequential
    # memory access); scattering back afterwards is several times faster.
    n = lengths.shape[0]
    rows, starts = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    _kernels.call(engine, kernel, lengths[order], capacity, *state, rows, starts, inputs=1)
    row_of, start_of = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    row_of[order] = rows
    start_of[order] = starts
    return row_of, start_of


MAX_TREE_CAPACITY = 1 << 22


def check_tree_capacity(capacity: int, policy: str) -> None:
    """Best-fit policies index remaining capacities: keep the tree small."""
    if capacity > MAX_TREE_CAPACITY:
        raise InvalidInput(
            f"capacity {capacity:,} exceeds {MAX_TREE_CAPACITY:,}, the largest {policy}"
            " indexes; use first-fit-decreasing or next-fit"
        )


def stream_best_fit(
    lengths: np.ndarray,
    capacity: int,
    *,
    window: int | None = None,
    max_open_rows: int | None = None,
    seed: int = 0,
    engine: str = "auto",
) -> tuple[np.ndarray, np.ndarray]:
    """:class:`~seqpack.stream_packer.StreamPacker` over an in-memory array.

    ``window`` / ``max_open_rows`` of None take the packer's defaults.
    """
    from . import stream_packer as sp

    packer = sp.StreamPacker(
        capacity,
        window=sp.DEFAULT_WINDOW if window is None else window,
        max_open_rows=sp.DEFAULT_MAX_OPEN_ROWS if max_open_rows is None else max_open_rows,
        seed=seed,
        engine=engine,
    )
    parts = [packer.push(lengths), packer.finish()]
    n = lengths.shape[0]
    row_of = np.empty(n, dtype=np.int64)
    start_of = np.empty(n, dtype=np.int64)
    for part in parts:
        row_of[part.example] = part.row
        start_of[part.example] = part.start
    return row_of, start_of


POLICIES: dict[str, PolicyFn] = {
    "next-fit": next_fit,
    "first-fit-decreasing": first_fit_decreasing,
    "best-fit-decreasing": best_fit_decreasing,
    "stream-best-fit": stream_best_fit,
    "padded": one_per_row,
}


def _options_of(fn: PolicyFn) -> set[str]:
    params = inspect.signature(fn).parameters.values()
    return {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def plan_rows(lengths: Any, capacity: int, policy: str = "next-fit", **options: Any) -> Plan:
    """Plan whole examples of the given prediction ``lengths`` into rows.

    ``policy``: ``next-fit`` (supplied order, the default),
    ``first-fit-decreasing``, ``best-fit-decreasing`` (fewest rows),
    ``stream-best-fit`` (options ``window``, ``max_open_rows``, ``seed``)
    or ``padded`` (one example per row). Every policy but ``padded`` takes
    ``engine="auto"|"numba"|"python"``; both engines give the same plan.

    >>> plan = plan_rows([3, 2, 4], 6)
    >>> plan.row_of.tolist(), plan.start_of.tolist(), plan.num_rows
    ([0, 0, 1], [0, 3, 0], 2)
    >>> plan_rows([3, 2, 4], 6, "best-fit-decreasing").row_of.tolist()
    [1, 0, 0]
    """
    if policy not in POLICIES:
        raise InvalidInput(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    labels = options.pop("labels", None)
    unknown = set(options) - _options_of(POLICIES[policy])
    if unknown:
        raise InvalidInput(
            f"policy {policy!r} takes no option {', '.join(sorted(unknown))};"
            f" its options: {', '.join(sorted(_options_of(POLICIES[policy]))) or 'none'}"
        )
    arr = check_lengths(lengths, capacity, labels)
    row_of, start_of = POLICIES[policy](arr, int(capacity), **options)
    num_rows = int(row_of.max()) + 1 if arr.shape[0] else 0
    return Plan(arr, row_of, start_of, num_rows, int(capacity), policy)
