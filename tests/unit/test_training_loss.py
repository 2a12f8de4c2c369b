"""Loss normalisation across micro-batches and (simulated) ranks: exact gradient equality."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from exactpack import (
    Binding,
    EmptyObjective,
    InvalidInput,
    NotAvailable,
    PackConfig,
    SequenceExample,
    pack_examples,
)
from exactpack.core.loss import token_weighted_loss, token_weighted_sum
from exactpack.training.distributed import RowSampler, RowStats
from exactpack.training.global_loss import labels_nll_sum, loss_factor, micro_batch_loss, normalize
from exactpack.training.packed_data import (
    PackedCollator,
    ScheduledBatch,
    decoder_inputs,
    select_rows,
)
from exactpack.verify.decoder import TinyDecoder
from exactpack.verify.fixture import fixture_batch
from exactpack.verify.tolerances import within_tolerance

BINDING = Binding(266, "test-tokenizer", "sha256:test")
COLLATE = PackedCollator()


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def random_batch(seed: int, n: int = 14, capacity: int = 16):
    """One model call holding every row of ``n`` random documents (some targets unsupervised)."""
    rng = np.random.default_rng(seed)
    examples = []
    for i in range(n):
        length = int(rng.integers(1, capacity + 1))
        mask = rng.random(length) < 0.8
        doc = rng.integers(0, 266, size=length + 1)
        examples.append(
            SequenceExample.from_document(
                doc, source_id=f"d{i}", partition="train", binding=BINDING, loss_mask=mask
            )
        )
    return pack_examples("train", examples, BINDING, PackConfig(capacity, n)).batches[0]


def grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def reference_grads(model, batch):
    """Gradient of the single-batch token-weighted mean."""
    model.zero_grad()
    token_weighted_loss(model.forward_packed(batch), batch).mean.backward()
    return grads(model)


def assert_close(got, want):
    for name in want:
        ok = within_tolerance(got[name], want[name])
        assert bool(ok.all()), (name, float((got[name] - want[name]).abs().max()))


def some_differ(got, want):
    return any(not bool(within_tolerance(got[n], want[n]).all()) for n in want)


def run_step(model, batch, slots, world_size=1, grad_reduction="mean", attention=None):
    """Backward every slot's micro-batch loss into .grad (one process playing all slots)."""
    for slot in slots:
        features = COLLATE(ScheduledBatch(select_rows(batch, slot.rows), slot))
        logits = model(*decoder_inputs(features), attention=attention)
        loss = micro_batch_loss(
            logits,
            features,
            world_size=world_size,
            grad_reduction=grad_reduction,
            parameters=model.parameters(),
        )
        loss.backward()


@pytest.mark.parametrize("seed", range(6))
def test_k_micro_batches_give_the_single_batch_gradient(seed):
    batch = random_batch(seed)
    model = TinyDecoder("large", seed=seed)
    sampler = RowSampler(
        RowStats.from_batches([batch]), rows_per_micro_batch=2, micro_batches=3, seed=seed
    )
    assert sampler.schedule.steps >= 2
    controls = 0
    by_step: dict[int, list] = {}
    for slot in sampler:
        by_step.setdefault(slot.step, []).append(slot)
    for step, slots in by_step.items():
        rows = [r for s in slots for r in s.rows]
        want = reference_grads(model, select_rows(batch, sorted(rows)))
        assert slots[0].step_eligible == int(batch.loss_mask[rows].sum())
        model.zero_grad()
        run_step(model, batch, slots)
        assert_close(grads(model), want)
        # The control: averaging per-micro-batch means re-weights targets.
        model.zero_grad()
        for slot in slots:
            part = select_rows(batch, slot.rows)
            if part.eligible_count:
                (token_weighted_loss(model.forward_packed(part), part).mean / len(slots)).backward()
        counts = {select_rows(batch, s.rows).eligible_count for s in slots}
        if len(counts) > 1:
            controls += 1
            assert some_differ(grads(model), want), step
    assert controls > 0


@pytest.mark.parametrize("grad_reduction", ["mean", "sum"])
def test_ranks_reduce_to_the_single_batch_gradient(grad_reduction):
    """R simulated ranks: each rank's accumulated grads, then DDP's mean (or a sum)."""
    batch = random_batch(7, n=20)
    model = TinyDecoder("large", seed=3)
    world = 3
    stats = RowStats.from_batches([batch])
    samplers = [
        RowSampler(stats, rows_per_micro_batch=2, micro_batches=2, world_size=world, rank=r, seed=1)
        for r in range(world)
    ]
    slots = [list(s) for s in samplers]
    assert len({len(s) for s in slots}) == 1  # every rank runs the same number of calls
    for step in range(samplers[0].schedule.steps):
        step_slots = [[s for s in rank_slots if s.step == step] for rank_slots in slots]
        rows = sorted(r for rank in step_slots for s in rank for r in s.rows)
        want = reference_grads(model, select_rows(batch, rows))
        per_rank = []
        for rank in range(world):
            model.zero_grad()
            run_step(model, batch, step_slots[rank], world, grad_reduction)
            per_rank.append(grads(model))
        reduce = (lambda g: sum(g) / world) if grad_reduction == "mean" else sum
        got = {n: reduce([g[n] for g in per_rank]) for n in want}
        assert_close(got, want)
        # Forgetting the rank factor (mean reduction without * R) is off by R.
        if grad_reduction == "mean":
            assert some_differ({n: got[n] / world for n in got}, want)


def test_empty_slot_gives_exact_zero_gradient_for_every_parameter():
    batch = fixture_batch()
    model = TinyDecoder("large")
    sampler = RowSampler(
        RowStats.from_batches([batch]), rows_per_micro_batch=1, micro_batches=3, shuffle=False
    )
    slots = list(sampler)
    empty = [s for s in slots if not s.rows]
    assert len(empty) == 1 and empty[0].step_eligible == batch.eligible_count
    for attention in ("ranges", "varlen"):
        model.zero_grad(set_to_none=True)
        run_step(model, batch, empty, attention=attention)
        for name, p in model.named_parameters():
            assert p.grad is not None and not bool(p.grad.any()), name


def test_labels_sum_matches_the_batch_sum_and_skips_nan_padding():
    batch = fixture_batch()
    model = TinyDecoder("large")
    features = COLLATE(batch)
    logits = model(*decoder_inputs(features))
    want = token_weighted_sum(logits, batch)
    poisoned = logits.detach().clone()
    poisoned[0, 5] = float("nan")
    got = labels_nll_sum(poisoned, features["shift_labels"])
    assert got.count == want.count == 9
    # Float64 logits, the same NLL terms summed in possibly different orders.
    assert bool(within_tolerance(got.sum.detach(), want.sum.detach()))


def test_loss_factor_rule_and_errors():
    assert loss_factor(9) == 1 / 9
    assert loss_factor(9, world_size=4) == 4 / 9
    assert loss_factor(9, world_size=4, grad_reduction="sum") == 1 / 9
    with pytest.raises(EmptyObjective, match="skip the step"):
        normalize(torch.tensor(0.0), 0)
    with pytest.raises(InvalidInput, match="grad_reduction"):
        loss_factor(3, grad_reduction="avg")
    with pytest.raises(InvalidInput, match="world_size"):
        loss_factor(3, world_size=0)
    with pytest.raises(InvalidInput, match="disagree"):
        labels_nll_sum(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.int64))


def test_train_tiny_example_smoke(tmp_path):
    """examples/train_tiny.py briefly: packed and separate float64 training stay together."""
    script = Path(__file__).parents[2] / "examples" / "train_tiny.py"
    out = tmp_path / "curves.png"
    args = "--max-files 20 --steps 3 --compare-steps 2 --bench-steps 2 --bench-repeats 1"
    env = os.environ | {"MPLCONFIGDIR": str(tmp_path / "mpl")}
    run = subprocess.run(
        [sys.executable, str(script), *args.split(), "--max-length", "128", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    found = re.search(r"largest \|loss diff\| (\S+), largest \|param diff\| (\S+)", run.stdout)
    assert found is not None, run.stdout
    assert float(found[1]) <= 1e-10 and float(found[2]) <= 1e-10
    from matplotlib.image import imread

    curves = imread(out)[..., :3]  # the figure decodes, and has drawn lines on its canvas
    assert curves.ndim == 3 and len(np.unique(curves.reshape(-1, 3), axis=0)) > 2


def test_tree_rows_collate_to_weighted_labels_and_refuse_flattening():
    from exactpack.core.tree import SequenceGroups, pack_tree
    from exactpack.verify.fixture import fixture_binding

    groups = SequenceGroups.from_lists(
        [[[0, 99, 100, 1], [0, 99, 101, 1]], [[0, 102, 1]]], fixture_binding()
    )
    (batch,) = pack_tree(groups, 8).batches
    f = PackedCollator()(batch)
    assert f["weights"].tolist() == batch.weights.tolist() and f["weights"].max() == 2
    assert f["num_items_in_batch"] == batch.eligible_count == 8  # 3 + 3 + 2 targets
    logits = torch.randn(
        *batch.shape, 266, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
    )
    want = token_weighted_loss(logits, batch).mean
    got = micro_batch_loss(logits, f)
    assert abs(float(got) - float(want)) <= 1e-10 + 1e-9 * abs(float(want))
    with pytest.raises(NotAvailable, match=r"flatten=True\) reads cu_seqlens.*flatten=False"):
        PackedCollator(flatten=True)(batch)
