"""Collators that cannot be misused: every output fed to a transformers model gives the exact loss.

The fixture (A, B | C, one row at capacity 12) through every collator exactpack
has, into a tiny float64 Llama: ``model(**features).loss`` must equal the
token-weighted loss of the three examples run alone, derived here from the
model itself. A control rebuilds the 0.2 output (pre-shifted targets
under ``labels``) and shows the test would catch it.
"""

import ast
import os
import pathlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers
from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM, MistralConfig
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask, sdpa_mask
from transformers.modeling_flash_attention_utils import FlashAttentionKwargs
from transformers.utils import TransformersKwargs

from exactpack import InvalidInput, PackConfig, Split, SplitMismatch, pack_examples
from exactpack.hf.adapter import hf_inputs
from exactpack.hf.attention_impl import exactpack_attention
from exactpack.hf.collator import hf_collator
from exactpack.hf.kinds import KINDS, attention_kind
from exactpack.training.packed_data import PackedCollator
from exactpack.verify.fixture import fixture_batch, fixture_examples
from exactpack.verify.tolerances import FLOAT32_TOLERANCE

os.environ["HF_HUB_OFFLINE"] = "1"
torch.set_num_threads(1)
CONFIG = pathlib.Path(__file__).parents[1] / "data" / "tiny_llama.json"
# transformers computes its loss in float32 from float64 logits: float32 tolerance.
ATOL, RTOL = FLOAT32_TOLERANCE


def llama_config():
    return AutoConfig.from_pretrained(str(CONFIG), local_files_only=True)


def model_of(config, attn: str, seed: int = 0):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(
        config, attn_implementation=attn, dtype=torch.float64
    ).eval()


def close(a, b, atol=ATOL, rtol=RTOL):
    a, b = float(a), float(b)
    return abs(a - b) <= atol + rtol * max(abs(a), abs(b))


def fixture_at(capacity: int):
    examples = fixture_examples()
    config = PackConfig(capacity, 6)
    return examples, pack_examples("train", examples, examples[0].binding, config).batches[0]


def separate_loss(model, examples) -> float:
    """Σ NLL over every target of every example run alone / their count."""
    total, count = 0.0, 0
    with torch.no_grad():
        for ex in examples:
            logits = model(input_ids=torch.as_tensor(ex.inputs[None]).long()).logits[0]
            target = torch.as_tensor(ex.targets).long()
            total += float(F.cross_entropy(logits.float(), target, reduction="sum"))
            count += int(target.numel())
    return total / count


@pytest.fixture
def custom_implementations():
    """A custom sdpa-kind and a custom flash-kind implementation, registered as users do."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def my_sdpa(*args, **kwargs):
        return sdpa_attention_forward(*args, **kwargs)

    def my_varlen(*args, **kwargs):
        return exactpack_attention(*args, **kwargs)

    def unknown(*args, **kwargs):
        return sdpa_attention_forward(*args, **kwargs)

    AttentionInterface.register("exactpack_test_sdpa", my_sdpa)
    AttentionMaskInterface.register("exactpack_test_sdpa", sdpa_mask)
    AttentionInterface.register("exactpack_test_varlen", my_varlen)
    AttentionMaskInterface.register("exactpack_test_varlen", flash_attention_mask)
    AttentionInterface.register("exactpack_test_unknown", unknown)
    yield
    for name in ("exactpack_test_sdpa", "exactpack_test_varlen", "exactpack_test_unknown"):
        AttentionInterface._global_mapping.pop(name, None)
        AttentionMaskInterface._global_mapping.pop(name, None)


#: (model attention, how the features are built)
OUTPUTS = [
    ("exactpack_varlen", "packed_collator_flatten"),
    ("sdpa", "packed_collator_flatten"),
    ("eager", "packed_collator_flatten"),
    ("exactpack_test_varlen", "packed_collator_flatten"),
    ("sdpa", "hf_collator"),
    ("eager", "hf_collator"),
    ("exactpack_varlen", "hf_collator"),
    ("exactpack_test_sdpa", "hf_collator"),
    ("exactpack_test_varlen", "hf_collator"),
    ("sdpa", "hf_inputs"),
    ("exactpack_varlen", "hf_inputs"),
]


def features_of(how, batch, attn, config):
    if how == "packed_collator_flatten":
        return PackedCollator(flatten=True)(batch)
    if how == "hf_collator":
        return hf_collator(attn, dtype=torch.float64, config=config)([batch])
    return hf_inputs(batch, attn, config=config, dtype=torch.float64)


@pytest.mark.parametrize("capacity", [12, 6])
@pytest.mark.parametrize(("attn", "how"), OUTPUTS)
def test_model_loss_of_every_collator_output_is_the_separate_examples_loss(
    custom_implementations, capacity, attn, how
):
    examples, batch = fixture_at(capacity)
    config = llama_config()
    model = model_of(config, attn)
    want = separate_loss(model, examples)
    features = features_of(how, batch, attn, config)
    with torch.no_grad():
        got = model(**features).loss
    assert close(got, want), (float(got), want)


def test_the_old_pre_shifted_labels_would_be_caught():
    """Control: 0.2 put pre-shifted targets under ``labels``; the model shifted them again."""
    examples, batch = fixture_at(12)
    model = model_of(llama_config(), "exactpack_varlen")
    want = separate_loss(model, examples)
    features = PackedCollator(flatten=True)(batch)
    old = dict(features, labels=features["shift_labels"])
    del old["shift_labels"]
    with torch.no_grad():
        assert not close(model(**old).loss, want, 1e-3, 1e-3)
        hf_keys = ("input_ids", "labels", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k")
        only_hf = {k: old[k] for k in (*hf_keys, "max_length_q", "max_length_k")}
        assert not close(model(**only_hf).loss, want, 1e-3, 1e-3)
        # labels alone (transformers' meaning) lose each example's last target: no input.
        alone = dict(features)
        del alone["shift_labels"]
        assert not close(model(**alone).loss, want, 1e-3, 1e-3)


def transformers_kwarg_names() -> set[str]:
    """Every argument name of a transformers ``forward``, loss function or kwargs TypedDict."""
    names = set()
    for typed in (TransformersKwargs, FlashAttentionKwargs):
        names |= typed.__required_keys__ | typed.__optional_keys__
    root = pathlib.Path(transformers.__file__).parent
    for path in sorted(root.glob("models/*/modeling_*.py")) + sorted(root.glob("loss/*.py")):
        loss = path.parent.name == "loss"  # the loss functions read the model's **kwargs
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and (loss or node.name == "forward"):
                names |= {a.arg for a in node.args.args + node.args.kwonlyargs}
    return names - {"self"}


def check_same_meaning(f: dict) -> None:
    """The transformers-named keys of ``f`` mean what transformers means by them."""
    ids, labels, shift = f["input_ids"], f["labels"], f["shift_labels"]
    assert labels.shape == ids.shape == shift.shape
    # labels: unshifted; a label is the token at its own cell, or -100
    kept = labels != -100
    assert torch.equal(labels[kept], ids[kept])
    # shift_labels: the next cell's label wherever that label is kept
    assert torch.equal(shift[..., :-1][kept[..., 1:]], labels[..., 1:][kept[..., 1:]])
    pos = f["position_ids"]
    if "cu_seq_lens_q" in f and ids.shape[0] == 1 and "attention_mask" not in f:
        cu = f["cu_seq_lens_q"]
        assert cu.dtype == torch.int32 and torch.equal(cu, f["cu_seq_lens_k"])
        lengths = cu.diff().long()
        assert f["max_length_q"] == f["max_length_k"] == int(lengths.max())
        local = torch.cat([torch.arange(int(n)) for n in lengths])
        assert torch.equal(pos[0], local)  # positions restart at every cu_seq_lens boundary
        assert bool((labels[0, cu[:-1].long()] == -100).all())  # nothing predicts a first token
        seq = torch.repeat_interleave(torch.arange(lengths.numel(), dtype=torch.int32), lengths)
        assert f["seq_idx"].dtype == torch.int32 and torch.equal(f["seq_idx"][0], seq)
    if "num_items_in_batch" in f:
        assert f["num_items_in_batch"] == int((shift != -100).sum())
    if "use_cache" in f:
        assert f["use_cache"] is False
    mask = f.get("attention_mask")
    if isinstance(mask, torch.Tensor):
        assert mask.ndim == 4  # never a 2-D mask of segment ids (axolotl's encoding)


def test_no_output_key_collides_with_a_transformers_argument_of_another_meaning():
    names = transformers_kwarg_names()
    assert {"labels", "shift_labels", "seq_idx", "cu_seq_lens_q", "position_ids"} <= names
    checked = {
        "input_ids",
        "labels",
        "shift_labels",
        "position_ids",
        "attention_mask",
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
        "seq_idx",
        "num_items_in_batch",
        "use_cache",
    }
    batch = fixture_batch()
    config = llama_config()
    outputs = [
        PackedCollator()(batch),
        PackedCollator(flatten=True)(batch),
        PackedCollator(permission_mask=True)(batch),
        *(
            hf_collator(attn, config=config)([batch])
            for attn in ("sdpa", "eager", "exactpack_varlen")
        ),
        hf_inputs(batch, "flash_attention_2", config=config),
        hf_inputs(batch, "kernels-community/flash-attn2", config=config),
    ]
    for f in outputs:
        shared = set(f) & names
        assert shared <= checked, shared - checked  # a new shared name needs its meaning checked
        own = set(f) - names
        assert own <= {"segment_ids", "valid_index", "num_eligible", "permission_mask"}, own
        check_same_meaning(f)


def test_any_registered_implementation_is_accepted_by_its_kind(custom_implementations, monkeypatch):
    import transformers.integrations.hub_kernels as hub

    def no_download(*args, **kwargs):
        raise AssertionError("classifying an attention implementation must not load a kernel")

    monkeypatch.setattr(hub, "get_kernel", no_download)
    assert attention_kind("exactpack_test_sdpa") == "sdpa"
    assert attention_kind("exactpack_test_varlen") == "flash"
    assert attention_kind("kernels-community/flash-attn2") == "flash"
    assert attention_kind("kernels-community/vllm-flash-attn3@main") == "flash"
    assert attention_kind("flash_attention_3") == "flash"
    collate = hf_collator("kernels-community/flash-attn2", config=llama_config())
    f = collate([fixture_batch()])
    assert "attention_mask" not in f and f["cu_seq_lens_q"].tolist() == [0, 3, 5, 9]
    # A registered function with no mask function: its kind must be stated.
    with pytest.raises(InvalidInput, match=r"'exactpack_test_unknown'.*no mask function.*flash"):
        hf_collator("exactpack_test_unknown", config=llama_config())
    collate = hf_collator("exactpack_test_unknown", kind="sdpa", config=llama_config())
    assert collate.model_inputs.kind == "sdpa"
    with pytest.raises(InvalidInput, match=r"of kind 'flash'.*not kind='sdpa'"):
        attention_kind("kernels-community/flash-attn2", "sdpa")
    for name in (
        "kernels-community/not-a-flash-kernel",
        "exactpack_unregistered_attention",
        "paged|sdpa",
    ):
        with pytest.raises(InvalidInput, match=rf"{name}.*{', '.join(KINDS[2:])}"):
            hf_collator(name, config=llama_config())


def tiny_mistral(window: int):
    c = llama_config().to_dict()
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")
    keep += ("num_attention_heads", "num_key_value_heads", "head_dim", "initializer_range")
    return MistralConfig(**{k: c[k] for k in keep}, sliding_window=window, pad_token_id=2)


@pytest.mark.parametrize("attn", ["sdpa", "eager", "exactpack_varlen"])
def test_a_windowed_model_through_hf_collator_equals_separate_examples(attn):
    examples, batch = fixture_at(12)
    config = tiny_mistral(window=2)
    model = model_of(config, attn)
    want = separate_loss(model, examples)
    with torch.no_grad():
        got = model(**hf_collator(attn, dtype=torch.float64, config=config)([batch])).loss
        assert close(got, want)
        if attn != "exactpack_varlen":
            # Control: what a config-less collator would build — unwindowed masks.
            unwindowed = hf_inputs(batch, attn, config=llama_config(), dtype=torch.float64)
            assert not close(model(**unwindowed).loss, want, 1e-3, 1e-3)
    with pytest.raises(InvalidInput, match=r"sliding windows.*config=model\.config"):
        hf_collator(attn)


def test_a_training_collator_refuses_validation_rows():
    batch = fixture_batch()
    import dataclasses

    held_out = dataclasses.replace(batch, partition=Split.VALIDATION)
    config = llama_config()
    collate = hf_collator("exactpack_varlen", config=config)
    assert collate([batch])["input_ids"].shape == (1, 9)
    with pytest.raises(SplitMismatch, match="expects train rows but got a validation"):
        collate([held_out])
    assert hf_collator("exactpack_varlen", split="validation", config=config)([held_out])[
        "seq_idx"
    ].shape == (
        1,
        9,
    )
    assert np.array_equal(
        hf_collator("exactpack_varlen", split=None, config=config)([held_out])["input_ids"][
            0
        ].numpy(),
        batch.inputs[batch.input_valid],
    )
