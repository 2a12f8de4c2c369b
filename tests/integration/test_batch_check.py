"""The first-batch check: a collator that ignores ``seq_lengths`` is refused before step 1.

``format="trl"`` rows given to TRL's ``SFTTrainer`` without ``padding_free=True``, or to
``DataCollatorWithFlattening`` without ``per_example``, would train each row as one
sequence. ``import exactpack.hf`` puts :class:`CheckBatches` in every ``Trainer``'s
callbacks, so those runs stop at the first batch, naming the missing flag, and the
right ones train (``test_trl_train.py`` runs those with the check installed).
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

import torch
from datasets import Dataset
from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments
from trl import SFTConfig, SFTTrainer
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

import exactpack.hf
from exactpack.core.errors import InvalidInput
from exactpack.hf import CheckBatches, check_batch, per_example

from support.trl_helpers import examples, llama, parameters, tokenizer, training_args

A, B, C = [0, 99, 100, 1], [0, 101, 1], [0, 102, 103, 104, 1]


def _rows():
    ds = Dataset.from_dict({"input_ids": [A, B, C]})
    return exactpack.hf.pack_dataset(ds, 7, "next-fit", format="trl").to_list()


def test_each_collator_is_checked_against_the_rows_seq_lengths():
    rows = _rows()  # [A + B] (seq_lengths [4, 3]), [C]
    ok = (
        DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True),
        per_example(DataCollatorWithFlattening()),
        per_example(DataCollatorForLanguageModeling(pad_token_id=0)),  # a row per example
    )
    for collate in ok:
        check_batch(collate(rows), rows)  # one example per sequence: no error
    padded = DataCollatorForLanguageModeling(pad_token_id=0)(rows)
    with pytest.raises(InvalidInput, match=r"row 0 joins 2 examples .*padding_free=True"):
        check_batch(padded, rows)
    flat = DataCollatorWithFlattening()(rows)
    assert flat["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4]
    with pytest.raises(InvalidInput, match=r"row 0 joins 1 of its 3 examples .*per_example"):
        check_batch(flat, rows)
    # features without seq_lengths are not packed rows: nothing to check
    check_batch(DataCollatorWithFlattening()([{"input_ids": A}]), [{"input_ids": A}])


def test_a_flattened_batch_must_restart_and_mask_at_each_example():
    rows = _rows()
    good = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(rows)
    assert good["cu_seq_lens_q"].tolist() == [0, 4, 7, 12]
    bad = dict(good, cu_seq_lens_q=torch.tensor([0, 7, 12], dtype=torch.int32))
    with pytest.raises(InvalidInput, match="cu_seq_lens_q"):
        check_batch(bad, rows)
    labels = good["labels"].clone()
    labels[0, 4] = 0  # B's first token: the pair A's EOS -> B's BOS
    with pytest.raises(InvalidInput, match="first token"):
        check_batch(dict(good, labels=labels), rows)
    no_positions = {k: v for k, v in good.items() if k != "position_ids"}
    with pytest.raises(InvalidInput, match="per_example"):
        check_batch(no_positions, rows)


def _trainer(kind, tmp_path, **extra):
    """A two-step run on tiny TRL-format rows: SFTTrainer or Trainer."""
    ids, _ = examples()
    tok = tokenizer()
    packed = exactpack.hf.pack_dataset(
        Dataset.from_dict({"input_ids": ids}), 12, format="trl", tokenizer=tok
    )
    common = training_args(len(packed), str(tmp_path))
    if kind == "sft":
        args = SFTConfig(
            max_length=None, dataset_kwargs={"skip_prepare_dataset": True}, **extra, **common
        )
        return SFTTrainer(model=llama(), args=args, train_dataset=packed, processing_class=tok)
    args = TrainingArguments(**extra, **common)
    return Trainer(model=llama(), args=args, train_dataset=packed, data_collator=kind)


@pytest.mark.parametrize(
    ("kind", "extra", "match"),
    [
        ("sft", {}, "padding_free=True"),
        (DataCollatorWithFlattening(), {"remove_unused_columns": False}, "per_example"),
        (per_example(DataCollatorWithFlattening()), {}, "remove_unused_columns=False"),
    ],
    ids=["sft-without-padding_free", "flattening-without-per_example", "columns-removed"],
)
def test_a_trainer_that_would_join_examples_stops_before_step_1(kind, extra, match, tmp_path):
    trainer = _trainer(kind, tmp_path, **extra)
    assert any(isinstance(cb, CheckBatches) for cb in trainer.callback_handler.callbacks)
    before = {n: p.clone() for n, p in parameters(trainer.model).items()}
    with pytest.raises(InvalidInput, match=match):
        trainer.train()
    assert trainer.state.global_step == 0
    assert all(torch.equal(before[n], p) for n, p in parameters(trainer.model).items())


def test_a_folder_loaded_with_load_trl_is_known_after_its_seq_lengths_are_removed(tmp_path):
    from torch.utils.data import DataLoader

    from exactpack.pipeline import pack_path

    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"input_ids": {ids}}}\n' for ids in (A, B, C)))
    pack_path(data, tmp_path / "out", max_length=7, vocab_size=266, format="trl")
    rows = exactpack.hf.load_trl(tmp_path / "out", cache_dir=str(tmp_path / "cache"))
    loader = DataLoader(rows.remove_columns(["seq_lengths"]), collate_fn=list)
    with pytest.raises(InvalidInput, match="remove_unused_columns=False"):
        CheckBatches().on_train_begin(None, None, None, train_dataloader=loader)
    kept = DataLoader(rows, batch_size=2, collate_fn=DataCollatorWithFlattening())
    CheckBatches().on_train_begin(None, None, None, train_dataloader=kept)
    with pytest.raises(InvalidInput, match="per_example"):
        next(iter(kept))  # the wrapped collate_fn checks each batch
