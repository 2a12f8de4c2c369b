"""Scatter-gather of windows between flat arrays (what an output shard is built with), and
the one-pass range of an id array (what every read chunk is checked with).

``gather_into(src, src_starts, lens, out, out_starts)`` copies
``src[src_starts[i] : src_starts[i] + lens[i]]`` to
``out[out_starts[i] : out_starts[i] + lens[i]]`` for every ``i``, casting to
``out``'s dtype (int64 ids gathered into an int32 shard, say). The source
may be a memory map: only the windows asked for are touched. One numba
kernel where :mod:`seqpack.core.engine` has numba (releases the GIL), else
NumPy in bounded index chunks::

    src [5 6 7 8 9]   src_starts [3, 0]  lens [2, 1]  out_starts [1, 0]
    out [5 8 9]
"""

from __future__ import annotations

import numpy as np

from seqpack.core import engine
from seqpack.core.examples import concat_ranges

#: Elements copied per NumPy step without numba (bounds the int64 index arrays).
STEP = 1 << 22


@engine.kernel
def scatter_loop(src, src_starts, lens, out, out_starts):  # pragma: no cover - numba
    # unsigned indices: no negative-index wraparound, so LLVM vectorises the copy
    for i in range(lens.shape[0]):
        s = np.uint64(src_starts[i])
        d = np.uint64(out_starts[i])
        for j in range(np.uint64(lens[i])):
            out[d + j] = src[s + j]


def gather_into(
    src: np.ndarray,
    src_starts: np.ndarray,
    lens: np.ndarray,
    out: np.ndarray,
    out_starts: np.ndarray,
    use_numba: bool = True,
) -> None:
    """Copy every window (see the module docstring); bounds are the caller's contract."""
    src_starts = np.ascontiguousarray(src_starts, dtype=np.int64)
    lens = np.ascontiguousarray(lens, dtype=np.int64)
    out_starts = np.ascontiguousarray(out_starts, dtype=np.int64)
    kernel = engine.compiled("scatter_loop") if use_numba else None
    if kernel is not None:
        kernel(src, src_starts, lens, out, out_starts)
        return
    ends = np.cumsum(lens)
    cut = np.searchsorted(ends, np.arange(STEP, int(ends[-1]) if ends.size else 0, STEP))
    bounds = np.unique(np.concatenate([[0], cut, [lens.shape[0]]]))
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        part = lens[a:b]
        out[concat_ranges(out_starts[a:b], part)] = src[concat_ranges(src_starts[a:b], part)]


@engine.kernel
def range_loop(values, out):  # pragma: no cover - numba
    lo = values[0]
    hi = values[0]
    for i in range(values.shape[0]):  # branch-free, so LLVM vectorises it
        lo = min(lo, values[i])
        hi = max(hi, values[i])
    out[0] = lo
    out[1] = hi


def value_range(values: np.ndarray, use_numba: bool = True) -> tuple[int, int]:
    """``(min, max)`` of a non-empty integer array in one pass (two with NumPy only)."""
    kernel = engine.compiled("range_loop") if use_numba else None
    if kernel is None or values.dtype.kind not in "iu":
        return int(values.min()), int(values.max())
    out = np.zeros(2, dtype=np.int64 if values.dtype.kind == "i" else np.uint64)
    kernel(values, out)
    return int(out[0]), int(out[1])
