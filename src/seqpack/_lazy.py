"""Packages whose names load on first use, so importing one submodule never imports the rest."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, names: dict[str, str], moved: dict[str, str] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``names`` maps each exported name
    to the submodule (relative to ``package``) that defines it; ``moved`` maps a name
    that used to live here to the absolute module that holds it now (one release of
    ``DeprecationWarning``, then it goes)."""
    moved = moved or {}

    def getattr_(name: str) -> Any:
        if name in moved:
            warnings.warn(
                f"{package}.{name} moved to {moved[name]}.{name}; the old name goes in the "
                "next release",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(importlib.import_module(moved[name]), name)
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{names[name]}"), name)

    def dir_() -> list[str]:
        return sorted(names)

    return getattr_, dir_
