import itertools
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from exactpack import Binding
from exactpack.core.errors import InvalidInput
from exactpack.io.documents import make_binding
from exactpack.io.readers import load_examples, read_documents
from exactpack.io.tokenizers import ByteTokenizer

from support.packed_helpers import expected_flags, random_records, write_jsonl


def _check(docs, records):
    """Documents hold exactly the records' tokens, flags and ids."""
    assert len(docs) == len(records)
    tflags = np.concatenate([[0], np.cumsum(docs.lengths)])
    for i, r in enumerate(records):
        assert docs.tokens[docs.offsets[i] : docs.offsets[i + 1]].tolist() == r["input_ids"]
        assert docs.loss_mask[tflags[i] : tflags[i + 1]].tolist() == expected_flags(r)
        assert docs.ids[i] == str(r.get("id", i))
    assert docs.tokens.dtype == np.int32 and docs.offsets.dtype == np.int64


def test_jsonl_with_ids_labels_and_missing_labels(tmp_path, rng):
    records = random_records(rng, 40, vocab=300, max_len=12)
    _check(read_documents(write_jsonl(tmp_path / "d.jsonl", records)), records)


def test_labels_minus_100_become_unsupervised_targets(tmp_path):
    rec = {"input_ids": [0, 5, 6, 7, 1], "labels": [-100, -100, 6, -100, 1]}
    docs = read_documents(write_jsonl(tmp_path / "d.jsonl", [rec]))
    # target j predicts token j+1: 5 (unsupervised), 6, 7 (unsupervised), 1
    assert docs.loss_mask.tolist() == [False, True, False, True]


@pytest.mark.parametrize("kind", [int, bool])
def test_loss_mask_per_token_or_per_target(tmp_path, kind):
    records = [
        {"input_ids": [0, 5, 6, 1], "loss_mask": [kind(v) for v in (1, 0, 1, 1)]},
        {"input_ids": [0, 5, 6, 1], "loss_mask": [kind(v) for v in (0, 1, 0)]},
        {"input_ids": [0, 7, 1]},
    ]
    _check(read_documents(write_jsonl(tmp_path / "d.jsonl", records)), records)


def test_integer_ids_and_default_row_ids(tmp_path):
    docs = read_documents(write_jsonl(tmp_path / "a.jsonl", [{"id": 7, "input_ids": [1, 2]}]))
    assert docs.ids.tolist() == ["7"]
    docs = read_documents(write_jsonl(tmp_path / "b.jsonl", [{"input_ids": [1, 2]}] * 3))
    assert docs.ids.tolist() == ["0", "1", "2"]


def test_json_array_file(tmp_path, rng):
    records = random_records(rng, 5, vocab=50, max_len=6)
    (tmp_path / "d.json").write_text(json.dumps(records))
    _check(read_documents(tmp_path / "d.json"), records)


def test_text_with_the_byte_tokenizer(tmp_path):
    texts = ["hello", "héllo wörld", "x"]
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": t} for t in texts])
    tok = ByteTokenizer()
    docs = read_documents(path, tokenizer=tok)
    for i, t in enumerate(texts):
        assert docs.tokens[docs.offsets[i] : docs.offsets[i + 1]].tolist() == tok.encode(t).tolist()
    assert docs.loss_mask.all()
    table = pa.table({"body": pa.array(["ab", "cd", "efg"]).slice(1, 2)})
    docs = read_documents(table, tokenizer=tok, text_field="body")
    assert docs.tokens.tolist() == [*tok.encode("cd").tolist(), *tok.encode("efg").tolist()]


def _parquet(records):
    return pa.table(
        {
            "id": [r["id"] for r in records],
            "input_ids": pa.array([r["input_ids"] for r in records], pa.list_(pa.int32())),
            "labels": pa.array([r.get("labels") for r in records], pa.list_(pa.int64())),
            "other": [len(r["input_ids"]) for r in records],
        }
    )


def test_parquet_file_and_folder_of_shards_in_name_order(tmp_path, rng):
    records = random_records(rng, 30, vocab=1000, max_len=10)
    pq.write_table(_parquet(records), tmp_path / "all.parquet")
    _check(read_documents(tmp_path / "all.parquet"), records)
    shards = tmp_path / "shards"
    shards.mkdir()
    for k, (a, b) in enumerate([(0, 10), (10, 11), (11, 30)]):
        pq.write_table(_parquet(records[a:b]), shards / f"part-{k:03d}.parquet")
    _check(read_documents(shards), records)


def test_datasets_on_disk_in_memory_and_dataset_dict(tmp_path, rng):
    import datasets

    records = random_records(rng, 20, vocab=100, max_len=8)
    ds = datasets.Dataset.from_list([{**r, "labels": r.get("labels")} for r in records])
    _check(read_documents(ds), records)
    picked = [5, 2, 9]
    _check(read_documents(ds.select(picked)), [records[i] for i in picked])
    ds.save_to_disk(str(tmp_path / "ds"))
    _check(read_documents(tmp_path / "ds"), records)
    dd = datasets.DatasetDict({"train": ds.select(range(4)), "validation": ds.select([7, 8])})
    dd.save_to_disk(str(tmp_path / "dd"))
    _check(read_documents(tmp_path / "dd", partition="validation"), records[7:9])
    with pytest.raises(InvalidInput, match=r"splits \['train', 'validation'\], not 'test'"):
        read_documents(tmp_path / "dd", partition="test")


def test_binding_from_vocab_size_or_tokenizer(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"input_ids": [0, 200, 1]}])
    table = load_examples(path, vocab_size=300)
    assert table.binding.vocab_size == 300 and table.binding.tokenizer_id == "pretokenized"
    assert table.binding.split_id.startswith("sha256:")
    docs = read_documents(path)
    assert (
        make_binding(lambda: docs.digest("train"), vocab_size=300).split_id
        != make_binding(lambda: docs.digest("validation"), vocab_size=300).split_id
    )
    tok = load_examples(path, tokenizer=ByteTokenizer()).binding
    assert tok == Binding(266, "exactpack/bytes-266", table.binding.split_id)
    with pytest.raises(InvalidInput, match="needs --vocab-size"):
        load_examples(path)
    with pytest.raises(InvalidInput, match="below the tokenizer's 266"):
        load_examples(path, vocab_size=100, tokenizer=ByteTokenizer())


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        (['{"input_ids": [0, 1]}', "", '{"input_ids": [0, 1'], r"line 3: not valid JSON"),
        (['{"input_ids": [0, 1]}', '{"input_ids": "abc"}'], r"line 2: input_ids must be a list"),
        (['{"id": "a", "input_ids": [0, 1]}', '{"id": 3, "input_ids": [0, 1]}'], r"line 2: id"),
        (
            ['{"input_ids": [0, 1], "loss_mask": [1, 1]}', "[1]", '{"input_ids": [0, 1]}'],
            r"line 2: is a list, not a JSON object",
        ),
        (
            [
                '{"input_ids": [0, 1], "loss_mask": [1, 1]}',
                '{"input_ids": [0, 1], "loss_mask": [true]}',
            ],
            r"line 2: loss_mask holds boolean values but earlier lines hold integer",
        ),
        (['{"input_ids": [0, 1]}', '{"input_ids": [4]}'], r"line 2: input_ids has 1 token"),
        (['{"input_ids": [0, 1]}', '{"input_ids": [0, -3]}'], r"line 2: token id -3 at pos"),
        (['{"input_ids": [0, 2, 1], "labels": [0, 2]}'], r"line 1: labels has 2 entries"),
        (['{"input_ids": [0, 2, 1], "labels": [-100, 3, 1]}'], r"line 1: labels\[1\] = 3"),
        (['{"input_ids": [0, 1], "labels": [0, 1], "loss_mask": [1, 1]}'], "keep one of them"),
        (['{"input_ids": [0, 1, 1], "loss_mask": [1]}'], r"line 1: loss_mask has 1 entries"),
        (['{"input_ids": [0.5, 1]}'], "must be integers"),
        (['{"text": "hi"}'], "no tokenizer was given"),
        (['{"tokens": [1, 2]}'], r"no 'input_ids' or 'text' column"),
    ],
)
def test_bad_jsonl_names_file_line_and_fix(tmp_path, lines, match):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InvalidInput, match=match) as err:
        read_documents(path)
    assert "bad.jsonl" in str(err.value)


def test_token_beyond_the_vocabulary_names_line_position_and_id(tmp_path):
    path = write_jsonl(
        tmp_path / "d.jsonl", [{"id": "ok", "input_ids": [0, 1]}, {"id": "x", "input_ids": [0, 9]}]
    )
    with pytest.raises(InvalidInput, match=r"d.jsonl line 2 \(id 'x'\): token id 9 at position 1"):
        load_examples(path, vocab_size=9)


def test_unknown_inputs_are_refused(tmp_path):
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(InvalidInput, match=r"unknown input type '\.csv'"):
        read_documents(tmp_path / "d.csv")
    with pytest.raises(InvalidInput, match="does not exist"):
        read_documents(tmp_path / "missing.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidInput, match=r"no \*\.parquet or \*\.jsonl"):
        read_documents(tmp_path / "empty")


def test_a_loss_mask_of_nested_lists_is_named_not_a_crash():
    nested = [[[0, 1], [1]], [[1], [1], [0]]]
    table = pa.table(
        {
            "input_ids": pa.array([[5, 6], [7, 8, 9]], pa.list_(pa.int32())),
            "loss_mask": pa.array(nested, pa.list_(pa.list_(pa.int8()))),
        }
    )
    with pytest.raises(InvalidInput, match=r"loss_mask holds \[0, 1\] at position 0; it must hold"):
        read_documents(table)


def test_text_is_encoded_in_sub_batches_with_encode_batch_fast(tmp_path, monkeypatch):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from exactpack.io import tokenizers as tok_mod

    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.save(str(tmp_path / "tokenizer.json"))
    tok = tok_mod.load_tokenizer(tmp_path / "tokenizer.json")
    texts = [" ".join("ab"[(i * j) % 2] for j in range(i % 17 + 2)) for i in range(300)]
    whole = tok.encode_batch(texts)
    calls = []

    class Recording:  # the Rust tokenizer, watched
        def encode_batch_fast(self, batch, add_special_tokens):
            calls.append(len(batch))
            return backend.encode_batch_fast(batch, add_special_tokens=add_special_tokens)

    monkeypatch.setattr(tok, "_rust", Recording())
    monkeypatch.setattr(tok_mod, "ENCODE_BATCH", 100)  # characters per call
    parts = tok.encode_batch(texts)
    assert len(calls) > 10 and sum(calls) == len(texts)
    assert np.array_equal(parts[0], whole[0]) and np.array_equal(parts[1], whole[1])
    want = [e.ids for e in backend.encode_batch(texts)]
    assert [whole[0][a:b].tolist() for a, b in itertools.pairwise(whole[1])] == want
