import itertools

import numpy as np
import pytest
from hypothesis import given

from seqpack import InvalidInput
from seqpack.core.fixture import fixture_batch
from seqpack.core.permission import tiled_edges

from strategies import packed_epochs


def predicate_matrix(batch):
    rows, width = batch.shape
    out = np.zeros((rows, width, width), dtype=bool)
    for r, q, k in itertools.product(range(rows), range(width), range(width)):
        out[r, q, k] = batch.allowed_key(r, q, k)
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


@given(packed_epochs())
def test_every_view_agrees_with_the_predicate(data):
    _, _, epoch = data
    for b in epoch.batches:
        rows, width = b.shape
        truth = predicate_matrix(b)
        assert np.array_equal(b.dense_mask(), truth)
        # Edge inventory and tiled traversal.
        e = b.edges()
        assert np.array_equal(e, np.argwhere(truth))
        for w in (1, 2, 3):
            t = tiled_edges(b, w)
            assert np.array_equal(t[np.lexsort(t.T[::-1])], e)
        pad = ~b.input_valid
        assert not pad[e[:, 0], e[:, 1]].any() and not pad[e[:, 0], e[:, 2]].any()
        # Key ranges: [start, end) is exactly the permitted key set of each query.
        kr = b.key_ranges()
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
            assert np.array_equal(block, np.tril(np.ones_like(block)))  # full causal block
            assert not truth[r[0]][np.ix_(cols, np.setdiff1d(np.arange(width), cols))].any()
        assert cu.max_seqlen == (np.diff(cu.cu_seqlens).max() if cu.cu_seqlens.size > 1 else 0)
        # position_ids: local position of every valid cell, 0 on padding; a query's
        # permitted keys are exactly the same-segment cells with position_ids <= its own.
        pid = b.position_ids()
        assert (pid[pad] == 0).all()
        for r, q in zip(*np.nonzero(b.input_valid), strict=True):
            keys = np.flatnonzero(truth[r, q])
            assert pid[r, q] == keys.size - 1 and pid[r, keys].tolist() == list(range(keys.size))
