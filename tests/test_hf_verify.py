"""seqpack.hf.verify: separate vs packed on a tiny Llama built from a config, and the leaks."""

import os
from pathlib import Path

import pytest
import torch

from seqpack import InvalidInput, NotAvailable
from seqpack.hf.verify import (
    CAPACITY,
    FLOAT32_TOLERANCE,
    LENGTHS,
    load_model,
    tolerance,
    verification_examples,
    verify_hf,
)
from seqpack.nn.report import tiny_layouts, verify_tiny
from seqpack.nn.verify import ATOL, RTOL

os.environ["HF_HUB_OFFLINE"] = "1"
torch.set_num_threads(1)
CONFIG = Path(__file__).parent / "data" / "tiny_llama.json"
VOCAB = 266


def run(attn, mode, dtype=torch.float64, seed=0):
    model = load_model(config=CONFIG, attn_implementation=attn, dtype=dtype, seed=seed)
    return verify_hf(model, verification_examples(VOCAB, seed), mode=mode)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_adapter_passes_and_counts_every_comparison(attn):
    report = run(attn, "adapter")
    assert report["pass"], report
    model = load_model(config=CONFIG, attn_implementation=attn)
    targets = sum(LENGTHS)
    assert report["targets"] == targets
    assert report["eligible_targets"] == targets - 3  # example 2's prompt
    assert report["comparisons"] == {
        "logits": targets * VOCAB,
        "loss": 1,
        "gradients": sum(p.numel() for p in model.parameters()),
        "model_loss": 1,
    }
    assert report["rows"] == 3 and report["capacity"] == CAPACITY
    assert report["tolerance"]["abs"] == tolerance(torch.float64, attn)["abs"]
    assert report["max_abs_diff"]["logits"] < 1e-6
    assert abs(report["loss"]["separate"] - report["loss"]["packed"]) < 1e-12


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_naive_position_ids_with_default_cache_leak(attn):
    report = run(attn, "naive")
    assert not report["pass"]
    assert report["failures"]["logits"] > 0 and report["failures"]["gradients"] > 0
    assert report["max_abs_diff"]["logits"] > 1e-2
    assert "use_cache=True" in report["hint"]
    assert "model_loss" not in report["max_abs_diff"]


def test_boolean_mask_is_wrong_on_eager_and_right_on_sdpa():
    eager = run("eager", "bool-mask")
    assert not eager["pass"] and "as numbers" in eager["hint"]
    assert eager["max_abs_diff"]["logits"] > 1e-2
    assert run("sdpa", "bool-mask")["pass"]


def test_float32_sdpa_passes_with_the_float32_tolerance():
    report = run("sdpa", "adapter", dtype=torch.float32, seed=4)
    assert report["pass"] and report["model"]["dtype"] == "float32"
    assert (report["tolerance"]["abs"], report["tolerance"]["rel"]) == FLOAT32_TOLERANCE
    assert 0 < report["max_abs_diff"]["logits"] < FLOAT32_TOLERANCE[0]


def test_tolerance_follows_dtype_and_softmax_precision():
    assert (tolerance(torch.float64, "sdpa")["abs"], tolerance(torch.float64, "sdpa")["rel"]) == (
        ATOL,
        RTOL,
    )
    for dtype, attn in ((torch.float64, "eager"), (torch.float32, "sdpa")):
        t = tolerance(dtype, attn)
        assert (t["abs"], t["rel"]) == FLOAT32_TOLERANCE and "float32" in t["why"]


def test_local_pretrained_dir_and_config_dir(tmp_path):
    model = load_model(config=CONFIG, attn_implementation="sdpa", seed=7)
    model.save_pretrained(tmp_path / "model")
    loaded = load_model(model=tmp_path / "model", attn_implementation="eager")
    for (name, a), (_, b) in zip(
        model.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    report = verify_hf(loaded, verification_examples(VOCAB, 1), mode="adapter")
    assert report["pass"] and report["model"]["attn_implementation"] == "eager"
    same_seed = load_model(config=tmp_path / "model", attn_implementation="sdpa", seed=7)
    assert torch.equal(same_seed.lm_head.weight, model.lm_head.weight)


def test_unavailable_implementations_and_bad_input():
    for attn in ("flash_attention_2", "flex_attention"):
        with pytest.raises(NotAvailable, match=attn):
            load_model(config=CONFIG, attn_implementation=attn)
    with pytest.raises(InvalidInput, match="does not exist"):
        load_model(config=CONFIG.with_name("missing.json"))
    with pytest.raises(InvalidInput, match="choose one of"):
        load_model(config=CONFIG, attn_implementation="paged")
    with pytest.raises(InvalidInput, match="exactly one"):
        load_model()
    with pytest.raises(InvalidInput, match="max_position_embeddings 8"):
        verification_examples(VOCAB, 0, max_positions=8)


def test_tiny_decoder_adapter_passes_and_the_naive_control_fails():
    report = verify_tiny("ranges", seed=3, layouts=2)
    assert report["pass"] and report["layouts"] == 3  # the fixture + 2 random layouts
    assert report["max_abs_diff"]["logits"] < 1e-12
    assert report["comparisons"]["loss"] == 2 * 3  # padded and packed, per layout
    control = verify_tiny("ranges", mode="naive", seed=3, layouts=2)
    assert not control["pass"] and control["failures"]["logits"] > 0
    with pytest.raises(InvalidInput, match="transformers models only"):
        verify_tiny(mode="bool-mask")


def test_tiny_layouts_start_with_the_fixture_and_fit_their_capacity():
    layouts = tiny_layouts(5, 3, 16)
    assert [len(ex) for ex in layouts[0][0]] == [3, 2, 4] and layouts[0][1] == 6
    for examples, capacity, rows in layouts[1:]:
        assert 2 <= len(examples) <= 6 and 1 <= rows <= 3
        assert max(len(ex) for ex in examples) <= capacity <= 32
