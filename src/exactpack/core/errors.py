"""One exception hierarchy for every failure exactpack reports, and the checks that raise it
at the border (public arguments, options, lengths, saved states). Messages name what was
wrong, which example and what to do: ``example 17 ('doc-42'[0:9001]) has 9000 prediction
pairs; capacity is 8192 — raise --max-length or cut it with --cut-long``.
"""

from __future__ import annotations

import contextlib
import difflib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np


class ExactpackError(Exception):
    """Root of every error exactpack raises on purpose."""


class InvalidInput(ExactpackError, ValueError):
    """Input data or arguments that cannot be used as given."""


class OversizedExample(InvalidInput):
    """An example has more prediction pairs than a row holds."""


class BindingMismatch(InvalidInput):
    """Vocabulary, tokenizer or split receipt differ from the expected binding."""


class SplitMismatch(InvalidInput):
    """An example of one partition was offered to a batch of another."""


class BudgetExceeded(ExactpackError):
    """A memory or cell budget would be exceeded; nothing was allocated."""


class EmptyObjective(ExactpackError):
    """A loss was requested over zero eligible targets (no denominator)."""


class NotAvailable(ExactpackError, RuntimeError):
    """A backend or optional dependency is missing on this machine."""


# ------------------------------------------------------------ the border for foreign errors

#: What other code raises on bad input: the OS's errors, decoding's (json, UTF-8 and
#: Arrow's ArrowInvalid are ValueErrors), a truncated stream's, a too-deep value's.
FOREIGN: tuple[type[BaseException], ...] = (OSError, ValueError, EOFError, RecursionError)
#: Libraries every error of which is foreign (known by module: the core imports neither).
FOREIGN_MODULES = ("pyarrow", "msgspec")


def is_foreign(err: BaseException, kinds: tuple[type[BaseException], ...] = FOREIGN) -> bool:
    """Whether the border translates ``err``: one of ``kinds``, or any error of
    :data:`FOREIGN_MODULES` (Arrow's ArrowTypeError, msgspec's DecodeError...), never
    exactpack's own."""
    if isinstance(err, ExactpackError):
        return False
    return isinstance(err, kinds) or type(err).__module__.split(".")[0] in FOREIGN_MODULES


def why(err: BaseException) -> str:
    """A foreign error's reason on one line: an OS error's ``strerror``, else its text (its
    type when it has none), at most 300 characters."""
    text = (err.strerror if isinstance(err, OSError) else None) or str(err) or type(err).__name__
    return " ".join(text.split())[:300]


@contextlib.contextmanager
def foreign(
    what: str | Callable[[], str], fix: str = "", kinds: tuple[type[BaseException], ...] = FOREIGN
) -> Iterator[None]:
    """The one border for foreign errors: one raised inside (:func:`is_foreign`) becomes one
    :class:`InvalidInput` line ``{what} ({why}) — {fix}``; exactpack's own pass as they are.
    ``what`` may be a function, called only on error (a row located by re-reading a file)::

        with foreign(f"{path}: cannot read as Parquet", "write it again"):
            pq.ParquetFile(f)  # "d.parquet: cannot read as Parquet (Parquet magic bytes
                               #  not found in footer...) — write it again"
    """
    try:
        yield
    except Exception as err:
        if not is_foreign(err, kinds):
            raise
        where = what() if callable(what) else what
        raise InvalidInput(f"{where} ({why(err)})" + (f" — {fix}" if fix else "")) from None


@contextlib.contextmanager
def naming(where: str) -> Iterator[None]:
    """An OS error raised inside that names no file (Arrow's, fsync's, an unnamed file's)
    names ``where``: a full disk says which file or folder (it stays an ``OSError``, exit 1)."""
    try:
        yield
    except OSError as err:
        if err.filename is not None:
            raise
        raise OSError(err.errno, err.strerror or str(err), where) from None


# ------------------------------------------------------------ checks at the border


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` — did you mean X?`` for the choice closest to a mistyped ``name``, or ``""``."""
    close = difflib.get_close_matches(name, sorted(choices), n=1, cutoff=0.75)
    return f" — did you mean {close[0]}?" if close else ""


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer (Python or NumPy), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def path_argument(name: str, value: Any) -> Path:
    """``value`` as a :class:`~pathlib.Path`, or :class:`InvalidInput` naming ``name``."""
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes):
        try:
            return Path(value)
        except TypeError:  # an os.PathLike whose __fspath__ returns bytes
            pass
    raise InvalidInput(f"{name} must be a path (str or os.PathLike), got {_shown(value)}")


def type_argument(name: str, value: Any, kinds: tuple[type, ...], expected: str) -> None:
    """Refuse ``value`` unless it is one of ``kinds`` (a bool is never an int; None only
    when ``type(None)`` is listed); ``expected`` says what to pass."""
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise InvalidInput(f"{name} must be {expected}, got {_shown(value)}")


def positive_int(name: str, value: Any, maximum: int | None = None) -> int:
    """``value`` as an ``int`` if an integer (not a bool) in ``[1, maximum]``, else
    :class:`InvalidInput`."""
    if not is_int(value) or value < 1 or (maximum is not None and value > maximum):
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
    """Validate lengths against ``capacity``; return int64 [n] (``labels(i)`` names example
    ``i``)."""
    positive_int("capacity", capacity)
    name = labels or (lambda i: f"example {i}")
    arr = np.asarray(lengths)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise InvalidInput("lengths must be a 1-D integer array of prediction pairs per example")
    arr = arr.astype(np.int64, copy=False)
    if arr.size:
        if arr.min() < 1:
            i = int(np.argmin(arr))
            raise InvalidInput(
                f"{name(i)} has {int(arr[i])} prediction pairs; each needs at least 1"
            )
        if arr.max() > capacity:
            i = int(np.argmax(arr > capacity))
            raise OversizedExample(
                f"{name(i)} has {int(arr[i])} prediction pairs; capacity is {capacity}"
                " — raise --max-length or cut it with --cut-long"
            )
    return arr


MAX_TREE_CAPACITY = 1 << 22


def check_max_length(capacity: int, policy: str) -> None:
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
    if not is_int(value):
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
    if not isinstance(value, (list, tuple)) or not all(map(is_int, value)):
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
