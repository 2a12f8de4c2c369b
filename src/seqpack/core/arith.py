"""Checked byte arithmetic for the metadata budget: every intermediate kept below
``MAX_BYTES`` (what an int64 offset can address) and compared with the limit before
NumPy is asked for memory."""

from __future__ import annotations

from seqpack.core.errors import BudgetExceeded

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
