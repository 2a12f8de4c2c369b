"""Variable-length backends (varlen, flex, flash, auto) against each example run alone.

The reference is ``tests/support/reference.py``'s per-example plain softmax over the cells the
occurrence records name (no exactpack backend, mask or predicate).
"""

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exactpack import Binding, NotAvailable, PackConfig, SequenceExample, pack_examples
from exactpack.nn import BACKENDS, AttentionLayout, attention
from exactpack.nn.auto import choose_backend
from exactpack.nn.flash import check_flash, flash_varlen, varlen_reference
from exactpack.nn.flex import flex_block_mask
from exactpack.nn.varlen import (
    BUCKETING,
    CALL_COST,
    TOKEN_COST,
    group_segments,
    varlen_attention,
    varlen_plan,
)
from exactpack.verify.decoder import TinyDecoder
from exactpack.verify.fixture import fixture_batch
from exactpack.verify.layouts import three_way

from support.mask_helpers import block_mask_cells
from support.reference import Layout, per_example_attention, placed_from_records, spans_of
from support.strategies import example_lists, packed_epochs

torch.set_num_threads(1)


def qkv(layout, heads=2, dim=4, seed=0, dtype=torch.float64, grad=True):
    gen = torch.Generator().manual_seed(seed)
    shape = (layout.shape[0], heads, layout.shape[1], dim)
    return [torch.randn(shape, generator=gen, dtype=dtype).requires_grad_(grad) for _ in range(3)]


def within(a, b, atol=1e-10, rtol=1e-9):
    """``|a-b| <= atol + rtol*max(|a|,|b|)`` everywhere (float64 defaults)."""
    return bool(torch.all((a - b).abs() <= atol + rtol * torch.maximum(a.abs(), b.abs())))


def within32(a, b):
    return within(a.double(), b.double(), atol=1e-5, rtol=1e-4)


#: No window, windows shorter than, equal to and longer than the rows (capacity <= 12).
WINDOWS = st.one_of(st.none(), st.integers(1, 14))


def reference(batch, scale=0.5):
    """``fn(q, k, v, layout, window)``: the batch's examples, each alone (plain softmax)."""
    spans = spans_of(batch.occurrences)
    return lambda q, k, v, layout, window=None: per_example_attention(q, k, v, spans, scale, window)


def reference_mask(batch, examples, window=None):
    """The permission from ``tests/support/reference.py`` (occurrence records, plain Python)."""
    ref = Layout.build(placed_from_records(batch.occurrences, examples), *batch.shape)
    return np.array(ref.dense(window), dtype=bool).reshape(batch.shape + batch.shape[1:])


#: Every backend that trains on CPU, as ``fn(q, k, v, layout, window)``.
CPU_RUNS = {
    **{
        f"varlen-{b}": (
            lambda q, k, v, layout, w=None, b=b: varlen_attention(q, k, v, layout, 0.5, b, w)
        )
        for b in BUCKETING
    },
    "varlen": lambda q, k, v, layout, w=None: attention(q, k, v, layout, "varlen", 0.5, w),
    "auto": lambda q, k, v, layout, w=None: attention(q, k, v, layout, "auto", 0.5, w),
    "ranges": lambda q, k, v, layout, w=None: attention(q, k, v, layout, "ranges", 0.5, w),
}


def outputs_and_grads(fn, layout, q, k, v, weight, window=None):
    out = fn(q, k, v, layout, window)
    return out, torch.autograd.grad((out * weight).sum(), (q, k, v))


def test_backends_are_registered_on_import():
    assert {"ranges", "dense", "varlen", "flex", "flash", "auto"} <= set(BACKENDS)


@given(packed_epochs(), st.integers(0, 2**16), WINDOWS)
def test_varlen_and_ranges_match_the_per_example_reference_and_gradients(case, seed, window):
    _, _, epoch = case
    for batch in epoch.batches:
        layout = AttentionLayout.from_batch(batch)
        q, k, v = qkv(layout, seed=seed)
        weight = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1)).double()
        want_out, want_grads = outputs_and_grads(reference(batch), layout, q, k, v, weight, window)
        for name, fn in CPU_RUNS.items():
            out, grads = outputs_and_grads(fn, layout, q, k, v, weight, window)
            assert within(out, want_out), name
            assert all(within(g, w) for g, w in zip(grads, want_grads, strict=True)), name
            assert all(torch.isfinite(g).all() for g in grads), name
            padding = ~layout.valid[:, None, :, None].expand_as(out)
            assert torch.count_nonzero(out[padding]) == 0, name


@given(packed_epochs(), st.integers(0, 2**16), st.data(), WINDOWS)
def test_no_backend_creates_a_cross_segment_edge(case, seed, data, window):
    """d(segment s's outputs) / d(anything outside s) is exactly zero, for q, k and v."""
    _, _, epoch = case
    batch = epoch.batches[0]
    layout = AttentionLayout.from_batch(batch)
    segment = data.draw(st.sampled_from(np.unique(batch.segments[batch.input_valid]).tolist()))
    inside = torch.as_tensor(batch.segments == segment)[:, None, :, None]  # (R, 1, T, 1)
    q, k, v = qkv(layout, seed=seed)
    for name, fn in CPU_RUNS.items():
        out = fn(q, k, v, layout, window)
        grads = torch.autograd.grad((out * inside).sum(), (q, k, v))
        for g in grads:
            assert torch.count_nonzero(g * ~inside) == 0, name
        # The segment does depend on its own keys: the probe is not vacuous.
        assert torch.count_nonzero(grads[2] * inside) > 0, name


def plan_edges(plan, cells):
    """Bool (R*T, R*T): the key cells each valid cell's output slot attends in the plan.

    A query cell reads slot ``scatter - 1``; that slot, ``i`` slots into its
    ``L``-slot block, attends (causally) the block's slots ``0..i``, each the
    cell ``gather`` names.
    """
    gather, scatter = plan.q_index.numpy(), plan.scatter.numpy()
    assert np.array_equal(gather, plan.k_index.numpy())  # a flat segment is its own path
    block_start = np.zeros(gather.shape[0], dtype=np.int64)
    offset = 0
    for n, size, _ in plan.groups:
        block_start[offset : offset + n * size] = offset + np.arange(n * size) // size * size
        offset += n * size
    edges = np.zeros((cells, cells), dtype=bool)
    for cell in np.flatnonzero(scatter):
        slot = scatter[cell] - 1
        edges[cell, gather[block_start[slot] : slot + 1]] = True
    return edges


@settings(max_examples=60)
@given(packed_epochs(), st.sampled_from(BUCKETING))
def test_varlen_plan_edges_are_the_dense_predicate(case, bucketing):
    _, _, epoch = case
    for batch in epoch.batches:
        plan = varlen_plan(AttentionLayout.from_batch(batch), bucketing)
        assert plan.padded_slots == sum(n * size for n, size, _ in plan.groups)
        rows, width = batch.shape
        edges = plan_edges(plan, rows * width).reshape(rows, width, rows, width)
        r = np.arange(rows)
        within_rows = edges[r, :, r, :]  # (R, T, T)
        assert edges.sum() == within_rows.sum()  # no edge leaves its row
        assert np.array_equal(within_rows, batch.dense_mask())


lengths_lists = st.lists(st.integers(1, 64), min_size=0, max_size=12)


def modelled_cost(lengths, groups):
    return sum(
        CALL_COST + g.size * lengths[g].max() * (lengths[g].max() + TOKEN_COST) for g in groups
    )


@given(lengths_lists, st.sampled_from(BUCKETING))
def test_grouping_places_every_segment_once(lengths, bucketing):
    lengths = np.array(lengths, dtype=np.int64)
    groups = group_segments(lengths, bucketing)
    members = np.concatenate(groups) if groups else np.zeros(0, np.int64)
    assert sorted(members.tolist()) == list(range(lengths.size))
    if bucketing == "exact":
        assert all(np.unique(lengths[g]).size == 1 for g in groups)
        assert len(groups) == np.unique(lengths).size
    if bucketing == "segment":
        assert all(g.size == 1 for g in groups)


@settings(max_examples=60)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=7))
def test_bucket_grouping_is_the_cheapest_longest_first_split(lengths):
    """Brute force over every split of the sorted distinct lengths into contiguous groups."""
    lengths = np.array(lengths, dtype=np.int64)
    distinct = np.unique(lengths)[::-1]
    best = None
    for cuts in itertools.product([False, True], repeat=distinct.size - 1):
        groups, current = [], [distinct[0]]
        for value, cut in zip(distinct[1:], cuts, strict=True):
            if cut:
                groups.append(current)
                current = []
            current.append(value)
        groups.append(current)
        index = [np.flatnonzero(np.isin(lengths, g)) for g in groups]
        cost = modelled_cost(lengths, index)
        best = cost if best is None else min(best, cost)
    chosen = group_segments(lengths, "bucket")
    assert modelled_cost(lengths, chosen) == best  # integer costs: exact
    assert len(chosen) <= np.unique(lengths).size


def test_fixture_plan_groups_and_scatter():
    layout = AttentionLayout.from_batch(fixture_batch())
    plan = varlen_plan(layout, "exact")
    assert varlen_plan(layout, "exact") is plan  # built once per layout, reused by every layer
    lengths = sorted(layout.lengths.tolist(), reverse=True)
    assert plan.groups == tuple((1, n, n) for n in lengths)
    valid = layout.valid.reshape(-1)
    assert torch.all((plan.scatter == 0) == ~valid)
    # Every padded slot reads a cell of its own segment.
    seg = layout.segments.reshape(-1)[plan.q_index]
    offset = 0
    for n, size, _ in plan.groups:
        block = seg[offset : offset + n * size].view(n, size)
        assert torch.all(block == block[:, :1])
        offset += n * size


def test_decoder_runs_on_varlen_like_on_ranges():
    batch = fixture_batch()
    logits, grads = {}, {}
    for name in ("ranges", "varlen", "auto"):
        model = TinyDecoder(profile="large", seed=7, attention=name)
        model.loss_packed(batch).mean.backward()
        logits[name] = model.forward_packed(batch).detach()
        grads[name] = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    for name in ("varlen", "auto"):
        assert within(logits[name], logits["ranges"]), name
        assert within(grads[name], grads["ranges"]), name


@settings(max_examples=40)
@given(example_lists(), st.sampled_from(["varlen", "auto"]))
def test_decoder_on_varlen_packed_equals_separate(case, backend):
    """The decoder's verifier: separate = padded = packed logits, loss and gradients."""
    examples, capacity = case
    model = TinyDecoder(profile="large", seed=3, attention=backend)
    report = three_way(model, examples, capacity)
    assert report["passed"], report["max_abs_diff"]
    assert report["comparisons"]["gradients"] > 0


@settings(max_examples=40)
@given(packed_epochs(), st.integers(0, 2**16), WINDOWS)
def test_flex_float64_forward_matches_the_per_example_reference(case, seed, window):
    """float64 takes FlexAttention's unfused path on the same BlockMask."""
    _, _, epoch = case
    for batch in epoch.batches:
        layout = AttentionLayout.from_batch(batch)
        q, k, v = qkv(layout, seed=seed, grad=False)
        out = attention(q, k, v, layout, "flex", sliding_window=window)
        want = reference(batch, 1 / 2.0)(q, k, v, layout, window)  # default scale: 1/sqrt(4)
        assert within(out, want)
        assert torch.isfinite(out).all()
        assert torch.count_nonzero(out * ~layout.valid[:, None, :, None]) == 0


def long_rows_batch():
    """Four rows of 260 cells, segments crossing FlexAttention's 128-cell tiles."""
    binding = Binding(266, "test-tokenizer", "sha256:test")
    gen = np.random.default_rng(3)
    lengths = [100, 60, 90, 5, 200, 40, 30, 150, 1, 120]
    examples = [
        SequenceExample.from_document(
            gen.integers(0, 266, n + 1).tolist(),
            source_id=f"d{i}",
            partition="train",
            binding=binding,
        )
        for i, n in enumerate(lengths)
    ]
    return pack_examples("train", examples, binding, PackConfig(260, 4)).batches[0]


@settings(max_examples=60)
@given(packed_epochs(), WINDOWS)
def test_flex_block_mask_is_the_dense_predicate(case, window):
    """The BlockMask, materialised (tiles and mask_mod), equals the reference permission."""
    examples, _, epoch = case
    for batch in epoch.batches:
        cells = block_mask_cells(flex_block_mask(AttentionLayout.from_batch(batch), window))
        assert cells.shape[1] == 1
        assert np.array_equal(cells[:, 0].numpy(), reference_mask(batch, examples, window))


@pytest.mark.parametrize("window", [None, 1, 37, 128, 129])
def test_flex_block_mask_over_many_tiles_is_the_dense_predicate(window):
    """Windows shorter than, equal to and longer than a 128-cell tile."""
    batch = long_rows_batch()
    cells = block_mask_cells(flex_block_mask(AttentionLayout.from_batch(batch), window))
    assert np.array_equal(cells[:, 0].numpy(), batch.dense_mask(window))


def test_flex_cpu_backward_is_refused_and_compiled_forward_still_matches():
    layout = AttentionLayout.from_batch(long_rows_batch())
    q, k, v = qkv(layout, heads=2, dim=16, seed=5, dtype=torch.float32)
    # Refused before any kernel runs: a failed compiled call would leave the
    # compiled wrapper on the unfused path for the rest of the process.
    with pytest.raises(NotAvailable, match=r"no backward on CPU.*varlen"):
        attention(q, k, v, layout, "flex")
    with torch.no_grad():
        out = attention(q, k, v, layout, "flex")  # float32: the compiled kernel
        want = reference(long_rows_batch(), 0.25)(q.double(), k.double(), v.double(), layout)
    assert out.dtype == torch.float32
    assert within32(out, want)
    assert torch.count_nonzero(out * ~layout.valid[:, None, :, None]) == 0


def test_flex_backward_refused_even_in_float64():
    layout = AttentionLayout.from_batch(fixture_batch())
    q, k, v = qkv(layout)
    with pytest.raises(NotAvailable, match="varlen"):
        attention(q, k, v, layout, "flex")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_flash_is_not_available_without_cuda():
    layout = AttentionLayout.from_batch(fixture_batch())
    q, k, v = qkv(layout, dtype=torch.float32)
    with pytest.raises(NotAvailable, match=r"CUDA.*varlen"):
        attention(q, k, v, layout, "flash")
    with pytest.raises(NotAvailable, match="CUDA"):
        check_flash(q.to(torch.bfloat16))
    with pytest.raises(NotAvailable, match="CUDA device"):
        flash_varlen("cuda")


def test_one_flash_lookup_for_flat_and_tree_rows(monkeypatch):
    """CPU: the plain-torch reference. CUDA without flash-attn: torch's varlen_attn, which
    runs each sequence on itself causally and refuses the tree path's gathered keys."""
    import importlib.util

    assert flash_varlen("cpu") is varlen_reference
    find = importlib.util.find_spec
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "flash_attn" else find(n, *a)
    )
    flash_varlen.cache_clear()
    try:
        kernel = flash_varlen("cuda")
    finally:
        flash_varlen.cache_clear()
    q, cu = torch.zeros(2, 1, 8), torch.tensor([0, 2])
    with pytest.raises(NotAvailable, match="flash-attn"):
        kernel(q, q, q, cu, cu.clone(), 2, 2, causal=True)


#: bfloat16 keeps 8 significant bits: each of q, k, v and the output is rounded once
#: (relative error <= 2**-9 each) and the kernel accumulates in float32, so the output of a
#: convex combination of values with |v| <= max|v| is within a few 2**-8 * max|v|.
BF16_STEP = 2.0**-8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flash attention needs CUDA")
@settings(max_examples=30, deadline=None)
@given(packed_epochs(max_capacity=24, max_examples=8))
def test_flash_matches_the_per_example_reference_forward_and_backward_on_cuda(data):
    _, _, epoch = data
    for batch in epoch.batches:
        layout = AttentionLayout.from_batch(batch, "cuda")
        q, k, v = qkv(layout, heads=2, dim=16, grad=False)
        alone = reference(batch, 0.25)
        want = alone(q, k, v, layout)
        weight = torch.randn(want.shape, generator=torch.Generator().manual_seed(1))
        want_grads = torch.autograd.grad(
            (alone(*(x.requires_grad_() for x in (q, k, v)), layout) * weight).sum(), (q, k, v)
        )
        qc, kc, vc = (x.detach().to("cuda", torch.bfloat16).requires_grad_() for x in (q, k, v))
        out = attention(qc, kc, vc, layout, "flash", scale=0.25)
        bound = 4 * BF16_STEP * float(v.abs().max())
        assert out.dtype == torch.bfloat16
        assert bool(((out.double().cpu() - want).abs() <= bound).all())
        valid = layout.valid.cpu()[:, None, :, None]
        assert torch.count_nonzero(out.cpu() * ~valid) == 0  # padding queries: zero mixture
        got = torch.autograd.grad((out * weight.to("cuda", torch.bfloat16)).sum(), (qc, kc, vc))
        for g, w in zip(got, want_grads, strict=True):
            scale = float(w.abs().max()) + 1.0
            assert bool(((g.double().cpu() - w).abs() <= 8 * BF16_STEP * scale).all())


def test_auto_picks_varlen_on_cpu():
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        assert choose_backend(torch.zeros(1, 1, 1, 8, dtype=dtype)) == "varlen"
