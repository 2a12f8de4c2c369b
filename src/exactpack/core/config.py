"""The limits of one packing (:class:`PackConfig`) and what materialising a plan costs, in
checked byte arithmetic (below ``MAX_BYTES``) before anything is allocated."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exactpack.core.binding import INT32_MAX
from exactpack.core.errors import BudgetExceeded, InvalidInput, positive_int
from exactpack.core.plan import Plan

MAX_BYTES = 2**63 - 1

#: bytes per cell of a packed batch: inputs, targets, segments, positions
#: (int32) plus input_valid, target_valid, loss_mask (bool).
CELL_BYTES = 4 * 4 + 3 * 1
#: bytes per occurrence record: ordinal, row, col_start, col_end, range_start,
#: range_end (int64), segment (int32), source and example id references (8 each).
OCCURRENCE_BYTES = 6 * 8 + 4 + 2 * 8
#: bytes per planned example: lengths, row_of, start_of, storage order (int64).
PLAN_BYTES = 4 * 8
#: transient int64 gather indices per real cell while a batch is materialised.
GATHER_BYTES = 4 * 8


def checked_mul(a: int, b: int) -> int:
    out = int(a) * int(b)
    if out > MAX_BYTES:
        raise BudgetExceeded(f"metadata size {a} * {b} overflows a 64-bit byte count")
    return out


def checked_add(*terms: int) -> int:
    out = 0
    for t in terms:
        out += int(t)
        if out > MAX_BYTES:
            raise BudgetExceeded("metadata size overflows a 64-bit byte count")
    return out


def enforce(
    need: int,
    limit: int | None,
    what: str = "packing metadata",
    fix: str = "pack fewer examples per call",
) -> None:
    """Raise :class:`BudgetExceeded` naming the need, the limit and ``fix`` (or more budget)."""
    if limit is not None and need > limit:
        raise BudgetExceeded(
            f"{what} needs {need:,} bytes but max_metadata_bytes is {limit:,}"
            f" — raise the budget or {fix}"
        )


@dataclass(frozen=True)
class PackConfig:
    """Validated limits: ``capacity`` cells per row (``max_length``), ``max_rows_per_batch``
    rows and ``max_cells`` cells per model call (default their product),
    ``max_metadata_bytes`` for what :func:`pack_examples` allocates (None: unlimited)."""

    capacity: int
    max_rows_per_batch: int
    max_cells: int | None = None
    max_metadata_bytes: int | None = None

    def __post_init__(self) -> None:
        cap = positive_int("capacity", self.capacity, INT32_MAX)
        rows = positive_int("max_rows_per_batch", self.max_rows_per_batch, INT32_MAX)
        cells = cap * rows if self.max_cells is None else self.max_cells
        cells = positive_int("max_cells", cells, MAX_BYTES)
        if cells < cap:
            raise InvalidInput(
                f"max_cells {cells} is smaller than one row of capacity {cap}"
                " — no model call could hold a row; raise max_cells"
            )
        if self.max_metadata_bytes is not None:
            positive_int("max_metadata_bytes", self.max_metadata_bytes, MAX_BYTES)
        object.__setattr__(self, "capacity", cap)
        object.__setattr__(self, "max_rows_per_batch", rows)
        object.__setattr__(self, "max_cells", cells)


def check_segment_namespace(count: int) -> None:
    """Occurrence segment ids ``0..count-1`` must fit int32."""
    if count > INT32_MAX + 1:
        raise InvalidInput(
            f"{count:,} occurrences do not fit int32 segment ids (at most {INT32_MAX + 1:,})"
            " — pack the corpus in several calls"
        )


def plan_metadata_bytes(plan: Plan, config: PackConfig) -> int:
    """Bytes :func:`materialize` allocates for ``plan``, before allocating: the plan's arrays
    and every occurrence record, every call's cells and the largest call's gather indices
    (:class:`BudgetExceeded` when a model call, the first the widest, exceeds ``max_cells``)."""
    n, rows_per = plan.lengths.shape[0], config.max_rows_per_batch
    rows = min(rows_per, plan.num_rows)
    if (cells := checked_mul(rows, config.capacity)) > config.max_cells:
        raise BudgetExceeded(
            f"model call of {rows} rows x {config.capacity} columns = {cells:,} cells"
            f" exceeds max_cells {config.max_cells:,} — lower max_rows_per_batch"
        )
    real = np.bincount(plan.row_of // rows_per, weights=plan.lengths) if n else np.zeros(1)
    return checked_add(
        checked_mul(n, PLAN_BYTES + OCCURRENCE_BYTES),
        checked_mul(checked_mul(plan.num_rows, config.capacity), CELL_BYTES),
        checked_mul(int(real.max()), GATHER_BYTES),
    )
