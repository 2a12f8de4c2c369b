"""The seed's integration suite: separate == padded == packed, isolation and its control."""

import numpy as np
import pytest
import torch

from exactpack import InvalidInput, PackConfig, SequenceExample, Split, pack_examples
from exactpack.verify.decoder import PROFILES, TinyDecoder
from exactpack.verify.fixture import fixture_batch, fixture_binding, fixture_examples
from exactpack.verify.layouts import three_way
from exactpack.verify.probes import first_query_probe, isolation_probe, unguarded_causal_attention
from exactpack.verify.trace import demo_trace

torch.set_num_threads(1)
SEEDS = range(100)


def test_fixture_three_way_report():
    model = TinyDecoder("large", seed=42)
    report = three_way(model, fixture_examples(), 6)
    assert report["passed"]
    batch = fixture_batch()
    targets = int(batch.target_valid.sum())
    vocab = batch.binding.vocab_size
    # Two layouts (padded, packed), each compared with the separate runs.
    assert report["comparisons"] == {
        "logits": 2 * targets * vocab,
        "loss_sum": 2,
        "gradients": 2 * model.num_parameters,
    }
    assert report["failures"] == {"logits": 0, "loss_sum": 0, "gradients": 0}
    for pair in report["against_separate"].values():
        assert pair["logits"]["comparisons"] == targets * vocab
        assert pair["gradients"]["comparisons"] == model.num_parameters
    sums = report["loss_sum"]
    assert abs(sums["packed"] - sums["separate"]) <= 1e-10 + 1e-9 * abs(sums["separate"])
    # Each of those comparisons met |a-b| <= 1e-10 + 1e-9*max(|a|,|b|) (failures == 0 above);
    # a fixed bound tighter than that tolerance would test the machine, not the layout.
    assert report["tolerance"] == {"abs": 1e-10, "rel": 1e-9}


def test_demo_model_section_reports_the_same_run():
    section = demo_trace()["model"]
    report = three_way(TinyDecoder("large", seed=42), fixture_examples(), 6)
    model = TinyDecoder("large", seed=42)
    assert section["profile"] == "large" and section["parameters"] == model.num_parameters
    assert section["seed"] == 42 and section["passed"] is True
    assert section["loss_sum"] == report["loss_sum"]
    assert section["comparisons"] == report["comparisons"]
    # The printed differences are the report's, at 12 decimals (not an exact zero: float64
    # packed and separate sums may differ in their last bits).
    for key, value in report["max_abs_diff"].items():
        assert section["printed"]["max_abs_diff"][key] == f"{value:.12f}"


def random_case(seed: int, max_len: int):
    """Random documents, interior ranges, loss masks, duplicates and capacities."""
    rng = np.random.default_rng(seed)
    binding = fixture_binding()
    examples = []
    for i in range(int(rng.integers(1, 7))):
        if examples and rng.random() < 0.25:
            examples.append(examples[int(rng.integers(len(examples)))])  # duplicate
            continue
        length = int(rng.integers(1, max_len + 1))
        pre, post = (int(x) for x in rng.integers(0, 3, size=2))
        doc = rng.integers(0, 266, size=pre + length + 1 + post)
        mask = rng.random(length) < 0.7 if rng.random() < 0.3 else None
        examples.append(
            SequenceExample.from_document(
                doc,
                source_id=f"s{seed}-{i}",
                partition="train",
                binding=binding,
                range=(pre, pre + length + 1),
                loss_mask=mask,
            )
        )
    longest = max(len(ex) for ex in examples)
    capacity = int(rng.integers(longest, 2 * max_len + 1))
    padded = int(rng.integers(longest, longest + 3))
    return examples, capacity, padded, int(rng.integers(1, 4))


@pytest.mark.parametrize("profile", list(PROFILES))
def test_integration_100_seeds_separate_padded_packed(profile):
    totals = {"logits": 0, "loss_sum": 0, "gradients": 0}
    duplicates = multi_batch = 0
    for seed in SEEDS:
        examples, capacity, padded, rows = random_case(seed, PROFILES[profile].max_len)
        model = TinyDecoder(profile, seed=seed)
        report = three_way(
            model, examples, capacity, padded_capacity=padded, max_rows_per_batch=rows
        )
        assert report["passed"], (seed, report["failures"], report["max_abs_diff"])
        for key, count in report["comparisons"].items():
            totals[key] += count
        duplicates += len({id(ex) for ex in examples}) < len(examples)
        multi_batch += rows < len(examples)
    assert totals["loss_sum"] == 2 * len(SEEDS)
    assert totals["gradients"] == 2 * len(SEEDS) * PROFILES[profile].parameter_count()
    assert duplicates > 10 and multi_batch > 10  # the cases really vary
    print(f"{profile}: {len(SEEDS)} seeds, comparisons {totals}")


@pytest.mark.parametrize("profile", list(PROFILES))
def test_isolation_on_random_layouts(profile):
    """Each random case: perturb everything outside one shared-row occurrence."""
    probed = 0
    for seed in SEEDS:
        examples, capacity, _, _ = random_case(seed, PROFILES[profile].max_len)
        binding = fixture_binding()
        [batch] = pack_examples(
            Split.TRAIN, examples, binding, PackConfig(capacity, len(examples))
        ).batches
        shared = [
            int(s)
            for s, r in zip(batch.occurrences.segment, batch.occurrences.row, strict=True)
            if (batch.occurrences.row == r).sum() > 1 and batch.loss_mask[batch.segments == s].any()
        ]
        if not shared:
            continue
        model = TinyDecoder(profile, seed=seed)
        segment = shared[-1]
        assert isolation_probe(model, batch, segment)["passed"], seed
        assert first_query_probe(model, batch, segment)["passed"], seed
        probed += 1
    assert probed >= 30


def test_perturbing_a_leaves_b_unchanged_with_zero_derivatives():
    model = TinyDecoder("large", seed=42)
    report = isolation_probe(model, fixture_batch(), segment=1)  # B
    assert report["passed"]
    batch = fixture_batch()
    b_targets = int((batch.segments == 1).sum())
    assert report["compared"]["logits"]["comparisons"] == b_targets * batch.binding.vocab_size
    assert report["compared"]["gradients"]["comparisons"] == model.num_parameters
    assert report["max_abs_derivative_into"] == {"other_segments": 0.0, "padding": 0.0}
    assert report["perturbed_cells"] == 10 and report["sites"] == 3  # A, padding, C row
    assert report["others_changed_by"] > 0.1  # the perturbation is real


def test_b_first_query_has_zero_derivative_into_future_and_padding():
    report = first_query_probe(TinyDecoder("large", seed=42), fixture_batch(), segment=1)
    assert report["query"] == [0, 3] and report["passed"]
    d = report["max_abs_derivative"]
    assert d["future"] == d["padding"] == d["other_segments"] == 0.0
    assert d["own_cell"] > 0


def test_control_without_the_segment_guard_a_is_detected():
    model = TinyDecoder("large", seed=42)
    batch = fixture_batch()
    leak = isolation_probe(model, batch, segment=1, attention=unguarded_causal_attention)
    assert not leak["passed"]
    assert leak["compared"]["logits"]["failures"] > 0
    assert leak["compared"]["gradients"]["failures"] > 0
    assert leak["max_abs_derivative_into"]["other_segments"] > 0
    first = first_query_probe(model, batch, segment=1, attention=unguarded_causal_attention)
    assert not first["passed"] and first["max_abs_derivative"]["other_segments"] > 0
    # And the three-way comparison fails too: packed B sees A, separate B does not.
    model.attention = unguarded_causal_attention
    report = three_way(model, fixture_examples(), 6)
    assert not report["passed"] and report["failures"]["logits"] > 0


def test_three_way_needs_examples():
    with pytest.raises(InvalidInput, match="at least one example"):
        three_way(TinyDecoder(), [], 6)
