"""Attention backends against a per-query softmax over the keys the reference permits.

For each query cell the reference (``tests/support/reference.py``: same occurrence,
key at or before the query, from the occurrence records alone) lists the
permitted keys; the output is the softmax-weighted mean of their values,
computed with ``math.fsum``; a query with no permitted key (padding) gets the
zero vector. Every CPU backend must match it in float64 within
``|a-b| <= 1e-10 + 1e-9*max(|a|,|b|)``, with finite gradients.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings

from exactpack.nn import AttentionLayout, attention

from support.reference import Layout, placed_from_records
from support.strategies import packed_epochs, scaled

torch.set_num_threads(1)
SCALE = 0.5


def reference_attention(q, k, v, layout: Layout) -> list:
    """Nested lists (R, H, T, D) of the permitted-key softmax mixture, zeros when none."""
    rows, heads, width, dim = q.shape
    q, k, v = q.tolist(), k.tolist(), v.tolist()
    out = []
    for r in range(rows):
        per_head = []
        for h in range(heads):
            cells = []
            for i in range(width):
                keys = [j for j in range(width) if layout.allowed(r, i, j)]
                if not keys:
                    cells.append([0.0] * dim)
                    continue
                qi = q[r][h][i]
                scores = [SCALE * math.fsum(a * b for a, b in zip(qi, k[r][h][j], strict=True))
                          for j in keys]  # fmt: skip
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = math.fsum(weights)
                mixture = [
                    math.fsum(w * v[r][h][j][d] for w, j in zip(weights, keys, strict=True))
                    for d in range(dim)
                ]
                cells.append([m / total for m in mixture])
            per_head.append(cells)
        out.append(per_head)
    return out


@settings(max_examples=scaled(40), deadline=None)
@given(packed_epochs(max_capacity=8, max_examples=6))
def test_cpu_backends_equal_the_per_query_reference(data):
    examples, _, epoch = data
    gen = torch.Generator().manual_seed(len(examples))
    for batch in epoch.batches:
        layout = Layout.build(placed_from_records(batch.occurrences, examples), *batch.shape)
        shape = (batch.shape[0], 2, batch.shape[1], 3)
        q, k, v = (torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(3))
        want = torch.tensor(reference_attention(q, k, v, layout), dtype=torch.float64)
        for backend in ("ranges", "dense", "varlen"):
            qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
            got = attention(qg, kg, vg, AttentionLayout.from_batch(batch), backend, scale=SCALE)
            close = (got - want).abs() <= 1e-10 + 1e-9 * torch.maximum(got.abs(), want.abs())
            assert bool(close.all()), backend
            grads = torch.autograd.grad(got.sum(), (qg, kg, vg))
            assert all(bool(torch.isfinite(g).all()) for g in grads), backend


@pytest.mark.parametrize("backend", ["ranges", "dense", "varlen"])
def test_a_key_outside_the_permission_never_moves_an_output(backend):
    """Changing the values of forbidden keys leaves every query's output as it was."""
    from exactpack.verify.fixture import fixture_batch, fixture_examples

    batch = fixture_batch()
    layout = Layout.build(placed_from_records(batch.occurrences, fixture_examples()), *batch.shape)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 6, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    base = attention(q, k, v, batch, backend, scale=SCALE)
    for r in range(2):
        for j in range(6):
            bumped = v.clone()
            bumped[r, :, j] += 100.0
            moved = (attention(q, k, bumped, batch, backend, scale=SCALE) - base).abs()
            for i in range(6):
                changed = bool((moved[r, :, i] > 0).any())
                assert changed == layout.allowed(r, i, j), (backend, r, i, j)
