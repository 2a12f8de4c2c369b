"""Tree packing inputs: the three column conventions, ``exactpack stats --tree``, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from exactpack.cli import main
from exactpack.core.binding import Binding
from exactpack.core.errors import InvalidInput
from exactpack.core.tree import groups_from_columns, pack_tree

BINDING = Binding(20, "ids", "test")


def test_three_column_sets_make_the_same_groups():
    grpo, _ = groups_from_columns(
        {"prompt_ids": [[5, 6, 7]], "completion_ids": [[[8, 9], [8, 4]]]}, BINDING
    )
    dpo, _ = groups_from_columns(
        {
            "prompt_input_ids": [[5, 6, 7]],
            "chosen_input_ids": [[8, 9]],
            "rejected_input_ids": [[8, 4]],
        },
        BINDING,
    )
    generic, index = groups_from_columns(
        {"input_ids": [[5, 6, 7, 8, 9], [1, 2], [5, 6, 7, 8, 4]], "group": ["a", "b", "a"]}, BINDING
    )
    for groups in (grpo, dpo):
        assert [groups.sequence(i).tolist() for i in range(2)] == [[5, 6, 7, 8, 9], [5, 6, 7, 8, 4]]
        # the prompt's targets are not supervised; the pair 7 -> 8 (prompt -> completion) is
        assert groups.loss_mask.tolist() == [False, False, True, True] * 2
    assert generic.group.tolist() == [0, 0, 1] and generic.loss_mask.all()
    # the rows of group "a" gathered in input order; the index says where each came from
    assert index.tolist() == [0, 2, 1] and generic.sequence(2).tolist() == [1, 2]
    batch = pack_tree(grpo, 8).batches[0]
    assert batch.tokens_stored == 5 and batch.tokens_flat == 8  # 5->6, 6->7, 7->8 shared
    assert batch.weights.reshape(-1)[batch.input_valid.reshape(-1)].tolist() == [0, 0, 2, 1, 1]


def test_text_columns_are_refused_with_the_reason():
    with pytest.raises(InvalidInput, match="hold text — tokenize them first"):
        groups_from_columns({"prompt": ["hi"], "chosen": ["a"], "rejected": ["b"]}, BINDING)


def test_stats_tree_json(tmp_path, capsys):
    path = tmp_path / "g.jsonl"
    rows = [
        {"prompt_ids": [5, 6, 7], "completion_ids": [[8, 9], [8, 4], [3]]},
        {"prompt_ids": [1, 2], "completion_ids": [[3, 3, 3], [4]]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["stats", str(path), "--tree", "--max-length", "16", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    flat = sum(len(r["prompt_ids"]) + len(c) - 1 for r in rows for c in r["completion_ids"])
    assert report["tokens_flat"] == flat == 17
    assert report["tokens_stored"] == 11 and report["rows_tree"] == 1 and report["rows_flat"] == 2
    text = tmp_path / "t.jsonl"
    text.write_text(json.dumps({"prompt": "hi", "chosen": "a", "rejected": "b"}) + "\n")
    assert main(["stats", str(text), "--tree", "--max-length", "16"]) == 2
    assert "chosen / rejected text but no tokenizer was given" in capsys.readouterr().err
    assert np.isfinite(report["stored_over_flat"])


def test_pack_dataset_tree_rows_round_trip():
    import datasets
    import torch

    from exactpack.hf import pack_dataset
    from exactpack.io.store import tree_batch_from_rows
    from exactpack.nn.logprobs import sequence_logprobs

    ds = datasets.Dataset.from_dict(
        {
            "prompt_input_ids": [[5, 6, 7], [1, 2]],
            "chosen_input_ids": [[8, 9], [3, 3]],
            "rejected_input_ids": [[8, 4, 4], [4]],
        }
    )
    rows = pack_dataset(ds, 8, tree=True)
    assert len(rows) == 2 and set(rows.column_names) >= {"node_ids", "weights", "sequence_cells"}
    direct = pack_tree(
        groups_from_columns(ds.to_dict(), Binding(10, "ids", "x"))[0],
        8,
        policy="best-fit-decreasing",
    ).batches[0]
    back = tree_batch_from_rows(list(rows), 8, 10)
    names = ("inputs", "targets", "positions", "segments", "node_ends", "weights", "input_valid")
    for name in names:
        np.testing.assert_array_equal(getattr(back, name), getattr(direct, name))
    np.testing.assert_array_equal(back.node_parent, direct.node_parent)
    np.testing.assert_array_equal(back.dense_mask(2), direct.dense_mask(2))
    logits = torch.randn(*direct.shape, 10, dtype=torch.float64)
    order = np.argsort(back.seq_index)
    torch.testing.assert_close(
        sequence_logprobs(logits, back)[order],
        sequence_logprobs(logits, direct)[np.argsort(direct.seq_index)],
    )
    with pytest.raises(InvalidInput, match="cannot express a tree"):
        pack_dataset(ds, 8, tree=True, format="trl")


def test_tree_collator_feeds_a_model():
    import datasets
    import torch

    from exactpack.core.binding import Binding
    from exactpack.core.loss import token_weighted_loss
    from exactpack.hf import pack_dataset
    from exactpack.hf.collator import hf_collator
    from exactpack.training import ScheduledBatch
    from exactpack.training.distributed import Slot
    from exactpack.verify.models import load_model

    config = Path(__file__).parents[1] / "data" / "tiny_llama.json"
    model = load_model(config=config, dtype=torch.float64)
    model.set_attn_implementation("exactpack_tree")
    ds = datasets.Dataset.from_dict(
        {"prompt_ids": [[5, 6, 7, 9], [1, 2]], "completion_ids": [[[8, 9], [8, 4]], [[3], [4, 4]]]}
    )
    rows = pack_dataset(ds, 9, tree=True)
    collator = hf_collator(
        "exactpack_tree",
        max_length=9,
        binding=Binding(266, "tree-records", "tree-records"),
        tree=True,
        config=model.config,
        dtype=torch.float64,
    )
    loader = torch.utils.data.DataLoader(rows, batch_size=2, collate_fn=collator.rows_of)
    (batch,) = list(loader)  # the forest batch: the loss and the per-sequence views read it
    loss = token_weighted_loss(model(**collator(batch)).logits, batch).mean
    slot = Slot(0, 0, 0, 0, 1, tuple(range(batch.shape[0])), batch.eligible_count, 0)
    scheduled = collator(ScheduledBatch(batch, slot))  # a RowSampler slot of the same rows
    assert torch.equal(scheduled["input_ids"], collator(batch)["input_ids"])
    total, count = 0.0, 0
    for prompt, comps in zip(ds["prompt_ids"], ds["completion_ids"], strict=True):
        for c in comps:
            seq = torch.tensor(prompt + c)
            lp = model(input_ids=seq[None, :-1], use_cache=False).logits[0].log_softmax(-1)
            gold = lp.gather(1, seq[1:, None])[:, 0][len(prompt) - 1 :]
            total, count = total - float(gold.detach().sum()), count + gold.shape[0]
    assert abs(float(loss.detach()) - total / count) <= 1e-10 + 1e-9 * abs(total / count)


def test_pack_dataset_tree_packs_a_stream_through_the_stream_engine():
    """A stream (an ``IterableDataset`` or any iterator) is packed as read by the one stream
    engine, a trie its unit: the Dataset's tries, rows and sequences; under next-fit
    (``lookahead=1, max_open_rows=1``) the tries in input order; read ``tree_block`` rows at a
    time, a group's rows still one trie; every sequence keeps its supervision and index."""
    import datasets

    from exactpack import PackOptions
    from exactpack.hf import pack_dataset

    rows = [{"prompt_ids": [5, 6 + g % 3], "completion_ids": [[8], [4], [2]]} for g in range(9)]
    whole = list(pack_dataset(datasets.Dataset.from_list(rows), 16, tree=True, vocab_size=20))
    stream = datasets.Dataset.from_list(rows).to_iterable_dataset()
    streamed = list(pack_dataset(stream, 16, tree=True, vocab_size=20))
    small = list(pack_dataset(iter(rows), 16, tree=True, vocab_size=20, lookahead=1,
                              max_open_rows=1))  # fmt: skip
    assert [s for r in small for s in sorted(r["sequence_index"])] == list(range(27))
    assert len(streamed) == len(small) == len(whole) == 3
    opts = PackOptions(max_length=16, vocab_size=20, tree="on", tree_block=2)

    def sequences(records):
        return {
            s: ([r["input_ids"][c] for c in cells] + [r["target_ids"][cells[-1]]], list(mask))
            for r in records
            for s, cells, mask in zip(
                r["sequence_index"], r["sequence_cells"], r["sequence_mask"], strict=True
            )
        }

    assert sequences(small) == sequences(streamed) == sequences(whole)
    assert len(sequences(whole)) == 27
    grouped = [{"input_ids": [5, 6 + g % 3, k + 2], "group": g} for g in range(5) for k in range(3)]
    packed = list(pack_dataset(iter(grouped), options=opts))  # groups cross the 2-row reads
    assert sorted(s for r in packed for s in r["sequence_index"]) == list(range(15))
    for r in packed:
        assert all(
            sum(s // 3 == g // 3 for s in r["sequence_index"]) == 3 for g in r["sequence_index"]
        )
    with pytest.raises(InvalidInput, match="pass vocab_size=") as err:
        pack_dataset(iter(rows), 16, tree=True)
    assert "\n" not in str(err.value)
    with pytest.raises(InvalidInput, match="pass max_length="):
        pack_dataset(datasets.Dataset.from_list(rows), tree=True)


def test_pack_dataset_tree_checks_the_model_as_flat_packing_does():
    """``model=`` with ``tree=True``: flat ``pack_dataset``'s check_model, on tree rows."""
    import datasets
    from transformers import LlamaConfig, RoFormerConfig

    from exactpack.hf import pack_dataset
    from exactpack.hf.architectures import UnsupportedArchitecture

    ds = datasets.Dataset.from_dict({"prompt_ids": [[5] * 10], "completion_ids": [[[8] * 8, [4]]]})
    small = dict(hidden_size=16, intermediate_size=16, num_attention_heads=2, vocab_size=20)
    roformer = RoFormerConfig(num_hidden_layers=1, is_decoder=True, embedding_size=16, **small)
    with pytest.raises(UnsupportedArchitecture, match="rotary tables are indexed by column"):
        pack_dataset(ds, 32, tree=True, model=roformer)
    dynamic = LlamaConfig(
        num_hidden_layers=1,
        max_position_embeddings=16,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
        **small,
    )
    with pytest.raises(UnsupportedArchitecture, match="every example <= 16 pairs"):
        pack_dataset(ds, 32, tree=True, model=dynamic)  # prompt 10 + completion 8: 17 pairs
    with pytest.raises(UnsupportedArchitecture, match="every example <= 16 pairs"):  # a stream
        list(pack_dataset(ds.to_iterable_dataset(), 32, tree=True, vocab_size=20, model=dynamic))
    with pytest.raises(InvalidInput, match=r"config\.vocab_size is 20"):
        pack_dataset(
            ds, 32, tree=True, vocab_size=30, model=LlamaConfig(num_hidden_layers=1, **small)
        )
    assert len(pack_dataset(ds, 32, tree=True, model=LlamaConfig(num_hidden_layers=1, **small)))


def test_pack_dataset_tree_reads_trl_dpo_columns_and_carries_per_pair_columns():
    """TRL 1.16's prompt_ids / chosen_ids / rejected_ids: each pair one trie (the prompt
    stored once), as the older column names; every scalar column (id, precomputed reference
    log-probs) comes back per sequence, from a Dataset, a stream, and input_ids + group rows."""
    import datasets

    from exactpack.hf import pack_dataset
    from exactpack.io.store import tree_batch_from_rows

    trl = {
        "prompt_ids": [[5, 6, 7], [1, 2]],
        "chosen_ids": [[8, 9], [3, 3]],
        "rejected_ids": [[8, 4, 4], [4]],
    }
    per_pair = {
        "id": ["a", "b"],
        "ref_chosen_logps": [-1.5, -2.5],
        "ref_rejected_logps": [-3.0, -4.0],
    }
    rows = pack_dataset(datasets.Dataset.from_dict(trl | per_pair), 16, tree=True)
    old = pack_dataset(
        datasets.Dataset.from_dict({f"{k[:-4]}_input_ids": v for k, v in trl.items()}),
        16,
        tree=True,
    )
    assert [{k: r[k] for k in old.column_names} for r in rows] == list(old)
    batch = tree_batch_from_rows(list(rows), 16, 10)
    assert (batch.tokens_stored, batch.tokens_flat) == (10, 14)  # 5->6, 6->7, 1->2 once

    def carried(records, names=tuple(per_pair)):
        return {
            s: vals
            for r in records
            for s, *vals in zip(r["sequence_index"], *(r[n] for n in names), strict=True)
        }

    want = {s: [v[s // 2] for v in per_pair.values()] for s in range(4)}  # both answers
    assert carried(rows) == want
    stream = datasets.Dataset.from_dict(trl | per_pair).to_iterable_dataset()
    assert carried(pack_dataset(stream, 16, tree=True, vocab_size=10)) == want
    grouped = {
        "input_ids": [[1, 2, 3], [4, 5], [1, 2, 6]],
        "group": [0, 1, 0],
        "id": ["x", "y", "z"],
    }
    got = carried(pack_dataset(datasets.Dataset.from_dict(grouped), 16, tree=True), ("id",))
    assert got == {0: ["x"], 1: ["y"], 2: ["z"]}  # a row's own value, whatever its group
    kto = {"prompt_ids": [[5, 6], [5, 6]], "completion_ids": [[7], [8, 9]], "label": [True, False]}
    got = carried(pack_dataset(datasets.Dataset.from_dict(kto), 16, tree=True), ("label",))
    assert got == {0: [True], 1: [False]}  # TRL 1.16's KTO rows: unpaired, groups of one
    with pytest.raises(InvalidInput, match=r"column 'weights' is carried .* rename it"):
        pack_dataset(datasets.Dataset.from_dict(trl | {"weights": [1, 2]}), 16, tree=True)
