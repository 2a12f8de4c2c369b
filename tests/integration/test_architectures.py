"""The architecture matrix: every case exact on its implementations, or refused up front.

Tiny random configs (``tests/support/architecture_cases.py``) of more than 25
transformers model types, float64, with examples longer than the window
wherever there is one. ``docs/transformers.md`` carries the table
``tests/gen_architectures.py`` measures from the same cases.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from exactpack import PackConfig, pack_examples
from exactpack.hf.adapter import build_inputs, cell_logits, hf_inputs
from exactpack.hf.architectures import UnsupportedArchitecture, describe
from exactpack.hf.capabilities import capability
from exactpack.verify.diagnose import example_tokens
from exactpack.verify.models import ModelCrashed, verify_hf

from support.architecture_cases import CASES, WINDOW, build, run
from support.dtype_path import observed_tolerance, unlabelled

os.environ["HF_HUB_OFFLINE"] = "1"
torch.set_num_threads(1)
EXACT = [c for c in CASES if c.refused is None]
REFUSED = [c for c in CASES if c.refused is not None]
DOCS = Path(__file__).parents[2] / "docs" / "transformers.md"
#: The model types the issue names (windowed variants are separate cases).
NAMED = {
    "llama", "qwen2", "qwen3", "phi", "phi3", "olmo2", "gpt_neox", "granite", "starcoder2",
    "smollm3", "gpt2", "opt", "falcon", "mixtral", "mistral", "gemma", "gemma2", "gemma3_text",
    "cohere2", "gpt_oss", "bloom", "lfm2", "qwen3_next", "jamba",
}  # fmt: skip


def test_the_matrix_covers_the_named_types_and_more_than_25():
    types = {c.model_type for c in CASES}
    assert types >= NAMED and len(types) >= 25
    assert sum(c.windowed for c in EXACT) >= 10  # windowed variants: single mask and per type
    assert {"convolution", "linear attention", "attention"} <= {c.refused for c in REFUSED}


@pytest.mark.parametrize(
    ("case", "attn"),
    [(c, a) for c in EXACT for a in c.attns],
    ids=lambda v: v if isinstance(v, str) else v.name,
)
def test_exact_cases_pass_with_examples_longer_than_the_window(case, attn):
    report = run(case, attn)
    assert report["pass"], (report["max_abs_diff"], report.get("hint"))
    arch = report["architecture"]
    assert arch["supported"] and arch["window_exercised"]
    if case.windowed and not case.tiny:
        assert max(report["lengths"]) == 2 * WINDOW + 3 and WINDOW in arch["windows"].values()
    # Every comparison ran: all logits, the loss, every gradient coordinate, the model's loss.
    assert report["comparisons"]["gradients"] == report["model"]["parameters"]
    assert report["failures"] == dict.fromkeys(report["failures"], 0)


@pytest.mark.parametrize("case", [c for c in EXACT if c.windowed], ids=lambda c: c.name)
def test_windowed_cases_leak_without_their_windows_and_in_the_naive_control(case):
    """The per-layer-type windowed masks are what makes them exact."""
    attn = case.attns[0]
    model = build(case, attn)
    examples = _examples(model.config)
    (batch,) = pack_examples("train", examples, examples[0].binding, PackConfig(14, 6)).batches
    kwargs = hf_inputs(batch, attn, config=model.config)
    # Exact = within the tolerance of the model's dtype path, observed (support/dtype_path.py):
    # float64 throughout keeps 1e-10 + 1e-9*max; an island (eager's float32 softmax, which
    # these cases run on; Gemma's float32 norm) takes float32's 1e-5 + 1e-4*max.
    atol, rtol = observed_tolerance(model, unlabelled(kwargs))
    with torch.no_grad():
        windowed = leak(model, batch, examples, kwargs)
        unwindowed = leak(model, batch, examples, build_inputs(batch, attn, None))
        scale = max(float(model(input_ids=torch.as_tensor(ex.inputs[None]).long()).logits.abs()
                          .max()) for ex in examples)  # fmt: skip
    # A dropped window moves logits by 0.09-0.31 (shared/DESIGN.md): far outside the bound.
    assert windowed <= atol + rtol * scale < 1e-3 < unwindowed
    naive = run(case, attn, mode="naive")
    assert not naive["pass"] and naive["first_divergence"]["kind"] == "attention"


def leak(model, batch, examples, kwargs):
    """Largest logit difference between the packed call and the examples run alone."""
    alone = [model(input_ids=torch.as_tensor(ex.inputs[None]).long()).logits[0] for ex in examples]
    kwargs = kwargs | {"labels": None, "shift_labels": None}
    if "attention_mask" in kwargs:  # the model's dtype (build_inputs defaults to float32)
        masks = kwargs["attention_mask"]
        cast = lambda m: None if m is None else m.to(torch.float64)  # noqa: E731
        masks = {k: cast(m) for k, m in masks.items()} if isinstance(masks, dict) else cast(masks)
        kwargs["attention_mask"] = masks
    logits = cell_logits(model(**kwargs).logits, batch)
    packed = logits.reshape(-1, logits.shape[-1])[example_tokens(batch, flattened=False)]
    return float((packed - torch.cat(alone)).abs().max())


def _examples(config):
    from exactpack.verify.models import verification_examples, verification_layout

    layout = verification_layout(describe(config).window, config.max_position_embeddings)
    assert layout.capacity == 14 and layout.lengths[0] == 11
    return verification_examples(config.vocab_size, 1, layout=layout)


@pytest.mark.parametrize("case", REFUSED, ids=lambda c: c.name)
def test_refused_cases_are_refused_up_front_and_really_leak(case):
    model = build(case, case.attns[0])
    arch = capability(model)
    assert arch.refusal and arch.kind == case.refused, arch
    assert capability(model.config).refusal == arch.refusal  # config alone: the same answer
    with pytest.raises(UnsupportedArchitecture, match=re.escape(case.model_type)) as err:
        verify_hf(model, _examples_for(model))
    assert "\n" not in str(err.value)
    (batch,) = pack_examples(
        "train", _examples_for(model), _examples_for(model)[0].binding, PackConfig(14, 6)
    ).batches
    with pytest.raises(UnsupportedArchitecture, match="cannot be packed exactly"):
        hf_inputs(batch, case.attns[0], config=model.config)
    # Run anyway, the refusal is not overcautious: the named layer kind mixes examples
    # (ALiBi models cannot even take a block mask: a crash, named on one line).
    try:
        report = verify_hf(model, _examples_for(model), allow_unsupported=True)
    except ModelCrashed as crash:
        assert case.refused == "attention" and "crashed in its forward" in str(crash)
        return
    assert not report["pass"] and not report["architecture"]["supported"]
    assert report["max_abs_diff"]["logits"] > 1e-6  # a real leak, not rounding
    found = report["first_divergence"]
    if case.refused == "attention":
        assert found["kind"] == "attention", found
    if case.refused == "convolution":  # the named conv, or the block around it (conv is (B, C, L))
        assert (
            found["module"].removeprefix("model.") in arch.refusal or found["kind"] == "convolution"
        )


def _examples_for(model):
    from exactpack.verify.models import verification_examples

    config = model.config.get_text_config()
    return verification_examples(
        config.vocab_size, 0, getattr(config, "max_position_embeddings", None)
    )


def test_exact_cases_pass_in_float32_on_sdpa():
    """float32 models get float32's tolerance and pass the same comparisons."""
    for case in [c for c in EXACT if "sdpa" in c.attns]:
        report = run(case, "sdpa", dtype=torch.float32)
        assert report["pass"], (case.name, report["max_abs_diff"])
        assert report["tolerance"]["abs"] == 1e-5


def test_flex_attention_forward_on_cpu_takes_the_windowed_block_masks():
    """transformers' flex path compiles FlexAttention (float32, forward only on CPU).

    In a fresh process: a failed compile would leave the compiled wrapper on the
    unfused path for the rest of this one (see exactpack.nn.flex).
    """
    script = (
        "import sys, torch; sys.path.insert(0, 'tests'); torch.set_num_threads(1)\n"
        "from support.architecture_cases import CASES, run\n"
        "case = next(c for c in CASES if c.model_type == 'gemma3_text')\n"
        "r = run(case, 'flex_attention', dtype=torch.float32, gradients=False)\n"
        "print(r['pass'], r['architecture']['layer_types'], r['max_abs_diff']['logits'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("True ") and "sliding_attention" in last and "full_attention" in last


def test_docs_table_lists_every_case_with_its_verdict():
    text = DOCS.read_text()
    for case in CASES:
        row = next(
            (line for line in text.splitlines() if line.startswith(f"| {case.name} |")), None
        )
        assert row is not None, f"{case.name} missing: run tests/gen_architectures.py"
        assert ("refused" in row) == (case.refused is not None), row


# The named cases, one by one (tiny configs; the capability needs no weights).


def _tiny(model_type, **options):
    from support.architecture_tiny import tiny_config

    return tiny_config(model_type, **options)


def _batch(lengths, capacity, vocab=266):
    from exactpack.verify.models import VerifyCase, verification_examples

    examples = verification_examples(vocab, 0, layout=VerifyCase(tuple(lengths), capacity))
    (batch,) = pack_examples(
        "train", examples, examples[0].binding, PackConfig(capacity, len(lengths))
    ).batches
    return batch


def test_a_window_the_model_never_applies_is_not_applied():
    """moshi has config.sliding_window but its code never windows: plain block masks."""
    config = _tiny("moshi")
    assert config.sliding_window == WINDOW and describe(config).window == WINDOW
    assert capability(config).window is None
    assert capability(_tiny("mistral")).window == WINDOW  # a model that does apply it


@pytest.mark.parametrize("attn", ["sdpa", "exactpack_varlen"])
def test_a_bidirectional_bert_is_refused_for_causal_packing(attn):
    config = _tiny("bert", is_decoder=False)
    with pytest.raises(UnsupportedArchitecture, match=r"bidirectional.*is_decoder=True"):
        hf_inputs(_batch([5, 3], 12), attn, config=config)
    capability(_tiny("bert")).check(attn)  # is_decoder=True: causal, accepted


@pytest.mark.parametrize(
    "model_type", ["big_bird", "megatron-bert", "rembert", "falcon", "gpt_neo"]
)
def test_exactpack_varlen_is_refused_on_models_that_never_call_the_interface(model_type):
    arch = capability(_tiny(model_type))
    arch.check("sdpa" if model_type not in ("gpt_neo",) else "eager")
    with pytest.raises(UnsupportedArchitecture, match=r"never calls transformers' Attention") as e:
        arch.check("exactpack_varlen")
    assert str(e.value).startswith(
        f"{model_type} cannot run attn_implementation='exactpack_varlen'"
    )


def test_falcon_on_exactpack_varlen_is_refused_before_loading_not_a_keyerror(tmp_path):
    from exactpack.verify.models import load_model

    _tiny("falcon").save_pretrained(tmp_path)
    with pytest.raises(UnsupportedArchitecture, match=r"falcon cannot run .*AttentionInterface"):
        load_model(config=tmp_path, attn_implementation="exactpack_varlen")


@pytest.mark.parametrize("model_type", ["nemotron", "stablelm"])
def test_layers_that_drop_the_attention_kwargs_are_named_not_blamed_on_the_user(model_type):
    with pytest.raises(UnsupportedArchitecture, match="without its attention kwargs") as err:
        capability(_tiny(model_type)).check("exactpack_varlen")
    assert "hf_inputs" not in str(err.value)  # what verify already did is not the fix


def test_the_roberta_family_gets_positions_from_padding_idx_plus_one():
    config = _tiny("roberta")
    arch = capability(config)
    assert (arch.positions, arch.position_offset) == ("offset", config.pad_token_id + 1)
    batch = _batch([5, 3], 12)
    got = hf_inputs(batch, "sdpa", config=config)["position_ids"]
    assert torch.equal(got, torch.as_tensor(batch.position_ids()) + config.pad_token_id + 1)


@pytest.mark.parametrize(("model_type", "words"), [("bart", "LearnedPositional"), ("cpmant", "")])
def test_decoders_that_count_columns_are_refused_for_their_positions(model_type, words):
    arch = capability(_tiny(model_type))
    assert arch.positions == "columns" and arch.kind == "positions"
    assert "takes no position_ids" in arch.refusal and words in arch.refusal


def test_longrope_is_exact_only_while_no_example_passes_the_original_context():
    rope = {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4}
    config = _tiny(
        "phi3",
        original_max_position_embeddings=8,
        rope_parameters=rope | {"original_max_position_embeddings": 8},
    )
    assert [c.limit for c in capability(config).conditions] == [8]
    hf_inputs(_batch([8, 3], 12), "sdpa", config=config)  # within: accepted
    with pytest.raises(UnsupportedArchitecture, match=r"every example <= 8 pairs.*longrope") as e:
        hf_inputs(_batch([9, 3], 12), "sdpa", config=config)
    # a Python caller's words: its keyword, not a flag
    assert str(e.value).endswith("— lower max_length= to 8 or pre-split the longer examples")


def test_llama4_nope_temperature_is_exact_only_for_rows_shorter_than_floor_scale():
    config = _tiny("llama4_text", attention_chunk_size=4, no_rope_layers=[1, 0], floor_scale=13)
    hf_inputs(_batch([5, 3], 12), "sdpa", config=config)
    with pytest.raises(UnsupportedArchitecture, match="rows <= 12 columns") as e:
        hf_inputs(_batch([5, 3], 14), "sdpa", config=config)
    assert str(e.value).endswith("— lower max_length= to 12")
    with pytest.raises(UnsupportedArchitecture, match="chunked_attention"):
        capability(config).check("exactpack_varlen")


def test_indexed_attention_is_exact_only_while_examples_fit_index_topk():
    config = _tiny("deepseek_v32", index_topk=6)
    hf_inputs(_batch([6, 3], 12), "sdpa", config=config)
    with pytest.raises(UnsupportedArchitecture, match="every example <= 6 pairs"):
        hf_inputs(_batch([7, 3], 12), "sdpa", config=config)


def test_falcon_alibi_takes_no_block_mask_and_stops_at_256_columns():
    config = _tiny("falcon", alibi=True)
    kwargs = hf_inputs(_batch([5, 3], 12), "eager", config=config)
    assert "attention_mask" not in kwargs  # transformers finds the examples from position_ids
    with pytest.raises(UnsupportedArchitecture, match="rows <= 256 columns"):
        hf_inputs(_batch([200, 50], 257), "eager", config=config)


def test_lfm2_restarts_its_conv_layers_and_has_none_without_them():
    assert capability(_tiny("lfm2", layer_types=["full_attention"] * 2)).mixers == ()
    arch = capability(_tiny("lfm2", layer_types=["conv", "full_attention"])).check("sdpa")
    assert arch.mixers == ("Lfm2ShortConv",) and "restarts its Lfm2ShortConv" in arch.verdict


def test_recurrences_and_convolutions_are_refused_for_the_true_reason():
    xlstm = capability(_tiny("xlstm"))
    assert xlstm.kind == "linear attention" and "xLSTMBlock" in xlstm.refusal
    gemma = capability(_tiny("recurrent_gemma"))  # its recurrence restarts; the conv leaks
    assert gemma.kind == "convolution" and "conv_1d (Conv1d)" in gemma.refusal


def test_verify_differentiates_only_the_models_own_trainable_set():
    case = next(c for c in CASES if c.model_type == "roformer")
    report = run(case, "eager")
    model = build(case, "eager")
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    assert frozen > 0 and report["pass"]
    assert report["comparisons"]["gradients"] == sum(p.numel() for p in model.parameters()) - frozen


@pytest.mark.parametrize(("model_type", "op"), [("laguna", "softplus"), ("minimax_m2", "sigmoid")])
def test_float32_islands_outside_attention_get_their_tolerance_and_name(model_type, op):
    case = next(c for c in CASES if c.model_type == model_type)
    report = run(case, "sdpa")
    assert report["pass"], report["max_abs_diff"]
    islands = report["tolerance"]["islands"]
    assert any(f"{op} (float32)" in ops for ops in islands.values()), islands


def test_verify_of_exactpack_varlen_is_held_against_the_models_own_attention(monkeypatch):
    """The old vacuous PASS: varlen applying moshi's unused window passed against itself."""
    import dataclasses

    import exactpack.hf.capabilities as capabilities

    case = next(c for c in CASES if c.model_type == "moshi")
    model = build(case, "exactpack_varlen")
    arch = capability(model)
    assert arch.window is None
    report = run(case, "exactpack_varlen")
    assert report["pass"] and report["reference"] == "sdpa"
    wrong = dataclasses.replace(arch, window=WINDOW)  # what the config alone would say
    monkeypatch.setattr(capabilities, "capability_once", lambda config: wrong)
    report = run(case, "exactpack_varlen")
    assert not report["pass"] and report["max_abs_diff"]["logits"] > 1e-3


def test_the_sweep_script_reports_each_implementation_of_a_type():
    """scripts/sweep_architectures.py, one type: PASS / n/a / refused, and its table row."""
    sweep = _sweep()
    result = sweep.sweep_type("gpt_neo")
    cells = {attn: cell["status"] for attn, cell in result["cells"].items()}
    assert cells == {"eager": "PASS", "sdpa": "n/a", "exactpack_varlen": "refused"}
    assert result["cells"]["eager"]["logits"] < 1e-6 and result["verdict"] == "exact"
    row = sweep.table({"gpt_neo": result}).splitlines()[-1]
    assert row.startswith("| `gpt_neo` | exact; ") and "never calls" in row
    assert sweep.counts({"gpt_neo": result}) == {"PASS": 1, "n/a": 1, "refused": 1}


@pytest.mark.parametrize(
    ("model_type", "options", "why"),
    [
        ("openai-gpt", {}, r"\(OpenAIGPTModel\) builds its attention from a 2-D padding mask"),
        ("xlm", {"causal": True}, r"\(XLMModel\) builds its attention from a 2-D padding mask"),
        ("xlnet", {"attn_type": "uni"}, r"XLNetModel\) builds its attention from a 2-D padding"),
        ("xlm", {}, "bidirectional"),  # causal=False, its default
        ("xlnet", {}, "bidirectional"),  # attn_type="bi", its default
    ],
)
def test_models_that_cannot_take_a_block_mask_are_refused_not_crashed(model_type, options, why):
    with pytest.raises(UnsupportedArchitecture, match=why):
        capability(_tiny(model_type, **options)).check("eager")


def test_assistants_reading_another_models_keys_are_refused():
    arch = capability(_tiny("gemma4_assistant"))
    assert "num_kv_shared_layers = num_hidden_layers" in arch.refusal


def test_bidirectional_image_tokens_leave_text_causal():
    assert _tiny("gemma4_unified").get_text_config().use_bidirectional_attention == "vision"
    capability(_tiny("gemma4_unified")).check("exactpack_varlen")


def test_blt_is_refused_for_its_byte_hashes_across_the_row():
    assert "byte n-gram hash embeddings" in capability(_tiny("blt")).refusal


def test_musicgen_is_judged_on_the_decoder_its_causal_lm_takes():
    from exactpack.hf.capabilities import causal_lm

    config = _tiny("musicgen")
    assert type(config).__name__ == "MusicgenDecoderConfig"
    assert causal_lm(config).__self__.__name__ == "MusicgenForCausalLM"
    arch = capability(config)
    assert arch.positions == "columns" and "MusicgenSinusoidalPositionalEmbedding" in arch.refusal


def test_padding_cells_avoid_an_embedding_row_the_model_roots():
    """gemma3n's AltUp takes mean(h ** 2) ** 0.5: on its zero padding row, NaN gradients."""
    config = _tiny("gemma3n_text")
    assert capability(config).zero_pad == config.pad_token_id == 0
    assert capability(_tiny("llama")).zero_pad is None
    batch = _batch([5, 3], 12)
    ids = hf_inputs(batch, "sdpa", config=config, pad_token_id=0)["input_ids"]
    assert (ids[torch.as_tensor(batch.position_ids()) < 0] != 0).all()


def test_a_model_whose_own_loss_crashes_is_own_loss_not_a_crash():
    """git cuts its image columns off the logits before its loss: text alone leaves none."""
    from transformers import AutoModelForCausalLM

    from exactpack.verify.models import verification_examples

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        _tiny("git"), attn_implementation="eager", dtype=torch.float64
    ).eval()
    report = verify_hf(model, verification_examples(266, 0, 64))
    assert not report["pass"] and not report["mixed"] and report["max_abs_diff"]["logits"] < 1e-12
    assert "hf_loss" in report["hint"]


def _sweep():
    import importlib.util

    path = Path(__file__).parents[2] / "scripts" / "sweep_architectures.py"
    spec = importlib.util.spec_from_file_location("sweep_architectures", path)
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    return sweep


def test_the_sweep_verifies_in_float32_a_model_that_cannot_run_float64():
    """xglm's eager forward puts finfo(float64).min into a float32 tensor (transformers)."""
    cell = _sweep().run_one("xglm", "eager", _tiny("xglm"))
    assert cell["status"] == "PASS" and cell["dtype"] == "float32", cell
    assert "overflow" in cell["float64"]


def test_every_causal_lm_type_has_a_tiny_config():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from support.architecture_tiny import tiny_config

    failed = {}
    for model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        try:
            tiny_config(model_type)
        except Exception as err:  # reported, every type at once
            failed[model_type] = f"{type(err).__name__}: {err}"[:200]
    assert not failed, failed


def test_reformer_is_refused_for_attention_by_hash_buckets_and_column_chunks():
    refusal = capability(_tiny("reformer")).refusal
    assert "LSH attention" in refusal and "chunks of the row's columns" in refusal
