import math

import numpy as np
import pytest
import torch
from hypothesis import given

from exactpack import EmptyObjective, InvalidInput, PackConfig, SequenceExample, Split
from exactpack import pack_examples as pack
from exactpack.core.loss import (
    LossSum,
    divide,
    probe_logits,
    token_weighted_loss,
    token_weighted_sum,
    weighting_report,
)
from exactpack.verify.fixture import fixture_batch, probe_gold_probability
from exactpack.verify.trace import probe_section

from support.strategies import BINDING, packed_epochs

torch.set_num_threads(1)
LN2 = math.log(2.0)


def close(a, b):
    return abs(a - b) <= 1e-10 + 1e-9 * max(abs(a), abs(b))


def fixture_probe_logits():
    batch = fixture_batch()
    return batch, probe_logits(batch, probe_gold_probability(batch))


def test_probe_matches_the_closed_forms():
    batch, logits = fixture_probe_logits()
    report = weighting_report(logits, batch)
    assert report["valid_targets"] == report["eligible_targets"] == 9
    # A: 3 targets at q=1/2, B: 2 at 1/4, C: 4 at 1/2 -> 3 ln2 + 4 ln2 + 4 ln2.
    assert close(report["loss_sum"], 11 * LN2)
    assert close(report["mean"], 11 / 9 * LN2)
    assert close(report["row_mean"], (7 / 5 + 4 / 4) / 2 * LN2) and close(
        report["row_mean"], 6 / 5 * LN2
    )
    assert close(report["document_mean"], 4 / 3 * LN2)
    # The two wrong weightings really differ from the token-weighted mean.
    assert not close(report["row_mean"], report["mean"])
    assert not close(report["document_mean"], report["mean"])


def test_probe_logits_give_the_requested_gold_probabilities():
    batch, logits = fixture_probe_logits()
    z = logits[batch.loss_mask]
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    gold = p[np.arange(9), batch.targets[batch.loss_mask]]
    expected = np.where(batch.segments[batch.loss_mask] == 1, 0.25, 0.5)
    # float64: log((V-1) q/(1-q)) then a softmax over V=266 terms, a few ulps of error
    assert np.all(np.abs(gold - expected) <= 1e-10 + 1e-9 * expected)


def test_demo_probe_section_is_the_same_computation():
    section = probe_section(fixture_batch())
    assert close(section["loss_sum"], 11 * LN2) and close(section["mean"], 11 / 9 * LN2)
    assert section["printed"]["loss_sum"] == f"{11 * LN2:.6f}"
    assert section["printed"]["mean"] == f"{11 / 9 * LN2:.6f}"


@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
def test_non_finite_logits_in_excluded_cells_change_nothing(poison):
    # An interior valid cell with loss_mask False, plus padding: both excluded.
    ex = [
        SequenceExample.from_document(
            [0, 5, 6, 7, 1],
            source_id="m",
            partition="train",
            binding=BINDING,
            loss_mask=[False, True, False, True],
        ),
        SequenceExample.from_document([0, 9, 1], source_id="n", partition="train", binding=BINDING),
    ]
    batch = pack(Split.TRAIN, ex, BINDING, PackConfig(8, 1)).batches[0]
    logits = np.random.default_rng(0).normal(size=(*batch.shape, 266))
    clean = token_weighted_loss(logits, batch)
    dirty = logits.copy()
    dirty[~batch.loss_mask] = poison
    assert (~batch.loss_mask & batch.target_valid).any()  # a real but excluded target
    result = token_weighted_loss(dirty, batch)
    assert result == clean and math.isfinite(result.sum)

    t_dirty = torch.tensor(dirty, requires_grad=True)
    t_result = token_weighted_loss(t_dirty, batch)
    assert close(t_result.sum.item(), clean.sum) and t_result.count == clean.count
    t_result.mean.backward()
    grad = t_dirty.grad.numpy()
    assert np.isfinite(grad).all()
    assert np.all(grad[~batch.loss_mask] == 0.0)


def test_mean_loss_logit_derivative_is_p_minus_onehot_over_n():
    batch = fixture_batch()
    logits = torch.tensor(
        np.random.default_rng(7).normal(size=(*batch.shape, 266)), requires_grad=True
    )
    result = token_weighted_loss(logits, batch)
    result.mean.backward()
    n = result.count
    mask = batch.loss_mask
    p = torch.softmax(logits.detach()[torch.as_tensor(mask)], dim=-1).numpy()
    onehot = np.zeros_like(p)
    onehot[np.arange(n), batch.targets[mask]] = 1.0
    expected = (p - onehot) / n
    got = logits.grad.numpy()[mask]
    tol = 1e-10 + 1e-9 * np.maximum(np.abs(expected), np.abs(got))
    assert got.shape == (9, 266) and np.all(np.abs(got - expected) <= tol)
    assert np.all(logits.grad.numpy()[~mask] == 0.0)


def reference_nll(logits, batch):
    """Independent per-cell loop with math.fsum (slow, clear)."""
    total = []
    for r, c in zip(*np.nonzero(batch.loss_mask), strict=True):
        z = logits[r, c]
        m = max(z)
        total.append(m + math.log(math.fsum(math.exp(x - m) for x in z)) - z[batch.targets[r, c]])
    return math.fsum(total), len(total)


@given(packed_epochs(max_capacity=8, max_examples=6))
def test_numpy_and_torch_agree_with_a_per_cell_reference(case):
    _, _, epoch = case
    for i, batch in enumerate(epoch.batches):
        logits = np.random.default_rng(i).normal(scale=3.0, size=(*batch.shape, 266))
        expected_sum, n = reference_nll(logits, batch)
        got = token_weighted_sum(logits, batch)
        got_t = token_weighted_sum(torch.tensor(logits), batch)
        assert got.count == got_t.count == n == batch.eligible_count
        assert close(got.sum, expected_sum) and close(float(got_t.sum), expected_sum)


@given(packed_epochs(max_capacity=8, max_examples=6))
def test_raw_sums_accumulate_to_the_whole_epoch_mean(case):
    """Per-batch raw sums added and divided once equal one batch holding every row."""
    examples, capacity, epoch = case
    whole = pack(Split.TRAIN, examples, BINDING, PackConfig(capacity, epoch.row_count))
    [one] = whole.batches
    logits = np.random.default_rng(3).normal(size=(one.shape[0], capacity, 266))
    parts = [
        token_weighted_sum(logits[b.first_row : b.first_row + b.shape[0]], b) for b in epoch.batches
    ]
    total = LossSum(math.fsum(p.sum for p in parts), sum(p.count for p in parts))
    single = token_weighted_sum(logits, one)
    assert total.count == single.count and close(total.sum, single.sum)
    if total.count:
        assert close(divide(total).mean, token_weighted_loss(logits, one).mean)


def test_zero_eligible_targets_is_a_clear_error():
    ex = SequenceExample.from_document(
        [0, 5, 1], source_id="p", partition="train", binding=BINDING, loss_mask=[False, False]
    )
    batch = pack(Split.TRAIN, [ex], BINDING, PackConfig(4, 1)).batches[0]
    logits = np.zeros((1, 4, 266))
    assert token_weighted_sum(logits, batch) == LossSum(0.0, 0)
    with pytest.raises(EmptyObjective, match=r"0 loss-eligible targets.*no denominator"):
        token_weighted_loss(logits, batch)
    t = torch.zeros(1, 4, 266, requires_grad=True)
    raw = token_weighted_sum(t, batch)
    raw.sum.backward()
    assert raw.count == 0 and raw.sum.item() == 0.0 and torch.all(t.grad == 0)
    with pytest.raises(EmptyObjective):
        token_weighted_loss(t, batch)


def test_shape_and_vocabulary_errors():
    batch = fixture_batch()
    with pytest.raises(InvalidInput, match=r"expected \(2, 6, 'V'\)"):
        token_weighted_loss(np.zeros((2, 5, 266)), batch)
    with pytest.raises(InvalidInput, match="vocab_size 266"):
        token_weighted_loss(np.zeros((2, 6, 100)), batch)
    # A larger model vocabulary (e.g. padded to a multiple of 64) is fine.
    assert token_weighted_loss(np.zeros((2, 6, 320)), batch).count == 9
