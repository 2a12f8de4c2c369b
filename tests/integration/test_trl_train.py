"""format="trl" rows trained by TRL's SFTTrainer (padding-free) and by transformers'
Trainer with DataCollatorWithFlattening equal training on the separate examples.

Two SGD steps on a tiny float64 Llama; gradients of both steps and the parameters
after them agree within ``1e-10 + 1e-9*max(|a|,|b|)`` (float64: the attention paths
used are exact; the loss is computed in float64, see ``trl_helpers.float64_loss``).
With the trainers' own float32 loss the same runs agree to float32 rounding.
"""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("trl")

from datasets import Dataset

import exactpack.hf
import exactpack.hf.attention_impl

from support.trl_helpers import (
    examples,
    float64_loss,
    grad_recorder,
    llama,
    parameters,
    relative_gap,
    separate_training,
    tokenizer,
    training_args,
    worst_ratio,
)

pytestmark = pytest.mark.timeout(600)  # trains small models on the CPU

#: sdpa: transformers finds the examples from the restarting position_ids (no
#: attention_mask, use_cache=False under Trainer) and masks block-causally;
#: exactpack_varlen: one SDPA call per example from the collators' cu_seq_lens_q.
ATTENTION = ("sdpa", "exactpack_varlen")


def _packed(tok, kind=None, masked=True):
    """The examples packed in TRL's format; without ``masked`` every pair is supervised
    (the rows' labels are then the ids, -100 on each example's first token)."""
    ids, labels = examples()
    if not masked:
        labels = ids
    columns = {"input_ids": ids} | ({"labels": labels} if masked else {})
    ds = Dataset.from_dict(columns).with_format(kind)
    packed = exactpack.hf.pack_dataset(ds, 12, format="trl", tokenizer=tok)
    assert packed.column_names == ["input_ids", "labels", "seq_lengths"]  # labels always
    return packed, ids, labels


def _train(kind, model, packed, tok, tmp_path, loss, rows=None):
    """Two steps of TRL's SFTTrainer (padding-free) or of Trainer with
    DataCollatorWithFlattening; each step's gradients."""
    from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments
    from trl import SFTConfig, SFTTrainer

    record, grads = grad_recorder()
    common = training_args(len(packed) if rows is None else rows, str(tmp_path))
    if kind.startswith("trl"):  # "trl-skip": the rows are ready, TRL's preparation skipped
        skip = {"dataset_kwargs": {"skip_prepare_dataset": True}} if kind == "trl-skip" else {}
        args = SFTConfig(padding_free=True, max_length=None, **skip, **common)
        extra = {"processing_class": tok}
        trainer_class = SFTTrainer
    else:
        args = TrainingArguments(remove_unused_columns=False, **common)
        flatten = DataCollatorWithFlattening(return_flash_attn_kwargs=True)
        extra = {"data_collator": exactpack.hf.per_example(flatten)}
        trainer_class = Trainer
    trainer = trainer_class(
        model=model,
        args=args,
        train_dataset=packed,
        callbacks=[record],
        compute_loss_func=loss,
        **extra,
    )
    trainer.train()
    return grads


def _run(kind, attn, tmp_path, loss, data_format=None, masked=True):
    tok = tokenizer()
    packed, ids, labels = _packed(tok, data_format, masked)
    assert 1 < len(packed) < len(ids)  # rows really hold several examples
    base = llama()
    model = copy.deepcopy(base)
    model.config._attn_implementation = attn
    grads = _train(kind, model, packed, tok, tmp_path, loss)
    reference, ref_grads = separate_training(base, ids, labels, steps=2)
    assert len(grads) == 2
    return grads, ref_grads, parameters(model), parameters(reference)


@pytest.mark.parametrize("kind", ["trl", "transformers"])
@pytest.mark.parametrize(
    ("attn", "data_format"), [("sdpa", None), ("exactpack_varlen", None), ("sdpa", "torch")]
)
def test_two_steps_equal_separate_examples(kind, attn, data_format, tmp_path):
    """``data_format="torch"``: the rows reach the collators as tensors of the stored
    types (int32 ids and seq_lengths, int64 labels)."""
    grads, ref_grads, params, ref_params = _run(kind, attn, tmp_path, float64_loss, data_format)
    for step in range(2):
        assert worst_ratio(grads[step], ref_grads[step]) <= 1.0, f"step {step + 1} gradients"
    assert worst_ratio(params, ref_params) <= 1.0


@pytest.mark.parametrize("kind", ["trl", "trl-skip", "transformers"])
@pytest.mark.parametrize("data_format", [None, "torch"])
def test_rows_without_labels_train_every_pair_as_separate_examples(kind, data_format, tmp_path):
    """Every pair supervised: the rows are TRL's own (input_ids, seq_lengths) with labels;
    the collators derive the positions and train as the separate examples do, with
    TRL's preparation or without it."""
    grads, ref_grads, params, ref_params = _run(
        kind, "sdpa", tmp_path, float64_loss, data_format, masked=False
    )
    for step in range(2):
        assert worst_ratio(grads[step], ref_grads[step]) <= 1.0, f"step {step + 1} gradients"
    assert worst_ratio(params, ref_params) <= 1.0


@pytest.mark.parametrize("kind", ["trl", "transformers"])
def test_trainers_own_loss_agrees_to_float32(kind, tmp_path):
    """Without compute_loss_func the trainers compute the loss in float32 (transformers'
    ``ForCausalLMLoss`` upcasts with ``.float()``, TRL's fused head tiles in float32):
    the packed run still follows the separate examples, to float32 rounding (2**-24
    relative per logit, amplified by a few through softmax and two steps: 1e-5)."""
    grads, ref_grads, params, ref_params = _run(kind, "sdpa", tmp_path, None)
    for step in range(2):
        assert relative_gap(grads[step], ref_grads[step]) < 1e-5
    assert relative_gap(params, ref_params) < 1e-5


def test_rows_fed_whole_to_flattening_collator_join_examples(tmp_path):
    """The hazard per_example removes: DataCollatorWithFlattening takes each feature for
    one sequence, so a packed row given to it directly is trained as one long example
    (positions run on, attention crosses examples) — far from the separate examples."""
    from transformers import DataCollatorWithFlattening

    tok = tokenizer()
    packed, ids, _ = _packed(tok)
    rows = [packed[i] for i in range(len(packed))]
    direct = DataCollatorWithFlattening(return_tensors="np")(rows)
    split = exactpack.hf.per_example(DataCollatorWithFlattening(return_tensors="np"))(rows)
    assert (direct["input_ids"] == split["input_ids"]).all()
    restarts = int((split["position_ids"] == 0).sum())
    assert restarts == sum(len(r["seq_lengths"]) for r in rows) == len(ids)
    assert int((direct["position_ids"] == 0).sum()) == len(rows) < restarts


def test_sft_trainer_on_a_streamed_dataset_equals_separate_examples(tmp_path):
    """A generator of rows packed as a stream (an IterableDataset of TRL rows) trains in
    SFTTrainer exactly as the separate examples do (float64, two steps)."""
    from datasets import IterableDataset

    tok = tokenizer()
    ids, labels = examples()
    rows = [{"input_ids": i, "labels": lab} for i, lab in zip(ids, labels, strict=True)]
    packed = exactpack.hf.pack_dataset(lambda: iter(rows), 12, format="trl", tokenizer=tok)
    assert isinstance(packed, IterableDataset)
    count = sum(1 for _ in packed)
    assert 1 < count < len(ids)
    base = llama()
    model = copy.deepcopy(base)
    model.config._attn_implementation = "sdpa"
    grads = _train("trl", model, packed, tok, tmp_path, float64_loss, rows=count)
    reference, ref_grads = separate_training(base, ids, labels, steps=2)
    assert len(grads) == 2
    for step in range(2):
        assert worst_ratio(grads[step], ref_grads[step]) <= 1.0, f"step {step + 1} gradients"
    assert worst_ratio(parameters(model), parameters(reference)) <= 1.0
