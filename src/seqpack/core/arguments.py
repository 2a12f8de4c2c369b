"""Public API arguments checked at the border: a wrong type is one line naming it
(``out must be a path (str or os.PathLike), got int 5``), not a deep ``TypeError``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from seqpack.core.errors import InvalidInput


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


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
