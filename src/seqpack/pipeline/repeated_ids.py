"""Repeated ids: counted exactly (Arrow hashes the strings), reported once per run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def duplicate_ids(ids: np.ndarray) -> tuple[int, int, int]:
    """Rows whose id repeats an earlier row's: ``(count, first such row, the row it repeats)``.

    ``(0, -1, -1)`` when every id is distinct. Arrow hashes the strings; the
    rest is vectorised (a row is a repeat unless its value's code is new).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = ids if isinstance(ids, (pa.Array, pa.ChunkedArray)) else pa.array(ids, type=pa.string())
    if pc.count_distinct(arr).as_py() == len(arr):
        return 0, -1, -1
    codes = pc.index_in(arr, value_set=pc.unique(arr)).to_numpy(zero_copy_only=False)
    seen = np.maximum.accumulate(codes)
    new = np.ones(codes.shape[0], dtype=bool)
    new[1:] = codes[1:] > seen[:-1]
    repeat = int(np.argmax(~new))
    return int((~new).sum()), repeat, int(np.argmax(codes == codes[repeat]))


def duplicate_report(ids: Any, locate: Callable[[int], str]) -> dict[str, Any]:
    """``duplicate_ids`` and, when some repeat, ``duplicate_first`` (its id, where, first seen).

    ``ids``: every input row's id in order (NumPy or Arrow strings);
    ``locate(row)`` names an input row (file and line, or block and row).
    """
    count, row, first = duplicate_ids(ids)
    if not count:
        return {"duplicate_ids": 0}
    return {
        "duplicate_ids": count,
        "duplicate_first": {"id": _text(ids[row]), "at": locate(row), "first_seen": locate(first)},
    }


def _text(value: Any) -> str:
    return str(value.as_py() if hasattr(value, "as_py") else value)
