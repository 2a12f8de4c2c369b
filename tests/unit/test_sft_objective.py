"""TRL's objective by default, both objectives on request: every switch against TRL 1.16.

For each kind of SFT row TRL reads (``messages``, text and conversational
prompt-completion, token ids with ``completion_mask`` / ``assistant_masks``)
and every combination of ``SFTConfig``'s ``assistant_only_loss`` and
``completion_only_loss``, exactpack's reading (``Objective``, the same names
and defaults) gives TRL's own ``SFTTrainer`` preparation: the same tokens
and the same supervised targets, or a refusal where TRL refuses.
"""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest

from exactpack.core.errors import InvalidInput
from exactpack.core.supervision import Objective
from exactpack.io.readers import read_documents
from exactpack.io.tokenizers import load_tokenizer
from exactpack.pipeline.options import PackOptions

from support.sft_helpers import (
    CHATS,
    COMPLETIONS,
    PLAIN_TEMPLATE,
    PROMPTS,
    chat_tokenizer,
    trl_prepared,
)

datasets = pytest.importorskip("datasets")
pytest.importorskip("trl")

SWITCHES = list(itertools.product([False, True], [None, True, False]))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {
        "marked": chat_tokenizer(tmp_path_factory.mktemp("marked")),
        "plain": chat_tokenizer(tmp_path_factory.mktemp("plain"), template=PLAIN_TEMPLATE),
    }


def _rows(kind: str, folder) -> dict[str, list]:
    if kind == "messages":
        return {"messages": CHATS}
    if kind == "text prompt-completion":
        return {"prompt": PROMPTS, "completion": COMPLETIONS}
    if kind == "chat prompt-completion":
        return {"prompt": [c[:-1] for c in CHATS], "completion": [c[-1:] for c in CHATS]}
    backend = load_tokenizer(folder).backend
    ids = [backend(p + c)["input_ids"] for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]
    return {  # a fixed pattern per row: the masks differ from each other and from all-ones
        "input_ids": ids,
        "completion_mask": [[int(i >= 2) for i in range(len(x))] for x in ids],
        "assistant_masks": [[int(i % 3 != 1) for i in range(len(x))] for x in ids],
    }


def _flags(labels: list[list[int]]) -> list[list[bool]]:
    return [[x != -100 for x in row[1:]] for row in labels]


def _reading(docs) -> tuple[list[list[int]], list[list[bool]]]:
    tokens, flags = [], []
    for i in range(len(docs)):
        a, b = int(docs.offsets[i]), int(docs.offsets[i + 1])
        tokens.append(docs.tokens[a:b].tolist())
        flags.append(docs.loss_mask[a - i : b - i - 1].tolist())
    return tokens, flags


#: Every kind with the marked template; the kinds a template renders also without markers.
CASES = [
    ("messages", "marked"),
    ("text prompt-completion", "marked"),
    ("chat prompt-completion", "marked"),
    ("token ids + masks", "marked"),
    ("messages", "plain"),
    ("chat prompt-completion", "plain"),
]


@pytest.mark.parametrize(("kind", "template"), CASES)
def test_every_switch_reads_as_trl_prepares(folders, tmp_path, kind, template):
    folder = folders[template]
    ds = datasets.Dataset.from_dict(_rows(kind, folders["marked"]))
    tokenizer = load_tokenizer(folder) if kind != "token ids + masks" else None
    compared = 0
    for assistant, completion in SWITCHES:
        config = {"assistant_only_loss": assistant, "completion_only_loss": completion}
        try:
            ref = trl_prepared(ds, folder, tmp_path, **config)
        except (ValueError, RuntimeError) as err:  # TRL refuses: so does exactpack
            with pytest.raises(InvalidInput):
                read_documents(ds, tokenizer=tokenizer, objective=Objective(**config))
            assert assistant, f"TRL refused {config} on {kind}: {err}"
            continue
        docs = read_documents(ds, tokenizer=tokenizer, objective=Objective(**config))
        tokens, flags = _reading(docs)
        assert tokens == ref["input_ids"], config
        assert flags == _flags(ref["labels"]), config
        compared += 1
    # the defaults, and every switch that TRL accepts here, were compared
    assert compared >= 3


def test_the_default_trains_the_whole_conversation_as_trl(folders):
    ds = datasets.Dataset.from_dict({"messages": CHATS})
    tok = load_tokenizer(folders["plain"])  # no generation markers: accepted by default
    _, flags = _reading(read_documents(ds, tokenizer=tok))
    assert all(all(row) for row in flags)
    on = Objective(assistant_only_loss=True)
    _, chosen = _reading(
        read_documents(ds, tokenizer=load_tokenizer(folders["marked"]), objective=on)
    )
    assert sum(map(sum, chosen)) < sum(map(sum, flags)) // 2


def test_refusals_name_the_row_and_the_switch(folders):
    tok = load_tokenizer(folders["marked"])
    on = Objective(assistant_only_loss=True)
    user_only = pa.Table.from_pylist([{"messages": [{"role": "user", "content": "hi"}]}])
    read_documents(user_only, tokenizer=tok)  # the default trains it whole, as TRL
    with pytest.raises(InvalidInput, match="row 0: the conversation has no assistant tokens"):
        read_documents(user_only, tokenizer=tok, objective=on)
    text = pa.Table.from_pylist([{"prompt": "hi", "completion": " there"}])
    with pytest.raises(InvalidInput, match="'the dataset is not conversational'"):
        read_documents(text, tokenizer=tok, objective=on)
    with pytest.raises(InvalidInput, match="not conversational"):
        read_documents(pa.Table.from_pylist([{"input_ids": [0, 5, 1]}]), objective=on)
    # an empty completion is refused as a chat without an assistant turn is
    empty = pa.Table.from_pylist(
        [{"prompt": "2+2=", "completion": "4"}, {"prompt": "a", "completion": ""}]
    )
    with pytest.raises(InvalidInput, match="row 1: the completion is empty"):
        read_documents(empty, tokenizer=load_tokenizer("bytes"))
    with pytest.raises(InvalidInput, match="completion_only_loss must be True, False or None"):
        PackOptions(max_length=8, completion_only_loss="yes")


def test_cli_flags_reach_the_reading(folders, tmp_path, capsys):
    import json

    from exactpack.cli import main
    from exactpack.io.store import load_packed

    from support.packed_helpers import recovered_examples

    path = tmp_path / "pc.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "completion": c}) + "\n"
                            for p, c in zip(PROMPTS, COMPLETIONS, strict=True)))  # fmt: skip
    eligible = {}
    for flags in ([], ["--completion-only-loss", "false"], ["--completion-only-loss", "TRUE"]):
        out = tmp_path / f"out{len(eligible)}"
        args = ["pack", str(path), "--tokenizer", str(folders["marked"]), "--max-length", "64"]
        assert main([*args, "--out", str(out), *flags]) == 0
        found = recovered_examples(load_packed(out))
        eligible[" ".join(flags)] = sum(sum(e["loss"]) for e in found.values())
    assert eligible[""] == eligible["--completion-only-loss TRUE"]
    assert eligible["--completion-only-loss false"] > eligible[""]
    code = main([*args, "--out", str(tmp_path / "x"), "--completion-only-loss", "maybe"])
    assert code == 2 and "--completion-only-loss takes true or false" in capsys.readouterr().err


def test_sfttrainer_reads_the_packed_rows_with_the_users_flags(folders, tmp_path):
    """TRL-format rows carry the objective in ``labels``: SFTTrainer keeps them as they are
    for every ``completion_only_loss``, and trains; ``assistant_only_loss=True`` belongs to
    exactpack's call (TRL refuses it on any tokenized dataset, its own packed rows too)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer

    from exactpack.hf import pack_dataset

    folder = folders["marked"]
    chats = datasets.Dataset.from_dict({"messages": CHATS})
    packed = pack_dataset(chats, 128, tokenizer=str(folder), format="trl", assistant_only_loss=True)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    torch.manual_seed(0)
    sizes = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
             "num_attention_heads": 2, "num_key_value_heads": 2}  # fmt: skip
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), **sizes))
    common = {"output_dir": str(tmp_path / "trl"), "report_to": [], "use_cpu": True,
              "max_length": None, "padding_free": True, "max_steps": 1,
              "per_device_train_batch_size": 1}  # fmt: skip
    for completion in (None, True, False):
        args = SFTConfig(completion_only_loss=completion, **common)
        trainer = SFTTrainer(
            model=model, args=args, train_dataset=packed, processing_class=tokenizer
        )
        assert trainer.train_dataset["labels"] == packed["labels"]
    assert trainer.train().training_loss > 0
    with pytest.raises(ValueError, match="not conversational"):
        SFTTrainer(model=model, args=SFTConfig(assistant_only_loss=True, **common),
                   train_dataset=packed, processing_class=tokenizer)  # fmt: skip


def test_a_streamed_dataset_follows_the_same_switches(folders):
    from exactpack.hf import pack_dataset

    ds = datasets.Dataset.from_dict({"messages": CHATS})
    folder = str(folders["marked"])

    def supervised(data, **switch):  # the labels TRL's collator trains
        from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

        collate = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
        rows = pack_dataset(data, 128, tokenizer=folder, format="trl", **switch)
        return sum(int((collate([row])["labels"] != -100).sum()) for row in rows)

    stream = ds.to_iterable_dataset()
    assert supervised(stream) == supervised(ds)
    on = {"assistant_only_loss": True}
    assert supervised(stream, **on) == supervised(ds, **on) < supervised(ds)
