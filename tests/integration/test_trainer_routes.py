"""The folder ``exactpack pack`` writes (exactpack's format) trains under ``Trainer`` and
TRL's ``SFTTrainer``, one dataset item a packed row: the shards loaded with
``datasets.load_dataset("parquet")``, collated by ``collator_for(folder)``.

(``format="trl"`` rows under both trainers: ``test_trl_train.py``.)
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")

import datasets
import torch
from transformers import Trainer, TrainingArguments
from trl import SFTConfig, SFTTrainer

from exactpack.core.errors import InvalidInput
from exactpack.hf import collator_for, hf_loss
from exactpack.pipeline import pack_path
from exactpack.verify.tolerances import FLOAT32_TOLERANCE

from support.trl_helpers import examples, llama, tokenizer

#: Both trainers compute their loss in float32 (transformers' ForCausalLMLoss upcasts the
#: logits with .float(); TRL's fused LM head tiles log-probabilities in float32) on a
#: float64 model: float32's comparison tolerance (verify's, ~840 epsilons relative).
ATOL, RTOL = FLOAT32_TOLERANCE


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("routes")
    ids, labels = examples()
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps({"input_ids": i, "labels": lab}) + "\n"
                            for i, lab in zip(ids, labels, strict=True)))  # fmt: skip
    pack_path(data, root / "packed", max_length=12, vocab_size=llama().config.vocab_size)
    return root / "packed"


def _shards(folder):
    files = sorted(str(p) for p in folder.glob("shard-*.parquet"))
    return datasets.load_dataset("parquet", data_files=files, split="train",
                                 cache_dir=str(folder.parent / "hf-cache"))  # fmt: skip


@pytest.mark.parametrize("trainer_class", [Trainer, SFTTrainer])
def test_a_packed_folder_trains_one_row_an_item(folder, trainer_class, tmp_path):
    train = _shards(folder)
    model = llama()
    with torch.no_grad():  # spread the per-token losses, so that a lost target shows
        model.lm_head.weight.mul_(20.0)
    with pytest.raises(InvalidInput, match=r"pass the folder instead: collator_for"):
        collator_for(train, "sdpa", config=model.config)
    collate = collator_for(folder, "sdpa", dtype=torch.float64, config=model.config)
    seen = []

    def spy(features):
        out = collate(features)
        seen.append(tuple(out["input_ids"].shape))
        return out

    common = dict(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=1,
                  learning_rate=0.0, report_to=[], use_cpu=True, save_strategy="no",
                  remove_unused_columns=False)  # fmt: skip
    if trainer_class is SFTTrainer:
        args = SFTConfig(max_length=None, dataset_kwargs={"skip_prepare_dataset": True}, **common)
        extra = {"processing_class": tokenizer()}
    else:
        args, extra = TrainingArguments(**common), {}
    trainer = trainer_class(model=model, args=args, train_dataset=train, data_collator=spy, **extra)
    assert trainer.train().global_step == 1
    assert seen[0] == (2, 12)  # per_device_train_batch_size counts rows
    rows = [train[i] for i in range(2)]
    inputs = collate(rows)
    with torch.no_grad():
        got = trainer.compute_loss(model, inputs).item()
        logits = model(**inputs).logits
    want = hf_loss(logits, collate.batch_of(rows)).mean.item()  # float64, every target
    assert abs(got - want) <= ATOL + RTOL * max(abs(got), abs(want))
    # the control: `labels` alone (shifted by the model) lose each example's last target
    shifted = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), inputs["labels"][:, 1:].reshape(-1)
    ).item()
    assert abs(shifted - want) > 10 * (ATOL + RTOL * abs(want))
