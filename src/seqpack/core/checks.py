"""Checks of the numbers every layer relies on: positive settings, lengths, tree sizes.

Command-line text becomes a number through :func:`parse_int` (and
:func:`parse_count`), :func:`parse_byte_size` and :func:`parse_option` only:
they refuse ``inf``, ``nan``, fractions, out-of-range and absurd values with
one line naming the option.
"""

from __future__ import annotations

import json
import math
import re
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
                " — raise --capacity or pre-split with --split-long"
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


#: The largest count or byte size any option takes (2**62: far beyond any machine).
MAX_OPTION_VALUE = 1 << 62
_UNITS = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40, "P": 50}
_BYTE_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(?:I?B)?\s*$", re.IGNORECASE)
_INTEGER = re.compile(r"^[+-]?\d+(?:_\d+)*$")


def parse_int(text: str, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """A whole number written in decimal (``4096``, ``10_000``, ``-3``), within ``±2**62``
    and, when given, ``[minimum, maximum]``.

    ``inf``, ``nan``, ``1e3`` and ``4096.0`` are refused with one line naming
    ``name``; a range the caller does not give here (a positive capacity,
    say) is checked where the value is used.
    """
    body = str(text).strip()
    if not _INTEGER.match(body):
        raise InvalidInput(f"{name} {text!r} is not a whole number — write e.g. 4096")
    if len(body) > 100 or abs(int(body)) > MAX_OPTION_VALUE:  # int() of 100 digits is cheap
        raise InvalidInput(f"{name} {text!r} is beyond any usable size (at most 2**62)")
    value = int(body)
    low = -MAX_OPTION_VALUE if minimum is None else minimum
    high = MAX_OPTION_VALUE if maximum is None else maximum
    if not low <= value <= high:
        raise InvalidInput(
            f"{name} {text!r} is outside [{low:,}, {high:,}] — pass a value in that range"
        )
    return value


def parse_count(text: str, name: str) -> int:
    """A positive integer written in decimal (``4096``, ``10_000``), at most 2**62."""
    return parse_int(text, name, 1, MAX_OPTION_VALUE)


def parse_byte_size(text: str, name: str) -> int:
    """``123``, ``512K``, ``1.5G``, ``2GiB`` (powers of 1024) as a byte count in [1, 2**62]."""
    match = _BYTE_SIZE.match(str(text)) if len(str(text)) <= 40 else None
    if match is None:
        raise InvalidInput(f"{name} {text!r} is not a byte size like 512M or 2G")
    value = float(match[1]) * (1 << _UNITS[match[2].upper()])
    if not math.isfinite(value) or value >= MAX_OPTION_VALUE:
        raise InvalidInput(f"{name} {text!r} is beyond any machine's memory — write e.g. 2G")
    return positive_int(name, int(value), MAX_OPTION_VALUE)


def check_option_value(value: Any, where: str) -> Any:
    """``value`` (parsed JSON) unless it holds a non-finite or absurd number, at any depth."""
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidInput(f"{where}: {value} is not a usable value — write a finite number")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if abs(value) > MAX_OPTION_VALUE:
            raise InvalidInput(
                f"{where}: {value:.3g} is beyond any usable size (at most 2**62) — write a"
                " smaller number"
            )
    elif isinstance(value, list):
        for item in value:
            check_option_value(item, where)
    elif isinstance(value, dict):
        for item in value.values():
            check_option_value(item, where)
    return value


def parse_option(item: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> ``(key, value)``: dashes in the key become underscores; the
    value is JSON when it parses (numbers, booleans, lists), else the text itself.
    Non-finite numbers (``Infinity``, ``NaN``, ``1e999``) and numbers beyond
    ``±2**62`` are refused."""
    key, sep, value = str(item).partition("=")
    if not sep or not key.strip():
        raise InvalidInput(f"--option {item!r} is not KEY=VALUE — write e.g. window=4096")

    def refuse(constant: str) -> Any:
        raise InvalidInput(
            f"--option {item!r}: {constant} is not a usable value — write a finite number"
        )

    try:
        parsed: Any = json.loads(value, parse_constant=refuse)
    except InvalidInput:
        raise
    except (ValueError, RecursionError):  # JSONDecodeError; ints past Python's digit limit
        parsed = value
    return key.strip().replace("-", "_"), check_option_value(parsed, f"--option {item!r}")


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
