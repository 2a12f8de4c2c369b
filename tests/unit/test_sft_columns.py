"""SFT supervision on input: TRL's masks, prompt-completion and chat rows, refusals.

Every reading is held to TRL 1.16's own ``SFTTrainer`` preparation of the
same rows (``sft_helpers.trl_prepared``): the same tokens, and a target is
supervised exactly where TRL's ``labels`` (which the model shifts) train it.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from exactpack.cli import main
from exactpack.core.errors import InvalidInput
from exactpack.core.supervision import Objective
from exactpack.io.readers import read_documents
from exactpack.io.store import load_packed
from exactpack.io.tokenizers import load_tokenizer
from exactpack.pipeline import pack_path
from exactpack.pipeline.options import PackOptions

from support.packed_helpers import recovered_examples
from support.sft_helpers import (
    CHATS,
    COMPLETIONS,
    PLAIN_TEMPLATE,
    PROMPTS,
    TEMPLATE,
    chat_tokenizer,
    trl_prepared,
)

datasets = pytest.importorskip("datasets")
pytest.importorskip("trl")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return chat_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def tok(folder):
    return load_tokenizer(folder)


def labels_of(docs) -> list[list[int]]:
    """exactpack's reading in TRL's terms: the token where its pair is supervised, else -100
    (and -100 on the first token, which no pair predicts)."""
    out = []
    for i in range(len(docs)):
        a, b = int(docs.offsets[i]), int(docs.offsets[i + 1])
        flags = docs.loss_mask[a - i : b - i - 1]
        ids = docs.tokens[a:b].tolist()
        out.append([-100] + [t if f else -100 for t, f in zip(ids[1:], flags, strict=True)])
    return out


def tokens_of(docs) -> list[list[int]]:
    return [
        docs.tokens[a:b].tolist() for a, b in zip(docs.offsets[:-1], docs.offsets[1:], strict=True)
    ]


def trl_flags(labels: list[list[int]]) -> list[list[bool]]:
    return [[x != -100 for x in row[1:]] for row in labels]


def test_messages_are_read_as_trl_with_assistant_only_loss(folder, tok, tmp_path):
    ds = datasets.Dataset.from_dict({"messages": CHATS})
    ref = trl_prepared(ds, folder, tmp_path, assistant_only_loss=True)
    docs = read_documents(ds, tokenizer=tok, objective=Objective(assistant_only_loss=True))
    assert tokens_of(docs) == ref["input_ids"]
    assert labels_of(docs) == ref["labels"]
    # the user turns and the template's headers are never trained, every assistant token is
    second = ref["labels"][1]
    assert -100 in second and sum(x != -100 for x in second) < len(second) // 2


def test_sharegpt_conversations_are_converted_as_trl_does(folder, tok, tmp_path):
    sharegpt = [[{"from": m["role"], "value": m["content"]} for m in chat] for chat in CHATS]
    ds = datasets.Dataset.from_dict({"conversations": sharegpt})
    # TRL checks assistant_only_loss before it converts, so it is held to the converted rows
    chatml = datasets.Dataset.from_dict({"messages": CHATS})
    ref = trl_prepared(chatml, folder, tmp_path, assistant_only_loss=True)
    aol = Objective(assistant_only_loss=True)
    assert labels_of(read_documents(ds, tokenizer=tok, objective=aol)) == ref["labels"]


def test_tools_and_template_arguments_reach_the_template_per_row_as_in_trl(folder, tok, tmp_path):
    tool = {"type": "function", "function": {"name": "sky", "parameters": {}}}
    ds = datasets.Dataset.from_dict(
        {
            "messages": CHATS,
            "tools": [json.dumps([tool]), None, json.dumps([])],
            "chat_template_kwargs": [{"greeting": "hi"}, {"greeting": "yo"}, {}],
        }
    )
    ref = trl_prepared(ds, folder, tmp_path, assistant_only_loss=True)
    docs = read_documents(ds, tokenizer=tok, objective=Objective(assistant_only_loss=True))
    assert tokens_of(docs) == ref["input_ids"]
    assert labels_of(docs) == ref["labels"]
    plain = read_documents(datasets.Dataset.from_dict({"messages": CHATS}), tokenizer=tok)
    longer = [len(a) > len(b) for a, b in zip(tokens_of(docs), tokens_of(plain), strict=True)]
    assert longer[:2] == [True, True]  # the tools and the greeting were rendered


def test_text_prompt_completion_is_read_as_trl_completion_only(folder, tok, tmp_path):
    ds = datasets.Dataset.from_dict({"prompt": PROMPTS, "completion": COMPLETIONS})
    ref = trl_prepared(ds, folder, tmp_path)  # completion_only_loss: TRL's default here
    with pytest.warns(UserWarning, match=r"row 2: the tokenized prompt is not a prefix .*\(1 of 3"):
        docs = read_documents(ds, tokenizer=tok)  # TRL warns of the merge below too
    assert tokens_of(docs) == ref["input_ids"]
    assert labels_of(docs) == ref["labels"]
    eos = tok.backend.eos_token_id
    assert all(row[-1] == eos and row[:-1].count(eos) == 0 for row in ref["input_ids"])
    # the third prompt's last token merged with the completion: training starts earlier
    alone = tok.backend(PROMPTS[2])["input_ids"]
    first = next(i for i, x in enumerate(ref["labels"][2]) if x != -100)
    assert first < len(alone)


def test_conversational_prompt_completion_is_read_as_trl(folder, tok, tmp_path):
    ds = datasets.Dataset.from_dict(
        {"prompt": [c[:-1] for c in CHATS], "completion": [c[-1:] for c in CHATS]}
    )
    ref = trl_prepared(ds, folder, tmp_path, assistant_only_loss=True)
    docs = read_documents(ds, tokenizer=tok, objective=Objective(assistant_only_loss=True))
    assert tokens_of(docs) == ref["input_ids"]
    assert labels_of(docs) == ref["labels"]


def test_conversational_prompt_completion_without_markers_trains_the_completion(tmp_path):
    plain = chat_tokenizer(tmp_path / "plain", template=PLAIN_TEMPLATE)
    ds = datasets.Dataset.from_dict(
        {"prompt": [c[:-1] for c in CHATS], "completion": [c[-1:] for c in CHATS]}
    )
    ref = trl_prepared(ds, plain, tmp_path)  # completion_only_loss, no assistant mask
    assert labels_of(read_documents(ds, tokenizer=load_tokenizer(plain))) == ref["labels"]


def test_trl_masks_on_token_ids_are_anded_as_trl_builds_labels(folder, tok, tmp_path, rng):
    ids = [tok.backend(p + c)["input_ids"] for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]
    rows = {
        "input_ids": ids,
        "completion_mask": [rng.integers(0, 2, len(x)).tolist() for x in ids],
        "assistant_masks": [rng.integers(0, 2, len(x)).tolist() for x in ids],
    }
    ds = datasets.Dataset.from_dict(rows)
    ref = trl_prepared(ds, folder, tmp_path, completion_only_loss=True)
    docs = read_documents(ds, objective=Objective(completion_only_loss=True))
    assert tokens_of(docs) == ids
    # TRL labels the first token too, which no pair predicts: targets are compared
    assert trl_flags(labels_of(docs)) == trl_flags(ref["labels"])


def test_a_per_token_mask_maps_to_targets_as_labels_do():
    # the fixture's B with only its EOS supervised, written three ways: one reading
    rows = [
        {"input_ids": [0, 101, 1], "labels": [-100, -100, 1]},
        {"input_ids": [0, 101, 1], "completion_mask": [0, 0, 1]},
        {"input_ids": [0, 101, 1], "assistant_masks": [False, False, True]},
        {"input_ids": [0, 101, 1], "loss_mask": [0, 1], "completion_mask": [0, 1, 1]},
    ]
    on = Objective(completion_only_loss=True)
    readings = [read_documents(pa.Table.from_pylist([r]), objective=on) for r in rows]
    for docs in readings:
        assert docs.loss_mask.tolist() == [False, True]
        assert docs.digest("train") == readings[0].digest("train")


def test_every_present_mask_must_agree():
    row = {
        "input_ids": [0, 5, 6, 7, 1],
        "labels": [-100, 5, 6, 7, 1],
        "completion_mask": [0, 0, 1, 1, 1],
        "assistant_masks": [0, 1, 1, 1, 0],
    }
    table = pa.Table.from_pylist([row, {"input_ids": [0, 5, 1]}])
    docs = read_documents(table, objective=Objective(completion_only_loss=True))
    # token 6 and 7 pass all three; 5 fails completion_mask, EOS fails assistant_masks
    assert docs.loss_mask.tolist() == [False, True, True, False, True, True]


@pytest.fixture(scope="module")
def reference(folder, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    ref = trl_prepared(
        datasets.Dataset.from_dict({"messages": CHATS}), folder, tmp, assistant_only_loss=True
    )
    whole = trl_prepared(datasets.Dataset.from_dict({"messages": CHATS}), folder, tmp)
    return {
        "tokens": ref["input_ids"],
        "flags": trl_flags(ref["labels"]),
        "whole": trl_flags(whole["labels"]),
    }


def _recovered(out):
    found = recovered_examples(load_packed(out))
    return [found[k]["tokens"] for k in sorted(found)], [found[k]["loss"] for k in sorted(found)]


def test_cli_packs_chat_jsonl_and_parquet_with_trl_supervision(folder, reference, tmp_path):
    with open(tmp_path / "chats.jsonl", "w") as f:
        f.writelines(json.dumps({"id": f"c{i}", "messages": c}) + "\n" for i, c in enumerate(CHATS))
    pq.write_table(pa.Table.from_pylist([{"messages": c} for c in CHATS]), tmp_path / "c.parquet")
    (tmp_path / "train.jinja").write_text(TEMPLATE)
    for name in ("chats.jsonl", "c.parquet"):
        out = tmp_path / f"out-{name}"
        done = subprocess.run(
            [sys.executable, "-m", "exactpack", "pack", tmp_path / name, "--tokenizer", folder,
             "--chat-template", tmp_path / "train.jinja", "--max-length", "128", "--out", out,
             "--assistant-only-loss"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert _recovered(out) == (reference["tokens"], reference["flags"])


def test_pack_path_and_pack_dataset_read_the_same_supervision(folder, reference, tmp_path):
    from exactpack.hf import pack_dataset, unpack_dataset

    ds = datasets.Dataset.from_dict({"messages": CHATS, "source": ["a", "b", "c"]})
    pack_path(ds, tmp_path / "out", max_length=128, tokenizer=str(folder), assistant_only_loss=True)
    assert _recovered(tmp_path / "out") == (reference["tokens"], reference["flags"])
    back = unpack_dataset(pack_dataset(ds, 128, tokenizer=str(folder), assistant_only_loss=True))
    assert back["input_ids"] == reference["tokens"]
    assert trl_flags(back["labels"]) == reference["flags"]
    default = unpack_dataset(pack_dataset(ds, 128, tokenizer=str(folder)))
    assert trl_flags(default["labels"]) == reference["whole"]  # TRL's default: every token


def test_the_ray_engine_reads_the_same_supervision(folder, reference, tmp_path):
    ray = pytest.importorskip("ray")
    import logging

    from exactpack.ray import pack

    from support.ray_helpers import private_loopback_ray

    pq.write_table(pa.Table.from_pylist([{"messages": c} for c in CHATS]), tmp_path / "c.parquet")
    with private_loopback_ray() as session:
        ray.init(address="local", num_cpus=1, include_dashboard=False, _temp_dir=session,
                 logging_level=logging.ERROR)  # fmt: skip
        try:
            pack(tmp_path / "c.parquet", tmp_path / "out", max_length=128, tokenizer=str(folder),
                 assistant_only_loss=True)  # fmt: skip
        finally:
            ray.shutdown()
    assert _recovered(tmp_path / "out") == (reference["tokens"], reference["flags"])


def test_chat_template_option_overrides_the_folders_own(folder, tmp_path):
    bare = chat_tokenizer(tmp_path / "bare", template=PLAIN_TEMPLATE)
    ds = datasets.Dataset.from_dict({"messages": CHATS[:1]})
    aol = Objective(assistant_only_loss=True)
    with pytest.raises(InvalidInput, match=r"marks none — as TRL says.*--chat-template FILE"):
        read_documents(ds, tokenizer=load_tokenizer(bare), objective=aol)
    (tmp_path / "t.jinja").write_text(TEMPLATE)
    (tmp_path / "config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    want = read_documents(ds, tokenizer=load_tokenizer(folder), objective=aol).digest("train")
    for spec in (tmp_path / "t.jinja", TEMPLATE, str(tmp_path / "config.json")):
        loaded = PackOptions(max_length=8, tokenizer=str(bare), chat_template=spec).load_tokenizer()
        assert "+chat-template@sha256:" in loaded.identity
        assert read_documents(ds, tokenizer=loaded, objective=aol).digest("train") == want


def test_a_folders_own_template_keeps_its_identity(folder):
    own = (folder / "chat_template.jinja").read_text()
    loaded = PackOptions(max_length=8, tokenizer=str(folder), chat_template=own).load_tokenizer()
    assert loaded.identity == load_tokenizer(folder).identity


REFUSED = [
    ({"label": [0, 5, 1]}, "'label' looks like supervision", "rename it to labels"),
    ({"label": 1}, "'label' looks like supervision", "preference label"),
    ({"loss_weights": [1.0, 0.5, 1.0]}, "'loss_weights'", "per-token weights are not supported"),
    ({"mask": [0, 1, 1]}, "'mask' looks like supervision", "give it as loss_mask"),
    ({"completion_masks": [0, 1, 1]}, "'completion_masks'", "did you mean completion_mask"),
    ({"assistant_mask": [0, 1, 1]}, "'assistant_mask'", "did you mean assistant_masks"),
    ({"targets": [5, 1, -100]}, "'targets'", "exactpack forms the targets itself"),
    ({"seq_lengths": [3]}, "'seq_lengths'", "already packed"),
    ({"response_label_ids": [0, 1, 1]}, "'response_label_ids'", "rename it to the one it means"),
    ({"attention_mask": [1, 1, 0]}, "attention_mask[2] = 0", "padded or masked tokens"),
    ({"attention_mask": [1, 1]}, "attention_mask has 2 entries", "drop the column"),
    ({"token_type_ids": [0, 1, 1]}, "token_type_ids[1] = 1", "give completion_mask instead"),
    ({"position_ids": [0, 1, 0]}, "position_ids[2] = 0", "already packed"),
    ({"labels": [-100, 7, 1]}, "labels[1] = 7 differs", "the token itself or -100"),
    ({"completion_mask": [0, 1], "prompt": "p", "completion": "c"}, "completion_mask has 2", "0/1"),
    ({"assistant_masks": [0, 2, 1]}, "assistant_masks", "booleans or 0/1"),
]


@pytest.mark.parametrize(("extra", "what", "fix"), REFUSED)
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_column_that_looks_like_supervision_is_refused(tmp_path, extra, what, fix, fmt):
    rows = [{"input_ids": [0, 5, 1], "labels": [-100, 5, 1], "id": "a"}]
    rows = [rows[0] | extra]
    path = tmp_path / f"in.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(InvalidInput) as err:
        read_documents(path)
    assert what in str(err.value) and fix in str(err.value)
    assert str(path) in str(err.value)


def test_ordinary_columns_and_plain_tokenizer_outputs_pass(tmp_path):
    row = {
        "input_ids": [0, 5, 6, 1],
        "attention_mask": [1, 1, 1, 1],
        "token_type_ids": [0, 0, 0, 0],
        "position_ids": [0, 1, 2, 3],
        "id": "a", "source": "web", "text": "x", "url": "u", "quality_label": "good",
        "mask_ratio": 0.5, "messages": [{"role": "user", "content": "kept as metadata"}],
    }  # fmt: skip
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "in.parquet")
    docs = read_documents(tmp_path / "in.parquet")
    assert docs.loss_mask.tolist() == [True, True, True]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"text": "hi", "labels": [0, 1]}], "'labels' aligns with input_ids, but the rows are"),
        ([{"prompt": "hi"}], "without completion — prompt-completion rows need both"),
        ([{"prompt": "hi", "chosen": "a", "rejected": "b"}], "'chosen' looks like supervision"),
        ([{"messages": []}], "messages is empty"),
        ([{"messages": [{"content": "hi"}]}], "has no role"),
    ],
)
def test_sft_rows_that_cannot_be_read_are_named(tok, rows, message):
    with pytest.raises(InvalidInput, match=message):
        read_documents(pa.Table.from_pylist(rows), tokenizer=tok)


def test_chat_rows_need_a_transformers_tokenizer_and_a_template(folder, tmp_path, capsys):
    ds = pa.Table.from_pylist([{"messages": CHATS[0]}])
    with pytest.raises(InvalidInput, match="no tokenizer was given"):
        read_documents(ds)
    with pytest.raises(InvalidInput, match="need a chat template and a transformers tokenizer"):
        read_documents(ds, tokenizer=load_tokenizer(folder / "tokenizer.json"))
    with pytest.raises(InvalidInput, match="--chat-template needs a transformers tokenizer"):
        PackOptions(
            max_length=8, tokenizer=str(folder / "tokenizer.json"), chat_template=TEMPLATE
        ).load_tokenizer()
    pq.write_table(ds, tmp_path / "c.parquet")
    code = main(["pack", str(tmp_path / "c.parquet"), "--tokenizer", str(folder),
                 "--chat-template", str(tmp_path / "missing.jinja"), "--max-length", "8",
                 "--out", str(tmp_path / "never")])  # fmt: skip
    assert code == 2 and "missing.jinja' is not a file" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_byte_tokenizer_prompt_completion_supervises_the_completion_and_eos():
    docs = read_documents(
        pa.Table.from_pylist([{"prompt": "2+2=", "completion": "4"}]),
        tokenizer=load_tokenizer("bytes"),
    )
    assert tokens_of(docs) == [[0, *(10 + b for b in b"2+2=4"), 1]]
    assert docs.loss_mask.tolist() == [False, False, False, False, True, True]


def test_a_mask_of_the_wrong_kind_names_its_json_line(tmp_path):
    path = tmp_path / "in.jsonl"
    rows = [
        {"input_ids": [0, 5, 1], "completion_mask": [True, False, True]},
        {"input_ids": [0, 5, 1], "completion_mask": [0, 1, 1]},
        {"input_ids": [0, 5, 1], "assistant_masks": [0, 0.5, 1]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InvalidInput, match=r"in.jsonl line 2: completion_mask holds integer"):
        read_documents(path)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[1:]))
    with pytest.raises(InvalidInput, match=r"line 2: assistant_masks must be booleans or 0/1"):
        read_documents(path)


def test_streamed_mappings_follow_the_same_rule():
    from exactpack.core.binding import Binding
    from exactpack.training.stream import StreamDataset

    def first_mask(item):
        stream = StreamDataset(
            [item], binding=Binding(266, "t", "s"), max_length=16, rows_per_micro_batch=1
        )
        return next(iter(stream)).batch.loss_mask[0, :4].tolist()

    ids = [0, 5, 6, 7, 1]
    both = {"input_ids": ids, "completion_mask": [0, 0, 1, 1, 1], "assistant_masks": [1] * 4 + [0]}
    with pytest.warns(UserWarning, match="completion_mask is not applied"):  # TRL's default
        assert first_mask(both) == [True, True, True, False]
    both |= {"prompt": "p", "completion": "c"}  # a prompt-completion row: the mask applies
    assert first_mask(both) == [False, True, True, False]
    assert first_mask({"input_ids": ids, "labels": [-100, -100, 6, 7, 1]}) == [False] + [True] * 3
    for bad, message in [
        ({"assistant_mask": [1] * 5}, "did you mean assistant_masks"),
        ({"attention_mask": [1, 1, 1, 1, 0]}, "padded or masked tokens"),
        ({"labels": [0, 5, 6, 9, 1]}, "the token itself or -100"),
        ({"completion_mask": [0, 1, 1, 1], "prompt": "p", "completion": "c"}, "per input_ids"),
    ]:
        with pytest.raises(InvalidInput, match=message):
            first_mask({"input_ids": ids} | bad)


def test_chats_packed_in_trls_format_carry_trls_own_labels(folder, reference):
    from exactpack.hf import pack_dataset

    ds = datasets.Dataset.from_dict({"messages": CHATS})
    packed = pack_dataset(
        ds, 256, tokenizer=str(folder), format="trl", policy="next-fit", assistant_only_loss=True
    )
    tokens, flags = [], []
    for ids, labels, lengths in zip(
        packed["input_ids"], packed["labels"], packed["seq_lengths"], strict=True
    ):
        for a, b in itertools.pairwise([0, *itertools.accumulate(lengths)]):
            tokens.append(ids[a:b])
            flags.append([x != -100 for x in labels[a + 1 : b]])
    assert tokens == reference["tokens"] and flags == reference["flags"]
