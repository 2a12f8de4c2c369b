"""Arrow list columns as flat, checked NumPy arrays: ``k`` rows become ``(values [Σn],
offsets int64 [k+1], present bool [k])``, row ``i`` being ``values[offsets[i]:offsets[i+1]]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exactpack.core.errors import InvalidInput
from exactpack.core.examples import offsets_of
from exactpack.io.documents import Origin


def column(table: pa.Table, name: str) -> pa.Array:
    """One column as one Arrow array (a single chunk as it is: no copy)."""
    col = table.column(name)
    if isinstance(col, pa.ChunkedArray):
        return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return col


def first(mask: pa.Array | np.ndarray) -> int:
    """The index of the first true entry (0 when none is)."""
    return int(np.argmax(np.asarray(mask)))


def row_of(offsets: np.ndarray, pos: int) -> int:
    """The row holding flat position ``pos``."""
    return int(np.searchsorted(offsets, pos, "right") - 1)


def lists(
    table: pa.Table, name: str, origin: Origin, optional: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A list column as ``(values, offsets, present)``; a null list is an error unless
    ``optional``, then it has no values and ``present`` is False for its row."""
    arr = column(table, name)
    present = ~pc.is_null(arr).to_numpy(zero_copy_only=False)
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        raise origin.type_error(
            f"column {name!r} has type {arr.type}; it must hold one list per row",
            first(present) if present.any() else None,
        )
    if not optional and not present.all():
        row = first(~present)
        raise InvalidInput(f"{origin.locate(row)}: {name} is missing — give every row {name}")
    counts = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
    offsets = offsets_of(counts)
    values = arr.flatten()
    if values.null_count:
        pos = first(pc.is_null(values).to_numpy(zero_copy_only=False))
        raise InvalidInput(
            f"{origin.locate(row_of(offsets, pos))}: {name} holds a null — use integers only"
        )
    return values.to_numpy(zero_copy_only=False), offsets, present


def show(value: Any) -> str:
    """A short repr of one cell for an error message (nested lists included)."""
    if isinstance(value, (np.ndarray, np.generic)):
        value = value.tolist()
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def ints(values: np.ndarray, offsets: np.ndarray, name: str, origin: Origin) -> np.ndarray:
    """``values`` when they are integers, else an error naming the row and position."""
    if values.size and (not np.issubdtype(values.dtype, np.integer) or values.dtype == np.bool_):
        pos = 0
        if np.issubdtype(values.dtype, np.floating):  # NaN, inf or a fraction first, if any
            pos = first(~np.isfinite(values) | (values != np.round(values)))
        row = row_of(offsets, pos)
        raise origin.type_error(
            f"{name} holds {values.dtype} values (e.g. {show(values[pos])} at position"
            f" {pos - int(offsets[row])}); token ids must be integers — tokenize the text"
            " first or pass --tokenizer",
            row,
        )
    return values


def flag_values(
    values: np.ndarray, offsets: np.ndarray, name: str, origin: Origin, fix: str
) -> np.ndarray:
    """A 0/1 column's values as bool, or an error naming the first other value and ``fix``."""
    if values.dtype == np.bool_:
        return values
    numeric = np.issubdtype(values.dtype, np.integer) or np.issubdtype(values.dtype, np.floating)
    bad = ~np.isin(values, (0, 1)) if numeric else np.ones(values.shape[0], dtype=bool)
    if values.size and (bad.any() or not np.issubdtype(values.dtype, np.integer)):
        pos = first(bad) if bad.any() else 0
        row = row_of(offsets, pos)
        raise origin.type_error(
            f"{name} holds {show(values[pos])} at position {pos - int(offsets[row])};"
            f" it must hold booleans or 0/1 — {fix}",
            row,
        )
    return values.astype(bool)


def target_flags(per_token: np.ndarray, firsts: np.ndarray) -> np.ndarray:
    """Drop the flags at ``firsts`` (a document's first token is no pair's target)."""
    keep = np.ones(per_token.shape[0], dtype=bool)
    keep[firsts] = False
    return per_token[keep]
