"""Token-weighted loss against a per-example reference with an explicit step-wide denominator.

The model is a bigram table ``W`` (``logits(cell) = W[input token]``), so each
example's loss and gradient can be written out by hand, one target at a
time, from the example's own tokens and loss flags — no packed batch, no
exactpack loss function. For an optimizer step that covers examples ``E``::

    N = Σ_{e∈E} (supervised targets of e)                  counted from the source records
    L = (1/N) Σ_{e∈E} Σ_t [logsumexp(W[x_t]) - W[x_t, y_t]]
    ∂L/∂W[x] = (1/N) Σ_{targets with input x} (softmax(W[x]) - onehot(y))

Packed training must reproduce ``L`` and ``∂L/∂W`` whatever the split into
micro-batches and ranks: each micro-batch back-propagates ``S * c / N``
(``c = R`` under DDP's gradient mean, ``1`` under a sum) and the ranks'
gradients are reduced. Float64 throughout: agreement is the suite's
``|a-b| <= 1e-10 + 1e-9 * max(|a|, |b|)`` (the library sums in a different
order than ``math.fsum``; a few hundred float64 terms differ by ~1e-15).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exactpack import EmptyObjective, InvalidInput, PackConfig, Split, pack_examples
from exactpack.core import loss as core_loss
from exactpack.pipeline.local import pack_path
from exactpack.training.distributed import RowSampler
from exactpack.training.global_loss import labels_nll_sum, loss_factor, micro_batch_loss, normalize
from exactpack.training.packed_data import PackedBatches, PackedCollator

from support.packed_helpers import random_records, write_jsonl
from support.reference import close, log_softmax_nll, softmax
from support.strategies import BINDING, example_lists, scaled

VOCAB = 40


def reference_step(examples, weights):
    """``(L, N, dL/dW)`` of one step over ``examples`` (window, flags) in plain Python."""
    n = sum(sum(flags) for _, flags in examples)
    terms, grad = [], [[0.0] * len(weights[0]) for _ in weights]
    for window, flags in examples:
        for t, supervised in enumerate(flags):
            if not supervised:
                continue
            x, y = window[t], window[t + 1]
            terms.append(log_softmax_nll(weights[x], y))
            for v, p in enumerate(softmax(weights[x])):
                grad[x][v] += (p - (v == y)) / n
    return (math.fsum(terms) / n if n else None), n, grad


def assert_grad(got: torch.Tensor, want: list[list[float]]) -> None:
    for x, row in enumerate(want):
        for v, w in enumerate(row):
            assert close(float(got[x, v]), w), (x, v, float(got[x, v]), w)


def record_examples(records):
    """(window, flags) per record: the whole document, flags from its labels."""
    out = []
    for rec in records:
        ids = rec["input_ids"]
        labels = rec.get("labels")
        flags = [True] * (len(ids) - 1) if labels is None else [lab != -100 for lab in labels[1:]]
        out.append((ids, flags))
    return out


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """Random documents (a third with a prompt prefix), packed into a directory."""
    rng = np.random.default_rng(20240617)
    records = random_records(rng, 40, VOCAB, 12)
    path = tmp_path_factory.mktemp("loss")
    data = write_jsonl(path / "d.jsonl", records)
    pack_path(data, path / "out", max_length=16, vocab_size=VOCAB, max_rows_per_batch=64)
    return records, PackedBatches(path / "out")


@pytest.mark.parametrize(
    ("world", "micro", "per_micro", "reduction"),
    [(1, 1, 3, "mean"), (1, 3, 2, "mean"), (3, 2, 1, "mean"), (2, 2, 2, "sum")],
)
def test_micro_batches_and_ranks_reproduce_the_per_example_step_loss(
    packed, seed, world, micro, per_micro, reduction
):
    records, ds = packed
    examples = record_examples(records)
    torch.manual_seed(seed)
    weights = torch.randn(VOCAB, VOCAB, dtype=torch.float64)
    collate = PackedCollator()
    samplers = [
        RowSampler(
            ds.row_stats(), rows_per_micro_batch=per_micro, micro_batches=micro,
            world_size=world, rank=r, seed=seed,
        )
        for r in range(world)
    ]  # fmt: skip
    slots = [list(s) for s in samplers]
    assert len({len(s) for s in slots}) == 1  # every rank runs the same number of calls
    steps = samplers[0].schedule.steps
    assert steps >= 2
    for step in range(steps):
        rank_grads, logged, ordinals = [], 0.0, []
        for rank in range(world):
            w = weights.clone().requires_grad_(True)
            for slot in (s for s in slots[rank] if s.step == step):
                item = ds[slot]
                ordinals.extend(item.batch.occurrences.ordinal.tolist())
                features = collate(item)
                logits = w[features["input_ids"]]  # (R, T, V)
                loss = micro_batch_loss(
                    logits, features, world_size=world, grad_reduction=reduction
                )
                loss.backward()
                logged += float(loss.detach())
            rank_grads.append(w.grad)
        want_loss, want_n, want_grad = reference_step(
            [examples[o] for o in sorted(ordinals)], weights.tolist()
        )
        assert slot.step_eligible == want_n
        if reduction == "mean":
            got = sum(rank_grads) / world  # DistributedDataParallel averages gradients
            assert close(logged / world, want_loss)  # the logging rule of training/global_loss.py
        else:
            got = sum(rank_grads)
            assert close(logged, want_loss)
        assert_grad(got, want_grad)


def test_excluded_cells_never_reach_the_loss_even_as_nan(packed):
    records, ds = packed
    examples = record_examples(records)
    weights = torch.randn(
        VOCAB, VOCAB, dtype=torch.float64, generator=torch.Generator().manual_seed(5)
    )
    batch = ds[0]
    features = PackedCollator()(batch)
    w = weights.clone().requires_grad_(True)
    logits = w[features["input_ids"]]
    excluded = (features["shift_labels"] == -100)[..., None]
    poisoned = torch.where(excluded, torch.full_like(logits, float("nan")), logits)
    loss = micro_batch_loss(poisoned, features)
    loss.backward()
    want_loss, want_n, want_grad = reference_step(
        [examples[o] for o in sorted(batch.occurrences.ordinal.tolist())], weights.tolist()
    )
    assert features["num_items_in_batch"] == want_n
    assert close(float(loss.detach()), want_loss)
    assert_grad(w.grad, want_grad)


@settings(max_examples=scaled(60))
@given(example_lists(max_capacity=8, max_examples=10), st.integers(1, 3), st.integers(0, 2**31))
def test_core_loss_of_batches_and_their_global_division(case, rows, seed_):
    """NumPy logits: every call's raw sum, added and divided once by the epoch's N."""
    examples, capacity = case
    rng = np.random.default_rng(seed_)
    table = rng.normal(size=(BINDING.vocab_size, BINDING.vocab_size))
    epoch = pack_examples(Split.TRAIN, examples, BINDING, PackConfig(capacity, rows))
    windows = [([int(t) for t in ex.window], [bool(f) for f in ex.loss_mask]) for ex in examples]
    want_loss, want_n, _ = reference_step_numpy(windows, table)
    total, count = 0.0, 0
    for batch in epoch.batches:
        logits = table[np.where(batch.input_valid, batch.inputs, 0)]
        logits[~batch.loss_mask] = np.nan  # excluded cells are never read
        part = core_loss.token_weighted_sum(logits, batch)
        ordinals = batch.occurrences.ordinal.tolist()
        part_loss, part_n, _ = reference_step_numpy([windows[o] for o in ordinals], table)
        assert part.count == part_n
        if part_n:
            assert close(part.sum, part_loss * part_n)
            result = core_loss.token_weighted_loss(logits, batch)
            assert result.count == part_n and close(result.mean, part_loss)
        total += part.sum
        count += part.count
    assert count == want_n
    if want_n == 0:
        with pytest.raises(EmptyObjective):
            core_loss.divide(core_loss.LossSum(total, count))
        return
    # The global division: every batch's sum over the epoch's N, not its own count.
    first = core_loss.token_weighted_sum(
        table[np.where(epoch.batches[0].input_valid, epoch.batches[0].inputs, 0)], epoch.batches[0]
    )
    divided = core_loss.divide(first, want_n)
    assert divided.count == want_n and close(divided.mean, first.sum / want_n)
    assert close(core_loss.divide(core_loss.LossSum(total, count)).mean, want_loss)


def reference_step_numpy(examples, table):
    """:func:`reference_step` over a NumPy table, loss and count only."""
    n = sum(sum(flags) for _, flags in examples)
    terms = [
        log_softmax_nll(table[window[t]].tolist(), window[t + 1])
        for window, flags in examples
        for t, supervised in enumerate(flags)
        if supervised
    ]
    return (math.fsum(terms) / n if n else 0.0), n, None


@given(st.integers(1, 10**6), st.integers(1, 64), st.sampled_from(["mean", "sum"]))
def test_the_loss_factor_is_c_over_n(n, world, reduction):
    c = world if reduction == "mean" else 1
    assert loss_factor(n, world, reduction) == c / n
    raw = torch.tensor(3.0, dtype=torch.float64)
    assert float(normalize(raw, n, world_size=world, grad_reduction=reduction)) == 3.0 * c / n


def test_a_step_without_supervised_targets_is_an_error_before_any_division():
    with pytest.raises(EmptyObjective):
        loss_factor(0)
    with pytest.raises(EmptyObjective):
        core_loss.divide(core_loss.LossSum(0.0, 0))
    logits = torch.zeros(1, 3, VOCAB, dtype=torch.float64)
    labels = torch.full((1, 3), -100)
    empty = labels_nll_sum(logits, labels)
    assert empty.count == 0 and float(empty.sum) == 0.0
    with pytest.raises(EmptyObjective):
        micro_batch_loss(logits, {"shift_labels": labels, "num_items_in_batch": 0})
    # transformers' unshifted labels alone are refused, never scored one cell off
    with pytest.raises(InvalidInput, match="'shift_labels'"):
        micro_batch_loss(logits, {"labels": labels, "num_items_in_batch": 3})
