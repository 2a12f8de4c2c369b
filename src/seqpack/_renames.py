"""The 0.2 spellings of renamed names and keywords, kept for one release.

The glossary of ``docs/architecture.md`` renamed a few public names (``Partition`` is
``Split``, ``load_packed(verify=)`` is ``integrity=``, ...). The old spelling still
works until 0.3, with a :class:`DeprecationWarning` naming the new one. The calls
to these helpers are written by ``scripts/codemods/vocab.py``.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def _warn(old: str, new: str, stacklevel: int = 3) -> None:
    warnings.warn(
        f"{old} is now {new}; the old name goes in the next release",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def renamed_names(
    module: str,
    renames: dict[str, str],
    fallback: Callable[[str], Any] | None = None,
) -> Callable[[str], Any]:
    """A module ``__getattr__`` that answers each old name of ``renames`` (old -> new)
    with the module's object of the new name, and a :class:`DeprecationWarning`; any
    other name goes to ``fallback`` (the module's own ``__getattr__``, if it had one)."""
    import sys

    def getattr_(name: str) -> Any:
        if name in renames:
            _warn(f"{module}.{name}", f"{module}.{renames[name]}")
            return getattr(sys.modules[module], renames[name])
        if fallback is not None:
            return fallback(name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return getattr_


#: ``PackOptions`` keywords of 0.2 (and 0.1) -> the field they now are.
OLD_FIELDS = {
    "capacity": "max_length",
    "split_long": "cut_long",
    "split_long_sources": "cut_long",
    "partition": "split",
}
#: Command-line flags of 0.2 -> the flag they now are (hidden from ``--help``, they
#: print one deprecation line on stderr and store into the new flag's value).
OLD_FLAGS = {
    "--capacity": "--max-length",
    "--split-long": "--cut-long",
    "--partition": "--split",
    "--tree-window": "--tree-block",
}
#: Policy options of 0.2 -> the option they now are (for the policies that take it).
OLD_OPTIONS = {"window": "lookahead"}


def renamed_kwargs(**renames: str) -> Callable[[F], F]:
    """Accept the old keyword ``old=`` of a function as ``new=`` (``old="new"``)."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{fn.__qualname__}() got both {old}= and {new}=")
                    _warn(f"{fn.__qualname__}({old}=)", f"{new}=")
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


__all__ = ["OLD_FIELDS", "OLD_FLAGS", "OLD_OPTIONS", "renamed_kwargs", "renamed_names"]
