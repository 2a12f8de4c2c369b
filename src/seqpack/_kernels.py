"""Planning kernels: one plain-Python source, run compiled (numba) or as is.

Every kernel below is written in the subset of Python that numba compiles:
integer loops over 1-D int64 arrays, no allocation, results written into
arrays the caller passes in. :func:`kernels` returns them for an engine:

- ``"numba"``: compiled with ``numba.njit(cache=True)`` on first use (the
  optional ``seqpack[fast]`` extra); compiled code is cached on disk, so
  only the first process pays the compile time.
- ``"python"``: the same functions run by CPython. :func:`call` hands them
  Python lists (several times faster than NumPy scalar indexing) and copies
  the results back, so both engines produce identical plans.
- ``"auto"``: numba when it imports, else python.

Kernels call each other by module-level name. For the numba engine those
names are rebound to compiled dispatchers (numba resolves globals when it
compiles); the python engine runs copies of the functions whose globals map
the same names to the plain functions.

Two search trees recur (``leaves`` a power of two, node ``k`` has children
``2k`` and ``2k+1``, leaf ``i`` is node ``leaves + i``, every inner node
holds the maximum of its children):

- over rows by remaining capacity: the leftmost leaf holding at least ``n``
  is the first row an item of length ``n`` fits in (first fit);
- over remaining capacities ``r``: leaf ``r`` holds ``r`` while some row has
  exactly ``r`` cells left, else 0, so the leftmost leaf holding at least
  ``n`` is the tightest row that fits (best fit) — O(log capacity) per item,
  as in "Fewer Truncations Improve Language Modeling" (Ding et al., 2024).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import FunctionType
from typing import Any

import numpy as np

from .errors import InvalidInput, NotAvailable

ENGINES = ("auto", "numba", "python")

_PLAIN: dict[str, FunctionType] = {}


def kernel(fn: FunctionType) -> FunctionType:
    """Register ``fn`` as a kernel (see the module docstring)."""
    _PLAIN[fn.__name__] = fn
    return fn


# --------------------------------------------------------------- trees


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


# --------------------------------------------------------------- in-memory policies


@kernel
def next_fit(lengths, capacity, row_of, start_of):
    """Supplied order, only the current row; returns the number of rows."""
    row = 0
    used = 0
    for i in range(len(lengths)):
        n = lengths[i]
        if n > capacity - used:
            row += 1
            used = 0
        row_of[i] = row
        start_of[i] = used
        used += n
    return row + 1 if len(lengths) > 0 else 0


@kernel
def decreasing_order(lengths, capacity, counts, order):
    """Counting sort: indices by length descending, ties by index (stable).

    ``counts`` is int64 [capacity + 2] of zeros.
    """
    n = len(order)
    for i in range(n):
        counts[capacity - lengths[i] + 1] += 1
    for k in range(1, capacity + 2):
        counts[k] += counts[k - 1]
    for i in range(n):
        k = capacity - lengths[i]
        order[counts[k]] = i
        counts[k] += 1


@kernel
def first_fit(sizes, capacity, tree, leaves, row_of, start_of):
    """First fit of items ``sizes[j]``, j = 0, 1, ...: the lowest-numbered row
    with room. Writes ``row_of[j]``, ``start_of[j]``; returns the row count.

    ``tree`` is int64 [2 * leaves] filled with ``capacity`` (every row not
    yet opened is empty, so the leftmost fitting leaf is either an open row
    or the next row to open).
    """
    rows = 0
    for j in range(len(sizes)):
        n = sizes[j]
        row = tree_first_at_least(tree, leaves, n)
        left = tree[leaves + row]
        if row == rows:
            rows += 1
        row_of[j] = row
        start_of[j] = capacity - left
        tree_set(tree, leaves, row, left - n)
    return rows


@kernel
def best_fit(sizes, capacity, tree, leaves, head, tail, nxt, row_of, start_of):
    """Best fit of items ``sizes[j]``, j = 0, 1, ...: the open row with the
    fewest cells left that still fit; rows with equal room oldest first.
    Writes ``row_of[j]``, ``start_of[j]``; returns the row count.

    ``tree`` int64 [2 * leaves] zeros over remaining capacities
    ``0..capacity-1``; ``head``/``tail`` int64 [capacity] of -1; ``nxt``
    int64 [max rows].
    """
    rows = 0
    for j in range(len(sizes)):
        n = sizes[j]
        left = tree_first_at_least(tree, leaves, n)
        if left >= 0:
            row = bucket_pop(tree, leaves, head, tail, nxt, left)
        else:
            row = rows
            rows += 1
            left = capacity
        row_of[j] = row
        start_of[j] = capacity - left
        if left > n:
            bucket_push(tree, leaves, head, tail, nxt, left - n, row)
    return rows


# --------------------------------------------------------------- dispatch

_COMPILED: dict[str, Callable[..., Any]] | None = None
_PYTHON: dict[str, Callable[..., Any]] | None = None
_NUMBA_ERROR: str | None = None


def numba_available() -> bool:
    """Whether numba imports here (``SEQPACK_ENGINE=python`` pretends it does not)."""
    return _compiled() is not None


def _compiled() -> dict[str, Callable[..., Any]] | None:
    global _COMPILED, _NUMBA_ERROR
    if _COMPILED is None and _NUMBA_ERROR is None:
        if os.environ.get("SEQPACK_ENGINE", "").lower() == "python":
            _NUMBA_ERROR = "SEQPACK_ENGINE=python is set"
            return None
        try:
            import numba
        except ImportError as err:
            _NUMBA_ERROR = f"numba is not installed ({err}); pip install 'seqpack[fast]'"
            return None
        _load_all()
        jit = numba.njit(cache=True, nogil=True, **_no_refcounts(numba))
        compiled = {name: jit(fn) for name, fn in _PLAIN.items()}
        for fn in _PLAIN.values():  # numba reads kernel names from module globals
            for name in compiled.keys() & fn.__globals__.keys():
                fn.__globals__[name] = compiled[name]
        _COMPILED = compiled
    return _COMPILED


def _no_refcounts(numba: Any) -> dict[str, Any]:
    """``_nrt=False`` where this numba knows it.

    Kernels never allocate, so they need no reference counting; without it
    a call that passes arrays to a helper numba does not inline costs no
    atomic increments (the streaming kernel ran 3x faster).
    """
    try:
        from numba.core.cpu import CPUTargetOptions
    except ImportError:
        return {}
    return {"_nrt": False} if hasattr(CPUTargetOptions, "_nrt") else {}


def _python() -> dict[str, Callable[..., Any]]:
    global _PYTHON
    if _PYTHON is None:
        _load_all()
        spaces: dict[int, dict[str, Any]] = {}
        copies = {}
        for name, fn in _PLAIN.items():
            space = spaces.setdefault(id(fn.__globals__), dict(fn.__globals__))
            copies[name] = FunctionType(fn.__code__, space, name, fn.__defaults__)
        for space in spaces.values():
            space.update({name: copies[name] for name in copies.keys() & space.keys()})
        _PYTHON = copies
    return _PYTHON


def _load_all() -> None:
    """Import every module that defines kernels, so all are registered."""
    from . import _stream_kernels  # noqa: F401


def resolve(engine: str) -> str:
    """``"auto"`` -> ``"numba"`` when available, else ``"python"``; checks the name."""
    if engine not in ENGINES:
        raise InvalidInput(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if engine == "auto":
        return "numba" if _compiled() is not None else "python"
    if engine == "numba" and _compiled() is None:
        raise NotAvailable(f"engine 'numba' is not available: {_NUMBA_ERROR}")
    return engine


def call(engine: str, name: str, *args: Any, inputs: int = 0) -> Any:
    """Run kernel ``name`` with the resolved ``engine`` ("numba" or "python").

    For python, arrays (also inside tuples) travel as lists; every array
    after the first ``inputs`` arguments (which kernels only read) gets its
    list's final contents back.
    """
    if engine == "numba":
        compiled = _compiled()
        assert compiled is not None
        return compiled[name](*args)
    lists = [_as_lists(a) for a in args]
    result = _python()[name](*lists)
    for array, values in zip(args[inputs:], lists[inputs:], strict=True):
        _copy_back(array, values)
    return result


def _as_lists(arg: Any) -> Any:
    if isinstance(arg, np.ndarray):
        return arg.tolist()
    if isinstance(arg, tuple):
        return tuple(_as_lists(a) for a in arg)
    return arg


def _copy_back(arg: Any, values: Any) -> None:
    if isinstance(arg, np.ndarray):
        arg[...] = values
    elif isinstance(arg, tuple):
        for a, v in zip(arg, values, strict=True):
            _copy_back(a, v)


def pow2_at_least(n: int) -> int:
    """Smallest power of two ``>= max(n, 1)``."""
    return 1 << max(int(n) - 1, 0).bit_length()
