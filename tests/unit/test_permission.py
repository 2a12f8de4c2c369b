import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from exactpack import InvalidInput
from exactpack.core.permission import (
    check_sliding_window,
    key_bounds,
    pairwise,
    permitted,
    tiled_edges,
)
from exactpack.verify.fixture import fixture_batch

from support.reference import Layout, placed_from_records
from support.strategies import packed_epochs

#: No window, windows shorter than, equal to and longer than the rows (capacity <= 12).
WINDOWS = st.one_of(st.none(), st.integers(1, 14))


def reference_matrix(batch, examples, window=None):
    """The permission written in ``tests/support/reference.py`` from the occurrence records and the
    examples alone (plain Python, no exactpack predicate): same occurrence, key at or before
    the query, fewer than ``window`` cells back."""
    layout = Layout.build(placed_from_records(batch.occurrences, examples), *batch.shape)
    return np.array(layout.dense(window), dtype=bool).reshape(batch.shape + batch.shape[1:])


def predicate_matrix(batch, window=None):
    """``batch.allowed_key`` asked about every (row, query, key): a view under test too."""
    rows, width = batch.shape
    out = np.zeros((rows, width, width), dtype=bool)
    for r, q, k in itertools.product(range(rows), range(width), range(width)):
        out[r, q, k] = batch.allowed_key(r, q, k, window)
    return out


def occurrence_matrix(batch, window=None):
    """The rule written from the occurrences' columns alone (not from the cell arrays)."""
    rows, width = batch.shape
    out = np.zeros((rows, width, width), dtype=bool)
    occ = batch.occurrences
    for row, a, b in zip(occ.row, occ.col_start, occ.col_end, strict=True):
        for q, k in itertools.product(range(a, b), repeat=2):
            out[row, q, k] = 0 <= q - k < (window or width + 1)
    return out


def test_fixture_permission_excludes_a_from_b():
    b = fixture_batch()
    assert b.allowed_key(0, 3, 3)
    assert not any(b.allowed_key(0, 3, k) for k in (0, 1, 2, 4, 5))
    assert [k for k in range(6) if b.allowed_key(0, 4, k)] == [3, 4]
    # Storage order alone would admit A: column 2 precedes column 3 but is excluded.
    assert not b.allowed_key(0, 4, 2)
    # Padding shares segment -1 and position 0 but is never a query or key.
    assert not b.allowed_key(1, 4, 5) and not b.allowed_key(1, 5, 5)


@pytest.mark.parametrize("coords", [(2, 0, 0), (0, 6, 0), (0, 0, 6), (-1, 0, 0)])
def test_coordinates_outside_the_batch_are_an_error(coords):
    with pytest.raises(InvalidInput, match="outside this batch of shape"):
        fixture_batch().allowed_key(*coords)


def test_fixture_tiled_traversal_equals_query_order():
    b = fixture_batch()
    query = b.edges()
    tiled = tiled_edges(b, 2)
    assert not np.array_equal(query, tiled)  # a genuinely different order
    assert sorted(map(tuple, tiled)) == sorted(map(tuple, query))
    assert query.shape[0] == 3 * 4 // 2 + 2 * 3 // 2 + 4 * 5 // 2


def test_fixture_cu_seqlens():
    cu = fixture_batch().cu_seqlens()
    assert cu.cu_seqlens.tolist() == [0, 3, 5, 9] and cu.cu_seqlens.dtype == np.int32
    assert cu.max_seqlen == 4
    assert cu.valid_index.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert cu.segment_rows.tolist() == [0, 0, 1]


def test_fixture_window_drops_the_oldest_keys():
    b = fixture_batch()
    assert [k for k in range(6) if b.allowed_key(0, 2, k, sliding_window=2)] == [1, 2]
    assert [k for k in range(6) if b.allowed_key(1, 3, k, sliding_window=3)] == [1, 2, 3]
    assert b.key_ranges(sliding_window=2).get(0, 2) == (1, 3)
    assert b.key_ranges(sliding_window=2).get(0, 4) == (3, 5)  # B is shorter than the window
    assert b.dense_mask(sliding_window=1).sum() == int(b.input_valid.sum())  # each query: itself
    assert np.array_equal(b.dense_mask(sliding_window=6), b.dense_mask())


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "4"])
def test_a_window_is_a_positive_int_or_none(bad):
    assert check_sliding_window(None) is None and check_sliding_window(np.int64(3)) == 3
    with pytest.raises(InvalidInput, match="positive number of positions"):
        fixture_batch().dense_mask(sliding_window=bad)


@given(packed_epochs(), WINDOWS)
def test_predicate_is_the_same_on_numpy_and_torch(data, window):
    examples, _, epoch = data
    for b in epoch.batches:
        arrays = (b.input_valid, b.segments, b.positions.astype(np.int64))
        want = pairwise(*arrays, window)
        assert np.array_equal(want, reference_matrix(b, examples, window))
        assert np.array_equal(want, occurrence_matrix(b, window))
        got = pairwise(*(torch.as_tensor(a) for a in arrays), window)
        assert got.dtype == torch.bool and np.array_equal(got.numpy(), want)
        cols = np.tile(np.arange(b.shape[1]), (b.shape[0], 1))
        starts, ends = key_bounds(b.input_valid, arrays[2], cols, window)
        t_starts, t_ends = key_bounds(
            torch.as_tensor(b.input_valid),
            torch.as_tensor(arrays[2]),
            torch.as_tensor(cols),
            window,
        )
        assert t_starts.tolist() == starts.tolist() and t_ends.tolist() == ends.tolist()
        # Scalars (what a FlexAttention mask_mod indexes out) give the same answers.
        valid, seg, pos = (torch.as_tensor(a) for a in arrays)
        for r, q, k in itertools.product(range(b.shape[0]), range(b.shape[1]), range(b.shape[1])):
            one = permitted(
                valid[r, q], valid[r, k], seg[r, q], seg[r, k], pos[r, q], pos[r, k], window
            )
            assert bool(one) == want[r, q, k]


@given(packed_epochs(), WINDOWS)
def test_every_view_agrees_with_the_predicate(data, window):
    examples, _, epoch = data
    for b in epoch.batches:
        rows, width = b.shape
        truth = reference_matrix(b, examples, window)
        assert np.array_equal(predicate_matrix(b, window), truth)
        assert np.array_equal(b.dense_mask(window), truth)
        # Edge inventory and tiled traversal.
        e = b.edges(window)
        assert np.array_equal(e, np.argwhere(truth))
        for w in (1, 2, 3):
            t = tiled_edges(b, w, window)
            assert np.array_equal(t[np.lexsort(t.T[::-1])], e)
        pad = ~b.input_valid
        assert not pad[e[:, 0], e[:, 1]].any() and not pad[e[:, 0], e[:, 2]].any()
        # Key ranges: [start, end) is exactly the permitted key set of each query.
        kr = b.key_ranges(window)
        for r, q in itertools.product(range(rows), range(width)):
            keys = np.flatnonzero(truth[r, q])
            got = kr.get(r, q)
            if keys.size == 0:
                assert got is None
            else:
                assert got == (keys[0], keys[-1] + 1) and keys.size == got[1] - got[0]
        assert kr.row_lengths.tolist() == b.input_valid.sum(axis=1).tolist()
        # cu_seqlens: gathered valid tokens split into segments == permitted blocks.
        cu = b.cu_seqlens()
        flat = np.arange(rows * width)[cu.valid_index]
        assert not pad.reshape(-1)[flat].any()
        for s in range(cu.cu_seqlens.shape[0] - 1):
            cells = flat[cu.cu_seqlens[s] : cu.cu_seqlens[s + 1]]
            r, cols = cells // width, cells % width
            assert (r == r[0]).all() and r[0] == cu.segment_rows[s]
            block = truth[r[0]][np.ix_(cols, cols)]
            band = np.tril(np.ones_like(block))  # the full causal block, less the window's cut
            if window is not None:
                band &= ~np.tril(np.ones_like(block), -window)
            assert np.array_equal(block, band)
            assert not truth[r[0]][np.ix_(cols, np.setdiff1d(np.arange(width), cols))].any()
        assert cu.max_seqlen == (np.diff(cu.cu_seqlens).max() if cu.cu_seqlens.size > 1 else 0)
        # position_ids: local position of every valid cell, 0 on padding; a query's
        # permitted keys are exactly the same-segment cells with position_ids in
        # (own - window, own].
        pid = b.position_ids()
        assert (pid[pad] == 0).all()
        for r, q in zip(*np.nonzero(b.input_valid), strict=True):
            keys = np.flatnonzero(truth[r, q])
            first = 0 if window is None else max(0, pid[r, q] - window + 1)
            assert pid[r, keys].tolist() == list(range(first, pid[r, q] + 1))
