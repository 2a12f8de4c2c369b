"""Checks of the numbers every layer relies on: positive settings, lengths, tree sizes.

Command-line text becomes a number through :func:`parse_count` and
:func:`parse_byte_size` only: both refuse ``inf``, ``nan``, fractions,
negative and absurd values with one line naming the option.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
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


def parse_count(text: str, name: str) -> int:
    """A positive integer written in decimal (``4096``, ``10_000``), at most 2**62."""
    body = str(text).strip().replace("_", "")
    if not body.isdigit():
        raise InvalidInput(f"{name} {text!r} is not a positive whole number — write e.g. 4096")
    return positive_int(name, int(body), MAX_OPTION_VALUE)


def parse_byte_size(text: str, name: str) -> int:
    """``123``, ``512K``, ``1.5G``, ``2GiB`` (powers of 1024) as a byte count in [1, 2**62]."""
    match = _BYTE_SIZE.match(str(text))
    if match is None:
        raise InvalidInput(f"{name} {text!r} is not a byte size like 512M or 2G")
    value = float(match[1]) * (1 << _UNITS[match[2].upper()])
    if not math.isfinite(value) or value >= MAX_OPTION_VALUE:
        raise InvalidInput(f"{name} {text!r} is beyond any machine's memory — write e.g. 2G")
    return positive_int(name, int(value), MAX_OPTION_VALUE)


def parse_option(item: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> ``(key, value)``: dashes in the key become underscores; the
    value is JSON when it parses (numbers, booleans, lists), else the text itself.
    Non-finite numbers (``Infinity``, ``NaN``) are refused."""
    key, sep, value = str(item).partition("=")
    if not sep or not key.strip():
        raise InvalidInput(f"--option {item!r} is not KEY=VALUE")

    def refuse(constant: str) -> Any:
        raise InvalidInput(f"--option {item!r}: {constant} is not a usable value")

    try:
        parsed: Any = json.loads(value, parse_constant=refuse)
    except json.JSONDecodeError:
        parsed = value
    return key.strip().replace("-", "_"), parsed
