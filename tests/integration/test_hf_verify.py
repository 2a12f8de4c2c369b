"""exactpack.verify.models: separate vs packed on a tiny Llama from a config, and the leaks."""

import json
import os
from pathlib import Path

import pytest
import torch

from exactpack import InvalidInput, NotAvailable, PackConfig, pack_examples
from exactpack.hf.adapter import build_inputs
from exactpack.hf.architectures import describe
from exactpack.verify.layouts import tiny_layouts, verify_tiny
from exactpack.verify.models import (
    CAPACITY,
    LENGTHS,
    ModelCrashed,
    load_model,
    tolerance,
    verification_examples,
    verification_layout,
    verify_hf,
)
from exactpack.verify.tolerances import ATOL, FLOAT32_TOLERANCE, RTOL, observe

os.environ["HF_HUB_OFFLINE"] = "1"
torch.set_num_threads(1)
CONFIG = Path(__file__).parents[1] / "data" / "tiny_llama.json"
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
    # sdpa stays in float64; eager's float32 softmax is observed and named.
    tol = report["tolerance"]
    if attn == "sdpa":
        assert (tol["abs"], tol["rel"]) == (ATOL, RTOL) and tol["islands"] == {}
    else:
        assert (tol["abs"], tol["rel"]) == FLOAT32_TOLERANCE
        assert tol["islands"] == {"LlamaAttention": ["_softmax (float32)"]}
    assert report["max_abs_diff"]["logits"] < tol["abs"]
    # The loss agrees within the tolerance of its own dtype path: measured 1.1e-8 for
    # eager on one CPU and 1e-12 on another (float32 softmax rounding), so no fixed bound.
    sep, packed = report["loss"]["separate"], report["loss"]["packed"]
    assert abs(sep - packed) <= tol["abs"] + tol["rel"] * max(abs(sep), abs(packed))


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


def test_tolerance_follows_the_observed_dtype_path():
    assert (tolerance(torch.float64)["abs"], tolerance(torch.float64)["rel"]) == (ATOL, RTOL)
    islands = {"GemmaRMSNorm": ["_to_copy (float32)"], "backward": ["sum (float32)"]}
    for t in (tolerance(torch.float32), tolerance(torch.float64, islands)):
        assert (t["abs"], t["rel"]) == FLOAT32_TOLERANCE and "float32" in t["why"]
    assert "GemmaRMSNorm" in tolerance(torch.float64, islands)["why"]


def islands_of(model_type, attn, **options):
    from transformers import AutoConfig, AutoModelForCausalLM

    base = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1}
    config = AutoConfig.for_model(model_type, vocab_size=266, **(base | options))
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation=attn, dtype=torch.float64, experts_implementation="eager"
    )
    ids = torch.arange(7)[None]
    return observe(lambda: model(input_ids=ids).logits.sum().backward())[0]


def test_float32_islands_are_observed_not_assumed():
    """Reductions over keys or tokens in float32 are islands; per-token float32 is not."""
    # Llama's RMSNorm casts each token to float32 at fixed width: both runs agree.
    assert islands_of("llama", "sdpa", num_attention_heads=2, num_key_value_heads=1) == {}
    eager = islands_of("llama", "eager", num_attention_heads=2, num_key_value_heads=1)
    assert eager == {"LlamaAttention": ["_softmax (float32)"]}
    # Gemma multiplies by its norm weight in float32: that weight's gradient sums
    # over tokens in float32 (the 4e-7 relative false FAIL the seed tolerance gave).
    gemma = islands_of("gemma", "sdpa", num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    assert gemma == {"backward": ["sum (float32)"]}
    moe = islands_of("mixtral", "sdpa", num_attention_heads=2, num_key_value_heads=1,
                     num_local_experts=4, num_experts_per_tok=2)  # fmt: skip
    assert "MixtralTopKRouter" in moe


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


def test_windowed_models_get_examples_longer_than_the_window():
    assert verification_layout(None) == verification_layout(None, 64)  # LENGTHS at 12
    layout = verification_layout(16, 4096)
    assert layout.lengths[0] == 2 * 16 + 3 and layout.capacity == 38 and layout.window_exercised
    capped = verification_layout(600, 32768)  # 2w+3 capped to a row of MAX_WIDTH
    assert max(capped.lengths) == 1021 and capped.capacity == 1024 and capped.window_exercised
    beyond = verification_layout(4096, 32768)  # cannot be exercised by default: say so
    assert beyond.lengths == LENGTHS and not beyond.window_exercised
    own = verification_layout(16, 64, (40, 20, 9, 3))
    assert own.capacity == 64 and own.lengths == (40, 20, 9, 3)  # the sum (72) does not fit
    with pytest.raises(InvalidInput, match="does not fit rows of 30"):
        verification_layout(None, 64, (40, 20), 30)
    with pytest.raises(InvalidInput, match="max_position_embeddings 32"):
        verification_layout(None, 32, (40, 20))


def test_a_window_of_16_with_a_40_pair_example_passes_and_the_unwindowed_mask_leaks(tmp_path):
    """The issue's case: a window-16 model, 40- and 20-pair examples in one row."""
    config = json.loads(CONFIG.read_text()) | {"model_type": "mistral", "sliding_window": 16}
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = load_model(config=tmp_path, attn_implementation="sdpa")
    layout = verification_layout(16, 64, (40, 20))
    examples = verification_examples(VOCAB, 0, layout=layout)
    report = verify_hf(model, examples, max_length=layout.capacity)
    assert report["pass"] and report["architecture"]["windows"] == {"all": 16}
    assert report["rows"] == 1 and report["max_abs_diff"]["logits"] < 1e-12
    (batch,) = pack_examples("train", examples, examples[0].binding, PackConfig(60, 2)).batches
    arch = describe(model.config)
    with torch.no_grad():
        windowed = model(**build_inputs(batch, "sdpa", arch, dtype=torch.float64)).logits
        unwindowed = model(**build_inputs(batch, "sdpa", None, dtype=torch.float64)).logits
    gap = (unwindowed - windowed)[0].abs().amax(-1)  # (T,)
    assert float(gap[:16].max()) < 1e-12 < 1e-2 < float(gap[16:40].min())  # from position 16 on


def test_float64_moe_runs_its_experts_eagerly_and_passes():
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(CONFIG)).to_dict()
    config |= {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2}
    config = AutoConfig.for_model(**config)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float64).eval()
    assert model.config._experts_implementation == "grouped_mm"  # no float64 kernel
    report = verify_hf(model, verification_examples(VOCAB, 0))
    assert model.config._experts_implementation == "eager" and report["pass"]
    assert "MixtralTopKRouter" in report["tolerance"]["islands"]


def test_a_crash_inside_the_model_is_one_named_line():
    model = load_model(config=CONFIG, attn_implementation="sdpa")
    model.model.layers[0].mlp.forward = lambda x: x.view(-1, 3, 5)  # any exception inside
    with pytest.raises(ModelCrashed, match=r"^llama \(sdpa\) crashed in its forward: Runtime"):
        verify_hf(model, verification_examples(VOCAB, 0))


def test_a_failure_names_the_first_layer_that_mixed_examples():
    report = run("sdpa", "naive")
    assert report["first_divergence"] == {
        "module": "model.layers.0.self_attn",
        "class": "LlamaAttention",
        "kind": "attention",
    }
    assert "model.layers.0.self_attn (LlamaAttention): attention" in report["hint"]


def test_exactpack_varlen_passes_the_same_comparisons():
    report = run("exactpack_varlen", "adapter")
    assert report["pass"] and report["model"]["attn_implementation"] == "exactpack_varlen"
    assert (report["tolerance"]["abs"], report["tolerance"]["rel"]) == (ATOL, RTOL)
    assert report["max_abs_diff"]["logits"] < 1e-12 and report["comparisons"]["model_loss"] == 1
