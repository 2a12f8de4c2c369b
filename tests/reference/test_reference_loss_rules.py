"""The loss modules' rules and messages, against references written out per target.

``weighting_report``'s row and document means are recomputed with loops over
rows and occurrences; reduced-precision logits are upcast before the NLL;
every refusal names the value, the limit and what to do.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given

from exactpack import EmptyObjective, InvalidInput, PackConfig, SequenceExample, Split
from exactpack import pack_examples as pack
from exactpack.core import loss as core_loss
from exactpack.training.global_loss import labels_nll_sum, loss_factor, micro_batch_loss, normalize
from exactpack.verify.fixture import fixture_batch

from support.reference import close, log_softmax_nll
from support.strategies import BINDING, packed_epochs


@given(packed_epochs(max_capacity=8, max_examples=6))
def test_weighting_report_means_by_hand(case):
    _, _, epoch = case
    batch = epoch.batches[0]
    assume(batch.eligible_count > 0)
    rng = np.random.default_rng(batch.eligible_count)
    logits = rng.normal(size=(*batch.shape, BINDING.vocab_size))
    per_row: dict[int, list[float]] = {}
    per_occ: dict[int, list[float]] = {}
    for r in range(batch.shape[0]):
        for c in range(batch.shape[1]):
            if batch.loss_mask[r, c]:
                nll = log_softmax_nll(logits[r, c].tolist(), int(batch.targets[r, c]))
                per_row.setdefault(r, []).append(nll)
                per_occ.setdefault(int(batch.segments[r, c]), []).append(nll)
    terms = [x for v in per_row.values() for x in v]
    report = core_loss.weighting_report(logits, batch)
    assert report["eligible_targets"] == len(terms)
    assert report["valid_targets"] == int(batch.target_valid.sum())
    assert close(report["loss_sum"], math.fsum(terms))
    assert close(report["mean"], math.fsum(terms) / len(terms))

    def mean_of_means(groups):
        return math.fsum(math.fsum(v) / len(v) for v in groups.values()) / len(groups)

    assert close(report["row_mean"], mean_of_means(per_row))
    assert close(report["document_mean"], mean_of_means(per_occ))


def test_reduced_precision_logits_are_upcast_before_the_nll():
    batch = fixture_batch()
    logits = torch.randn(2, 6, 266, generator=torch.Generator().manual_seed(2))
    for dtype in (torch.bfloat16, torch.float16):
        low = logits.to(dtype)
        cells, nll = core_loss.eligible_nll(low, batch.targets, batch.loss_mask)
        assert (
            nll.dtype == torch.float32
            and cells.tolist() == np.flatnonzero(batch.loss_mask).tolist()
        )
        want = [
            log_softmax_nll(low[r, c].float().tolist(), int(batch.targets[r, c]))
            for r, c in zip(*np.nonzero(batch.loss_mask), strict=True)
        ]
        # float32 arithmetic over 266 classes of bf16/fp16 values: ~1e-6 relative.
        assert all(
            abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(nll.tolist(), want, strict=True)
        )
        labels = torch.where(
            torch.as_tensor(batch.loss_mask), torch.as_tensor(batch.targets).long(), -100
        )
        summed = labels_nll_sum(low, labels)
        assert summed.count == 9 and summed.sum.dtype == torch.float32
        assert abs(float(summed.sum) - math.fsum(want)) <= 1e-5 * math.fsum(want)


def test_numpy_logits_use_float64_and_stay_finite_at_large_scales():
    batch = fixture_batch()
    logits = np.zeros((2, 6, 266), dtype=np.float32)
    logits[..., 7] = 1e4  # exp would overflow without the max shift
    _, nll = core_loss.eligible_nll(logits, batch.targets, batch.loss_mask)
    assert nll.dtype == np.float64 and np.isfinite(nll).all()
    assert close(float(nll[0]), 1e4)  # gold 99 has logit 0, the top class 1e4


def test_eligible_targets_outside_the_vocabulary_are_named():
    batch = fixture_batch()
    with pytest.raises(InvalidInput) as err:
        core_loss.eligible_nll(np.zeros((2, 6, 100)), batch.targets, batch.loss_mask)
    assert str(err.value) == (
        "eligible target 104 is outside the logits' vocabulary [0, 100)"
        " — a loss-eligible cell must hold a real target id"
    )
    bad = batch.targets.copy()
    bad[0, 0] = -5
    with pytest.raises(InvalidInput) as err:
        core_loss.eligible_nll(np.zeros((2, 6, 266)), bad, batch.loss_mask)
    assert str(err.value).startswith("eligible target -5 is outside")


def test_logits_shape_and_width_messages():
    batch = fixture_batch()
    with pytest.raises(InvalidInput) as err:
        core_loss.token_weighted_sum(np.zeros((2, 5, 266)), batch)
    assert str(err.value) == (
        "logits have shape (2, 5, 266); expected (2, 6, 'V')"
        " — one vocabulary row per cell of the batch"
    )
    with pytest.raises(InvalidInput) as err:
        core_loss.token_weighted_sum(np.zeros((2, 6)), batch)
    assert str(err.value).startswith("logits have shape (2, 6); expected (2, 6, 'V')")
    with pytest.raises(InvalidInput) as err:
        core_loss.token_weighted_sum(np.zeros((2, 6, 265)), batch)
    assert str(err.value) == (
        "logits have 265 vocabulary columns but the batch's binding has vocab_size 266"
        " — use a model whose vocabulary covers the binding"
    )
    # masked_nll_sum has no binding: any width covering the targets will do.
    assert (
        core_loss.masked_nll_sum(np.zeros((2, 6, 105)), batch.targets, batch.loss_mask).count == 9
    )


def test_empty_objective_messages_name_what_was_empty():
    ex = SequenceExample.from_document(
        [0, 5, 1], source_id="p", partition="train", binding=BINDING, loss_mask=[False, False]
    )
    batch = pack(Split.TRAIN, [ex], BINDING, PackConfig(4, 1)).batches[0]
    with pytest.raises(EmptyObjective) as err:
        core_loss.token_weighted_loss(np.zeros((1, 4, 266)), batch)
    assert str(err.value) == (
        "batch of 1x4 cells has 0 loss-eligible targets, so the token-weighted mean has no"
        " denominator — skip it, or accumulate raw sums and divide by a global count"
    )
    with pytest.raises(EmptyObjective) as err:
        core_loss.divide(core_loss.LossSum(0.0, 0), what="step 3")
    assert str(err.value).startswith("step 3 has 0 loss-eligible targets")
    # An explicit global count wins over the call's own, even when that one is 0.
    result = core_loss.divide(core_loss.LossSum(6.0, 0), 4)
    assert (result.sum, result.count, result.mean) == (6.0, 4, 1.5)


def test_probe_logits_refuse_probabilities_outside_zero_one():
    batch = fixture_batch()
    for q in (0.0, 1.0, 1.5, -0.1):
        gold = np.full(batch.shape, 0.5)
        gold[0, 1] = q
        with pytest.raises(InvalidInput) as err:
            core_loss.probe_logits(batch, gold)
        assert str(err.value) == "gold probabilities must lie strictly between 0 and 1"
    gold = np.full(batch.shape, 0.5)
    gold[0, 5] = 7.0  # padding: never read
    logits = core_loss.probe_logits(batch, gold)
    assert logits.shape == (2, 6, 266) and logits.dtype == np.float64
    assert not logits[0, 5].any() and not logits[1, 4:].any()
    assert close(float(logits[0, 0, 99]), math.log(265.0))  # (V-1) q/(1-q) at q = 1/2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((9, 1, "avg"), "grad_reduction must be 'mean' or 'sum', got 'avg'"),
        ((9, 0), "world_size must be a positive integer, got 0"),
        ((9, True), "world_size must be a positive integer, got True"),
        ((9, 2.0), "world_size must be a positive integer, got 2.0"),
        ((-1,), "the step's eligible count must be >= 0, got -1"),
    ],
)
def test_loss_factor_refusals(args, message):
    with pytest.raises(InvalidInput) as err:
        loss_factor(*args)
    assert str(err.value) == message


def test_an_empty_step_is_named():
    with pytest.raises(EmptyObjective) as err:
        loss_factor(0, 4)
    assert str(err.value) == (
        "this optimizer step has 0 loss-eligible targets across all ranks and micro-batches,"
        " so its token-weighted mean has no denominator — skip the step"
    )


def test_labels_are_checked_against_the_logits():
    logits = torch.zeros(1, 3, 5, dtype=torch.float64)
    with pytest.raises(InvalidInput) as err:
        labels_nll_sum(logits, torch.zeros(1, 4, dtype=torch.int64))
    assert str(err.value) == (
        "logits (1, 3, 5) and labels (1, 4) disagree — one vocabulary row per labelled cell"
    )
    for bad in (5, -2):
        with pytest.raises(InvalidInput) as err:
            labels_nll_sum(logits, torch.tensor([[0, bad, -100]]))
        assert str(err.value) == (
            "a label lies outside the logits' vocabulary [0, 5)"
            " — use -100 for cells outside the loss"
        )
    # Another ignore index is honoured.
    got = labels_nll_sum(logits, torch.tensor([[0, -1, -1]]), ignore_index=-1)
    assert got.count == 1 and close(float(got.sum), math.log(5.0))


def test_an_empty_micro_batch_still_reaches_every_parameter():
    weights = torch.nn.Parameter(torch.randn(4, 5, dtype=torch.float64))
    bias = torch.nn.Parameter(torch.zeros(5, dtype=torch.float64))
    logits = weights[torch.zeros(1, 2, dtype=torch.int64)] + bias
    features = {"shift_labels": torch.full((1, 2), -100), "num_items_in_batch": 7}
    loss = micro_batch_loss(logits, features, parameters=[weights, bias])
    loss.backward()
    assert float(loss.detach()) == 0.0
    assert weights.grad is not None and bias.grad is not None
    assert not weights.grad.any() and not bias.grad.any()
    # A micro-batch with targets does not add the parameter term.
    features = {"shift_labels": torch.tensor([[1, -100]]), "num_items_in_batch": 4}
    raw = micro_batch_loss(weights[torch.zeros(1, 2, dtype=torch.int64)], features, world_size=2)
    want = 2 * log_softmax_nll(weights[0].tolist(), 1) / 4
    assert close(float(raw.detach()), want)
    summed = normalize(torch.tensor(3.0, dtype=torch.float64), 4, parameters=[bias])
    assert float(summed.detach()) == 0.75 and summed.requires_grad


def test_default_and_probe_messages_name_what_was_empty():
    with pytest.raises(EmptyObjective) as err:
        core_loss.divide(core_loss.LossSum(0.0, 0))
    assert str(err.value).startswith("this batch has 0 loss-eligible targets,")
    ex = SequenceExample.from_document(
        [0, 5, 1], source_id="p", partition="train", binding=BINDING, loss_mask=[False, False]
    )
    batch = pack(Split.TRAIN, [ex], BINDING, PackConfig(4, 1)).batches[0]
    with pytest.raises(EmptyObjective) as err:
        core_loss.weighting_report(np.zeros((1, 4, 266)), batch)
    assert str(err.value).startswith("the probe batch has 0 loss-eligible targets,")


def test_rows_and_occurrences_without_targets_are_left_out_of_the_means():
    docs = [[0, 5, 6, 1], [0, 7, 1], [0, 8, 9, 1]]
    masks = [[True, True, False], [False, False], [True, False, True]]
    examples = [
        SequenceExample.from_document(
            d, source_id=f"d{i}", partition="train", binding=BINDING, loss_mask=m
        )
        for i, (d, m) in enumerate(zip(docs, masks, strict=True))
    ]
    batch = pack(Split.TRAIN, examples, BINDING, PackConfig(3, 3)).batches[0]
    assert batch.shape == (3, 3) and not batch.loss_mask[1].any()  # the middle row: none
    logits = np.random.default_rng(4).normal(size=(3, 3, 266))
    nll = {
        (r, c): log_softmax_nll(logits[r, c].tolist(), int(batch.targets[r, c]))
        for r in range(3)
        for c in range(3)
        if batch.loss_mask[r, c]
    }
    row0 = (nll[0, 0] + nll[0, 1]) / 2
    row2 = (nll[2, 0] + nll[2, 2]) / 2
    report = core_loss.weighting_report(logits, batch)
    assert close(report["row_mean"], (row0 + row2) / 2)
    assert close(report["document_mean"], (row0 + row2) / 2)  # one occurrence per row here
    assert report["eligible_targets"] == 4 and report["valid_targets"] == 3 + 2 + 3


def test_a_target_equal_to_the_width_is_outside_and_the_worst_one_is_named():
    batch = fixture_batch()  # targets reach 104
    with pytest.raises(InvalidInput) as err:
        core_loss.eligible_nll(np.zeros((2, 6, 104)), batch.targets, batch.loss_mask)
    assert str(err.value).startswith(
        "eligible target 104 is outside the logits' vocabulary [0, 104)"
    )
    targets = np.array([[0, 300, 3]])
    with pytest.raises(InvalidInput) as err:  # the smallest (0) is fine: the largest is named
        core_loss.eligible_nll(np.zeros((1, 3, 266)), targets, np.ones((1, 3), dtype=bool))
    assert str(err.value).startswith("eligible target 300 is outside")


def test_masked_sums_need_only_one_vocabulary_column_and_give_python_floats():
    logits = np.zeros((1, 2, 1))
    got = core_loss.masked_nll_sum(logits, np.zeros((1, 2), dtype=np.int64), np.ones((1, 2), bool))
    assert got.count == 2 and got.sum == 0.0 and type(got.sum) is float
    batch = fixture_batch()
    part = core_loss.token_weighted_sum(np.zeros((2, 6, 266)), batch)
    assert type(part.sum) is float and close(part.sum, 9 * math.log(266))


def test_normalize_validates_the_reduction_it_is_given():
    with pytest.raises(InvalidInput) as err:
        normalize(torch.tensor(1.0), 3, grad_reduction="avg")
    assert str(err.value) == "grad_reduction must be 'mean' or 'sum', got 'avg'"
    assert float(normalize(torch.tensor(6.0), 3, world_size=2, grad_reduction="sum")) == 2.0
    assert float(normalize(torch.tensor(6.0), 3, world_size=2)) == 4.0


def test_micro_batch_loss_honours_its_ignore_index():
    logits = torch.zeros(1, 3, 5, dtype=torch.float64)
    features = {"shift_labels": torch.tensor([[2, -1, -100]]), "num_items_in_batch": 2}
    # -100 is a real (out-of-vocabulary) label here: with ignore_index=-1 it must be refused
    with pytest.raises(InvalidInput, match="outside the logits' vocabulary"):
        micro_batch_loss(logits, features, ignore_index=-1)
    features = {"shift_labels": torch.tensor([[2, -1, 4]]), "num_items_in_batch": 2}
    got = micro_batch_loss(logits, features, ignore_index=-1)
    assert close(float(got), 2 * math.log(5.0) / 2)


def test_only_an_empty_micro_batch_touches_the_other_parameters():
    """The ``0 * Σp`` term is for empty micro-batches only: elsewhere a parameter the logits
    do not use (here one holding inf) must not reach the loss."""
    weights = torch.nn.Parameter(torch.zeros(3, 4, dtype=torch.float64))
    unused = torch.nn.Parameter(torch.full((2,), float("inf"), dtype=torch.float64))
    logits = weights[torch.tensor([[0, 1]])]
    features = {"shift_labels": torch.tensor([[1, -100]]), "num_items_in_batch": 1}
    loss = micro_batch_loss(logits, features, parameters=[weights, unused])
    assert close(float(loss.detach()), math.log(4.0))


def test_the_nll_stays_on_the_logits_device():
    """Targets follow the logits to their device (``meta`` here stands in for a GPU: it runs
    shapes only, and refuses to mix devices as CUDA does)."""
    batch = fixture_batch()
    logits = torch.zeros(2, 6, 266, device="meta")
    cells, nll = core_loss.eligible_nll(logits, batch.targets, batch.loss_mask)
    assert nll.device.type == "meta" and nll.shape == (9,) and cells.shape == (9,)
