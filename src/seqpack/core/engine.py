"""The kernel engine: one plain-Python source per kernel, run compiled (numba) or as is.

Kernels are written in the subset of Python that numba compiles: integer
loops over 1-D arrays, no allocation, results written into arrays the
caller passes in. A module defines them with :func:`kernel`; :func:`call`
runs one by name with an engine:

- ``"numba"``: compiled with ``numba.njit(cache=True)`` on first use (the
  optional ``seqpack[fast]`` extra); compiled code is cached on disk (beside
  the source, in ``~/.cache/numba`` for a read-only install, or in a
  temporary folder when neither is writable), so only the first process pays
  the compile time; later processes pay numba's own start-up (about 0.45 s
  here: its import and loading the cached kernels).
- ``"python"``: the same functions run by CPython. :func:`call` hands them
  Python lists (several times faster than NumPy scalar indexing) and copies
  the results back, so both engines produce identical results.
- ``"auto"``: numba when it imports, else python. ``SEQPACK_ENGINE=python``
  makes numba unavailable everywhere (planning and gathering alike). A call
  that says how much work it has (``work=``: examples to plan, tokens to
  gather) and has less than :data:`SMALL_WORK` runs without numba while numba
  is not yet imported in the process: its start-up (about 0.6 s of CPU) would
  cost more than the work (best-fit-decreasing on 20,000 examples in Python:
  0.1 s). Both engines give identical results, so only the time differs.

Kernels call each other by module-level name. For the numba engine those
names are rebound to compiled dispatchers (numba resolves globals when it
compiles); the python engine runs copies of the functions whose globals map
the same names to the plain functions. So a kernel's name is global: no
module may use it for anything else. Kernels registered after the first
compile (a module imported later) are compiled when next asked for.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from types import FunctionType
from typing import Any

import numpy as np

from seqpack.core.errors import InvalidInput, NotAvailable

ENGINES = ("auto", "numba", "python")
#: Work (examples planned, or tokens gathered / 64) below which ``"auto"`` does not import numba.
SMALL_WORK = 20_000

_PLAIN: dict[str, FunctionType] = {}


def kernel(fn: FunctionType) -> FunctionType:
    """Register ``fn`` as a kernel (see the module docstring)."""
    _PLAIN[fn.__name__] = fn
    return fn


_COMPILED: dict[str, Callable[..., Any]] = {}
_PYTHON: dict[str, Callable[..., Any]] = {}
_NUMBA_ERROR: str | None = None


def numba_available() -> bool:
    """Whether numba imports here (``SEQPACK_ENGINE=python`` pretends it does not)."""
    return _compiled() is not None


def _numba() -> Any:
    global _NUMBA_ERROR
    if _NUMBA_ERROR is not None:
        return None
    if os.environ.get("SEQPACK_ENGINE", "").lower() == "python":
        _NUMBA_ERROR = "SEQPACK_ENGINE=python is set"
        return None
    _cache_dir()
    try:
        import numba
    except ImportError as err:
        _NUMBA_ERROR = f"numba is not installed ({err}); pip install 'seqpack[fast]'"
        return None
    return numba


def _cache_dir() -> None:
    """``NUMBA_CACHE_DIR`` in the temporary folder (per user) when neither the package's
    ``__pycache__`` nor ``~/.cache`` is writable and the user set none."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    here = os.path.dirname(os.path.abspath(__file__))
    home = os.path.join(os.path.expanduser("~"), ".cache")
    if _writable(os.path.join(here, "__pycache__")) or _writable(home):
        return
    uid = getattr(os, "getuid", lambda: "user")()
    os.environ["NUMBA_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"seqpack-numba-{uid}")


def _writable(folder: str) -> bool:
    """Whether ``folder`` (or, when it does not exist yet, its parent) can be written."""
    while not os.path.isdir(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            return False
        folder = parent
    return os.access(folder, os.W_OK | os.X_OK)


def _compiled() -> dict[str, Callable[..., Any]] | None:
    """Every registered kernel as a numba dispatcher, or None without numba."""
    if len(_COMPILED) < len(_PLAIN):
        numba = _numba()
        if numba is None:
            return None
        jit = numba.njit(cache=True, nogil=True, **_no_refcounts(numba))
        for name, fn in _PLAIN.items():
            if name not in _COMPILED:
                _COMPILED[name] = jit(fn)
        for fn in _PLAIN.values():  # numba reads kernel names from module globals
            for name in _COMPILED.keys() & fn.__globals__.keys():
                fn.__globals__[name] = _COMPILED[name]
    return _COMPILED if _numba() is not None else None


def _small(work: int | None) -> bool:
    """Whether ``work`` is too little to pay for importing numba (see the module docstring)."""
    return work is not None and work < SMALL_WORK and "numba" not in sys.modules


def compiled(name: str, work: int | None = None) -> Callable[..., Any] | None:
    """Kernel ``name`` compiled by numba, or None where numba is unavailable (or ``work``
    is too small to import it for)."""
    if _small(work):
        return None
    kernels = _compiled()
    return None if kernels is None else kernels[name]


def _no_refcounts(numba: Any) -> dict[str, Any]:
    """``_nrt=False`` where this numba knows it: kernels never allocate, so they need no
    reference counting (the streaming kernel ran 3x faster without it)."""
    try:
        from numba.core.cpu import CPUTargetOptions
    except ImportError:
        return {}
    return {"_nrt": False} if hasattr(CPUTargetOptions, "_nrt") else {}


def _python() -> dict[str, Callable[..., Any]]:
    if len(_PYTHON) < len(_PLAIN):
        spaces: dict[int, dict[str, Any]] = {}
        copies = {}
        for name, fn in _PLAIN.items():
            space = spaces.setdefault(id(fn.__globals__), dict(fn.__globals__))
            copies[name] = FunctionType(fn.__code__, space, name, fn.__defaults__)
        for space in spaces.values():
            space.update({name: copies[name] for name in copies.keys() & space.keys()})
        _PYTHON.clear()
        _PYTHON.update(copies)
    return _PYTHON


def resolve(engine: str, work: int | None = None) -> str:
    """``"auto"`` -> ``"numba"`` when available (and ``work`` is not too small to import it
    for), else ``"python"``; checks the name."""
    if engine not in ENGINES:
        raise InvalidInput(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if engine == "auto":
        return "numba" if not _small(work) and _compiled() is not None else "python"
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
        kernels = _compiled()
        assert kernels is not None
        return kernels[name](*args)
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


# ------------------------------------------------------------ the search trees
# Shared by the planning kernels (:mod:`seqpack.core.policies`,
# :mod:`seqpack.core.stream_packer`). ``leaves`` is a power of two, node ``k``
# has children ``2k`` and ``2k+1``, leaf ``i`` is node ``leaves + i``, and every
# inner node holds the maximum of its children:
#
# - over rows by remaining capacity, the leftmost leaf holding at least ``n``
#   is the first row an item of length ``n`` fits in (first fit);
# - over remaining capacities ``r`` (leaf ``r`` holds ``r`` while some row has
#   exactly ``r`` cells left, else 0), the leftmost leaf holding at least ``n``
#   is the tightest row that fits (best fit) — O(log capacity) per item, as in
#   "Fewer Truncations Improve Language Modeling" (Ding et al., 2024).


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
