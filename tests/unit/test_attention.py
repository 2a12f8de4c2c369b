import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from exactpack import InvalidInput
from exactpack.nn import AttentionLayout, attention
from exactpack.verify.fixture import fixture_batch

from support.reference import Layout, per_example_attention, placed_from_records, spans_of
from support.strategies import packed_epochs

torch.set_num_threads(1)
BACKENDS = ("ranges", "dense")


def qkv(batch, heads=2, dim=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shape = (batch.shape[0], heads, batch.shape[1], dim)
    return [
        torch.randn(shape, generator=gen, dtype=torch.float64).requires_grad_(True)
        for _ in range(3)
    ]


def within(a, b):
    return bool(torch.all((a - b).abs() <= 1e-10 + 1e-9 * torch.maximum(a.abs(), b.abs())))


#: No window, windows shorter than, equal to and longer than the rows (capacity <= 7).
WINDOWS = st.one_of(st.none(), st.integers(1, 8))


def predicate_reference(q, k, v, batch, window=None):
    """Each example alone through a plain causal softmax (``tests/support/reference.py``), its cells
    taken from the occurrence records, not from the batch's segments or the predicate."""
    return per_example_attention(q, k, v, spans_of(batch.occurrences), 1 / math.sqrt(q.shape[-1]),
                                 window)  # fmt: skip


@given(packed_epochs(max_capacity=7, max_examples=5), st.integers(0, 2**16), WINDOWS)
def test_backends_match_the_predicate_and_each_other(case, seed, window):
    _, _, epoch = case
    batch = epoch.batches[0]
    q, k, v = qkv(batch, seed=seed)
    expected = predicate_reference(q, k, v, batch, window)
    weight = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed), dtype=q.dtype)
    want_grads = torch.autograd.grad((expected * weight).sum(), (q, k, v))
    results = {}
    for name in BACKENDS:
        out = attention(q, k, v, batch, backend=name, sliding_window=window)
        assert within(out, expected.detach()), name
        grads = torch.autograd.grad((out * weight).sum(), (q, k, v))
        assert all(within(g, w) for g, w in zip(grads, want_grads, strict=True)), name
        assert all(torch.isfinite(g).all() for g in grads), name
        results[name] = (out, grads)
    (out_r, g_r), (out_d, g_d) = results["ranges"], results["dense"]
    assert within(out_r, out_d)
    assert all(within(a, b) for a, b in zip(g_r, g_d, strict=True))


@given(packed_epochs(max_capacity=7, max_examples=5))
def test_padding_queries_are_exactly_zero_and_get_no_gradient(case):
    _, _, epoch = case
    for batch in epoch.batches:
        q, k, v = qkv(batch)
        pad = torch.as_tensor(~batch.input_valid)
        for name in BACKENDS:
            out = attention(q, k, v, batch, backend=name)
            assert torch.all(out.transpose(1, 2)[pad] == 0), name
            gq, gk, gv = torch.autograd.grad(out.sum(), (q, k, v))
            for g in (gq, gk, gv):  # padding is neither a query nor a key
                assert torch.all(g.transpose(1, 2)[pad] == 0), name


@given(packed_epochs(max_capacity=7, max_examples=5))
def test_no_gradient_crosses_a_segment(case):
    """d out[segment s] / d (q, k, v)[any other cell] is exactly zero."""
    _, _, epoch = case
    batch = epoch.batches[0]
    q, k, v = qkv(batch)
    layout = AttentionLayout.from_batch(batch)
    for name in BACKENDS:
        out = attention(q, k, v, layout, backend=name)
        for s, (row, a, b) in enumerate(spans_of(batch.occurrences)):
            own = torch.zeros(batch.shape, dtype=torch.bool)  # (R, T): the occurrence's cells
            own[row, a:b] = True
            objective = out.transpose(1, 2)[own].sum()
            for g in torch.autograd.grad(objective, (q, k, v), retain_graph=True):
                assert torch.all(g.transpose(1, 2)[~own] == 0), (name, int(s))


@given(packed_epochs(), WINDOWS)
def test_layout_views_are_the_predicate(case, window):
    """The torch layout's dense and key-range masks and cu_seqlens are the batch's views."""
    examples, _, epoch = case
    for batch in epoch.batches:
        layout = AttentionLayout.from_batch(batch)
        ref = Layout.build(placed_from_records(batch.occurrences, examples), *batch.shape)
        windowed = np.array(ref.dense(window), dtype=bool).reshape(batch.shape + batch.shape[1:])
        assert np.array_equal(batch.dense_mask(window), windowed)
        assert np.array_equal(layout.dense_mask(window).numpy(), windowed)
        assert np.array_equal(layout.range_mask(window).numpy(), windowed)  # empty on padding
        starts, ends = layout.key_bounds(window)
        ranges = batch.key_ranges(window)
        assert starts.tolist() == ranges.starts.tolist() and ends.tolist() == ranges.ends.tolist()
        dense = batch.dense_mask()
        cu = batch.cu_seqlens()
        assert layout.cu_seqlens.tolist() == cu.cu_seqlens.tolist()
        assert layout.valid_index.tolist() == cu.valid_index.tolist()
        assert layout.max_seqlen == cu.max_seqlen
        # Each cu_seqlens span of the valid cells is one segment's whole causal block.
        flat = dense.sum(-1).reshape(-1)[cu.valid_index]
        for a, b in zip(cu.cu_seqlens[:-1], cu.cu_seqlens[1:], strict=True):
            assert flat[a:b].tolist() == list(range(1, b - a + 1))


def test_fixture_b_first_query_sees_only_itself():
    batch = fixture_batch()
    q, k, v = qkv(batch, dim=4)
    for name in BACKENDS:
        out = attention(q, k, v, batch, backend=name)
        # One permitted key (column 3): its softmax weight is exactly 1.
        assert within(out[0, :, 3], v[0, :, 3].detach())
        assert not within(out[0, :, 4], v[0, :, 4].detach())


def test_unknown_backend_and_bad_shapes_are_clear_errors():
    batch = fixture_batch()
    q, k, v = qkv(batch)
    with pytest.raises(InvalidInput, match="unknown attention backend 'nope'; choose one of"):
        attention(q, k, v, batch, backend="nope")
    with pytest.raises(InvalidInput, match=r"expected \(rows, heads, capacity, head_dim\)"):
        attention(q[:, :, :4], k[:, :, :4], v[:, :, :4], batch)
    with pytest.raises(InvalidInput, match="must match q"):
        attention(q, k[:, :1], v, batch)
