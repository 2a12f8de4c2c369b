"""The kernel engine: one plain-Python source per kernel, run as C (native) or as is.

Kernels are integer loops over 1-D arrays writing into arrays the caller passes, each
defined with :func:`kernel` and twinned by name in ``core/native.c`` (same loops,
tie-breaks, integer widths; built as ``exactpack.core.native``). :func:`call` runs one
with ``kernels`` ``"native"`` (the C extension), ``"python"`` (the same functions on
Python lists, results copied back: identical output) or ``"auto"`` (native when it
loads, else python with one warning). ``EXACTPACK_KERNELS=python`` makes native unavailable.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from types import FunctionType, ModuleType
from typing import Any

import numpy as np

from exactpack.core.errors import InvalidInput, NotAvailable

CHOICES = ("auto", "native", "python")

_PLAIN: dict[str, FunctionType] = {}


def kernel(fn: FunctionType) -> FunctionType:
    """Register ``fn`` as a kernel (see the module docstring)."""
    _PLAIN[fn.__name__] = fn
    return fn


_LOADED: dict[str, Any] = {}  # "module" (or None), "error", "warn": set by the first _native()


def _native() -> ModuleType | None:
    """The C kernels, or None (the reason in ``_LOADED["error"]``)."""
    if not _LOADED:
        var = "EXACTPACK_KERNELS"
        _LOADED.update(module=None, warn=False)
        if os.environ.get(var, "").lower() == "python":
            _LOADED["error"] = f"{var}={os.environ[var]} is set"
            return None
        try:
            from exactpack.core import native as module
        except ImportError as err:
            _LOADED.update(warn=True, error=(
                f"exactpack's C kernels are not built here ({err}); reinstall exactpack where a C"
                " compiler is found (pip install --force-reinstall --no-deps exactpack, or"
                " pip install -e . in a clone)"
            ))  # fmt: skip
        else:
            _LOADED["module"] = module
    return _LOADED["module"]


def native_available() -> bool:
    """Whether the C kernels load here (``EXACTPACK_KERNELS=python`` pretends they do not)."""
    return _native() is not None


def compiled(name: str) -> Callable[..., Any] | None:
    """C kernel ``name``, or None where the C kernels are unavailable."""
    module = _native()
    return None if module is None else getattr(module, name)


def resolve(kernels: str) -> str:
    """``"auto"`` -> ``"native"`` when available, else ``"python"``; checks the name."""
    if kernels not in CHOICES:
        raise InvalidInput(
            f"unknown engine {kernels!r} for kernels=; choose one of {', '.join(CHOICES)}"
        )
    if kernels == "auto":
        if _native() is not None:
            return "native"
        if _LOADED["warn"]:  # once per process
            _LOADED["warn"] = False
            warnings.warn(f"running the Python kernels (slower): {_LOADED['error']}", stacklevel=3)
        return "python"
    if kernels == "native" and _native() is None:
        raise NotAvailable(f"kernels 'native' are not available: {_LOADED['error']}")
    return kernels


def call(kernels: str, name: str, *args: Any, inputs: int = 0) -> Any:
    """Run kernel ``name`` with resolved ``kernels`` on int64 arrays (also in tuples); each
    after the first ``inputs`` (read-only) is written in place. For native, an array the C
    kernels cannot take as it is (strided, another integer dtype, big-endian) travels as a
    C-contiguous native int64 copy, copied back where written, so both kernels take what
    NumPy takes and give the same answer. For python, arrays travel as lists."""
    if kernels == "native":
        kernel = getattr(_LOADED["module"], name)
        ready = [_for_c(a, widen=False) for a in args]  # the dtypes a kernel reads as they are
        try:
            result = kernel(*ready)
        except TypeError as err:  # parsed before any work: this kernel takes int64 there
            if "unsupported array format" not in str(err):
                raise
            ready = [_for_c(a, widen=True) for a in args]
            result = kernel(*ready)
        for array, copy in zip(args[inputs:], ready[inputs:], strict=True):
            _copy_back(array, copy, only_copies=True)
        return result
    lists = [_as_lists(a) for a in args]
    result = _PLAIN[name](*lists)
    for array, values in zip(args[inputs:], lists[inputs:], strict=True):
        _copy_back(array, values)
    return result


def _as_lists(arg: Any) -> Any:
    if isinstance(arg, np.ndarray):
        return arg.tolist()
    if isinstance(arg, tuple):
        return tuple(_as_lists(a) for a in arg)
    return arg


def _for_c(arg: Any, widen: bool) -> Any:
    """``arg`` as the C kernels take it: C-contiguous and native-order, of its own dtype
    (a token array of any integer kind, a bool mask, an int32 output) or, with ``widen``,
    int64 (what the planning kernels read)."""
    if isinstance(arg, np.ndarray):
        dtype = np.dtype(np.int64) if widen else arg.dtype.newbyteorder("=")
        usable = arg.dtype == dtype and arg.dtype.isnative and arg.flags.c_contiguous
        return arg if usable else np.ascontiguousarray(arg, dtype=dtype)
    if isinstance(arg, tuple):
        return tuple(_for_c(a, widen) for a in arg)
    return arg


def _copy_back(arg: Any, values: Any, only_copies: bool = False) -> None:
    if isinstance(arg, np.ndarray):
        if not (only_copies and values is arg):
            arg[...] = values
    elif isinstance(arg, tuple):
        for a, v in zip(arg, values, strict=True):
            _copy_back(a, v, only_copies)


def pow2_at_least(n: int) -> int:
    """Smallest power of two ``>= max(n, 1)``."""
    return 1 << max(int(n) - 1, 0).bit_length()


# ------------------------------------------------------------ the search trees
# Max-trees for the planning kernels: ``leaves`` a power of two, node ``k`` has children
# ``2k``/``2k+1``, leaf ``i`` is node ``leaves + i``. Over rows by cells left, the leftmost
# leaf ``>= n`` is first fit; over cells left ``r`` (leaf ``r`` holds ``r`` while a row has
# exactly ``r`` left), it is best fit, O(log capacity) (Ding et al., 2024).


@kernel
def tree_set(tree, leaves, index, value):
    """Set leaf ``index`` to ``value`` and restore the maxima above it."""
    node = leaves + index
    tree[node] = value
    node //= 2
    while node > 0:
        left = tree[2 * node]
        right = tree[2 * node + 1]
        best = left if left >= right else right
        if tree[node] == best:
            break  # unchanged here, so unchanged above
        tree[node] = best
        node //= 2


@kernel
def tree_first_at_least(tree, leaves, n):
    """Index of the leftmost leaf holding ``>= n``, or -1."""
    if tree[1] < n:
        return -1
    node = 1
    while node < leaves:
        node = 2 * node + (tree[2 * node] < n)  # branch-free: the comparison is 0 or 1
    return node - leaves


@kernel
def tree_last_at_most(tree, leaves, r):
    """Index of the rightmost non-zero leaf at or left of ``r``, or -1."""
    node = leaves + r
    if tree[node] > 0:
        return r
    while node > 1:
        if node % 2 == 1 and tree[node - 1] > 0:
            node -= 1
            while node < leaves:  # rightmost non-zero leaf below
                node = 2 * node + (tree[2 * node + 1] > 0)
            return node - leaves
        node //= 2
    return -1


@kernel
def bucket_push(tree, leaves, head, tail, nxt, r, item):
    """Append ``item`` to FIFO bucket ``r``; mark ``r`` non-empty in ``tree``."""
    nxt[item] = -1
    if tail[r] == -1:
        head[r] = item
        tree_set(tree, leaves, r, r)
    else:
        nxt[tail[r]] = item
    tail[r] = item


@kernel
def bucket_pop(tree, leaves, head, tail, nxt, r):
    """Remove and return the oldest item of bucket ``r``."""
    item = head[r]
    head[r] = nxt[item]
    if head[r] == -1:
        tail[r] = -1
        tree_set(tree, leaves, r, 0)
    return item
