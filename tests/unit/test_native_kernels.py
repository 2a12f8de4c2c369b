"""The C kernels (``exactpack.core.native``): what ``"auto"`` picks, the 0.2 spellings, and
identical results to the Python kernels on random inputs for every kernel family (plan,
stream, gather, labels, range), in every dtype the callers pass."""

from __future__ import annotations

import os

import numpy as np
import pytest

from exactpack import InvalidInput, PackOptions, plan_rows
from exactpack.core import engine
from exactpack.core.compact import gather_into, span_labels, value_range
from exactpack.core.stream_packer import StreamPacker

FORCED_PYTHON = (os.environ.get("EXACTPACK_KERNELS")) == "python"
#: Skipped where the user turned the C kernels off, or (a user's machine without a compiler)
#: they are not built; under CI they must be there.
NATIVE = pytest.mark.skipif(
    FORCED_PYTHON or (not engine.native_available() and os.environ.get("CI") != "true"),
    reason="C kernels turned off or not built",
)
pytestmark = NATIVE
TOKEN_DTYPES = [np.int32, np.int64, np.uint16, np.uint32]


def test_auto_is_native_here():
    """The C kernels are built with exactpack (an editable install too), so "auto" is native."""
    assert engine.native_available()
    assert engine.resolve("auto") == "native"
    assert StreamPacker(8).kernels == "native"


def test_only_the_glossary_spellings_are_taken():
    """Nothing was released: "numba" is an unknown kernels name and engine= no keyword."""
    lengths = np.array([3, 2, 4])
    with pytest.raises(InvalidInput, match="unknown engine 'numba'"):
        engine.resolve("numba")
    with pytest.raises(InvalidInput, match="takes no option engine"):
        plan_rows(lengths, 6, "best-fit-decreasing", engine="python")
    with pytest.raises(TypeError, match="engine"):
        StreamPacker(8, engine="python")
    with pytest.raises(InvalidInput, match="takes no option engine"):
        PackOptions(max_length=8, policy="best-fit-decreasing", policy_options={"engine": "python"})


def test_streams_are_identical_on_random_inputs_and_resumes(rng):
    capacity = 50
    lengths = rng.integers(1, capacity + 1, size=4000)
    runs = {}
    for kernels in ("native", "python"):
        packer = StreamPacker(capacity, lookahead=37, max_open_rows=5, seed=3, kernels=kernels)
        parts = []
        for chunk in np.array_split(lengths, 7):
            parts.append(packer.push(chunk))
            packer = StreamPacker.from_state_dict(packer.state_dict(), kernels=kernels)
        parts.append(packer.finish())
        runs[kernels] = [np.concatenate(column) for column in zip(*parts, strict=True)]
    for a, b in zip(runs["native"], runs["python"], strict=True):
        assert np.array_equal(a, b)


def _segments(rng, size, n=200):
    lens = rng.integers(0, 30, size=n).astype(np.int64)
    starts = rng.integers(0, size - 30, size=n).astype(np.int64)
    out_starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    return starts, lens, out_starts


@pytest.mark.parametrize("src_dtype", [*TOKEN_DTYPES, np.int8, np.uint8, np.bool_, np.uint64])
@pytest.mark.parametrize("out_dtype", [np.int32, np.int64, np.uint16, np.bool_, None])
def test_the_gather_is_numpys_in_every_dtype(rng, src_dtype, out_dtype, tmp_path):
    """C copies (and casts, wrapping as NumPy does) exactly what the NumPy path does, also
    from a read-only memory map."""
    if src_dtype == np.bool_:
        src = rng.random(2000) < 0.5
    else:
        info = np.iinfo(src_dtype)
        src = rng.integers(info.min, info.max, size=2000, dtype=src_dtype, endpoint=True)
    path = tmp_path / "src.bin"
    src.tofile(path)
    mapped = np.memmap(path, dtype=src_dtype, mode="r")
    starts, lens, out_starts = _segments(rng, src.shape[0])
    dtype = src_dtype if out_dtype is None else out_dtype
    want = np.zeros(int(lens.sum()), dtype=dtype)
    gather_into(src, starts, lens, want, out_starts, native=False)
    for source in (src, mapped):
        got = np.zeros_like(want)
        gather_into(source, starts, lens, got, out_starts)
        assert np.array_equal(got, want)
    small = np.zeros_like(want)  # the kernel's Python source, on values both can hold
    src_small = (src % 100).astype(src_dtype)
    engine.call("python", "scatter_loop", src_small, starts, lens, small, out_starts, inputs=3)
    native = np.zeros_like(want)
    engine.call("native", "scatter_loop", src_small, starts, lens, native, out_starts)
    assert np.array_equal(small, native)


@pytest.mark.parametrize("dtype", TOKEN_DTYPES)
def test_labels_are_identical_in_every_token_dtype(rng, dtype):
    lens = rng.integers(1, 20, size=300).astype(np.int64)
    tokens = rng.integers(0, 30000, size=int((lens + 1).sum())).astype(dtype)
    mask = rng.random(int(lens.sum())) < 0.6
    native = span_labels(tokens, mask, lens)
    assert native.dtype == np.int32
    assert np.array_equal(native, span_labels(tokens, mask, lens, native=False))
    python = np.empty_like(native)
    engine.call("python", "labels_loop", tokens, mask, lens, python, inputs=3)
    assert np.array_equal(native, python)


@pytest.mark.parametrize(
    "dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]
)
def test_value_ranges_are_identical_in_every_dtype(rng, dtype):
    info = np.iinfo(dtype)
    for values in (
        rng.integers(info.min, info.max, size=1001, dtype=dtype, endpoint=True),
        np.array([info.max, info.min, 0], dtype=dtype),
        np.array([7], dtype=dtype),
    ):
        assert value_range(values) == value_range(values, native=False)
        assert value_range(values) == (int(values.min()), int(values.max()))
    strided = np.arange(20, dtype=dtype)[::3]  # not contiguous: NumPy's answer
    assert value_range(strided) == (0, 18)
    swapped = np.arange(5, dtype=np.dtype(dtype).newbyteorder())  # other byte order: NumPy's
    assert value_range(swapped) == (0, 4)
