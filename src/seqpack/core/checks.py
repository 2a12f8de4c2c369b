"""Checks of the core's own numbers: positive settings, lengths, tree sizes, saved states.

(Command-line text is parsed in :mod:`seqpack.cli.flags`.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from seqpack.core.errors import InvalidInput, OversizedExample


def positive_int(name: str, value: Any, maximum: int | None = None) -> int:
    """``value`` as an ``int`` when it is an integer (not a bool) in ``[1, maximum]``.

    Otherwise :class:`~seqpack.core.errors.InvalidInput` naming ``name``, the value
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
                " — raise --max-length or pre-split with --split-long"
            )
    return arr


MAX_TREE_CAPACITY = 1 << 22


def check_tree_capacity(capacity: int, policy: str) -> None:
    """Best-fit policies index remaining capacities: keep the tree small."""
    if capacity > MAX_TREE_CAPACITY:
        raise InvalidInput(
            f"capacity {capacity:,} exceeds {MAX_TREE_CAPACITY:,}, the largest {policy}"
            " indexes; use first-fit-decreasing or next-fit"
        )


#: The largest count or byte size any option or saved state takes (2**62: beyond any machine).
MAX_OPTION_VALUE = 1 << 62


def state_value(state: Any, key: str, what: str) -> Any:
    """``state[key]`` of a saved ``what`` state, or one line saying it is not one."""
    if not isinstance(state, Mapping):
        raise InvalidInput(f"a {what} state is a mapping, not a {type(state).__name__}")
    if key not in state:
        raise InvalidInput(f"the {what} state has no {key!r} — save it again with state_dict()")
    return state[key]


def state_int(state: Any, key: str, what: str, low: int = 0, high: int = MAX_OPTION_VALUE) -> int:
    """``state[key]`` when it is an integer (not a bool or a float) in ``[low, high]``."""
    value = state_value(state, key, what)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InvalidInput(f"the {what} state's {key} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise InvalidInput(
            f"the {what} state's {key} {value:,} lies outside [{low:,}, {high:,}]"
            " — the state is damaged; save it again with state_dict()"
        )
    return int(value)


def state_ints(state: Any, key: str, what: str, low: int, high: int) -> list[int]:
    """``state[key]`` as a list of integers in ``[low, high]`` (no bools, floats or text)."""
    value = state_value(state, key, what)
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in value
    ):
        raise InvalidInput(f"the {what} state's {key} must be a list of integers")
    if value and not (low <= min(value) and max(value) <= high):
        raise InvalidInput(
            f"the {what} state's {key} holds a value outside [{low:,}, {high:,}]"
            " — the state is damaged; save it again with state_dict()"
        )
    return [int(v) for v in value]


def state_columns(
    state: Any, key: str, what: str, limits: dict[str, int]
) -> tuple[np.ndarray, ...]:
    """``state[key]``'s integer lists named in ``limits``, each value in ``[0, limit)`` and
    all of one length, as int64 arrays in the order of ``limits``."""
    table = state_value(state, key, what)
    columns = [state_ints(table, name, f"{what} {key}", 0, top - 1) for name, top in limits.items()]
    if len({len(c) for c in columns}) > 1:
        raise InvalidInput(f"the {what} state's {key} lists differ in length")
    return tuple(np.asarray(c, dtype=np.int64) for c in columns)
