import datasets
import numpy as np
import pytest

from seqpack import Binding, BindingMismatch, PackConfig, materialize, plan_rows
from seqpack.core.errors import InvalidInput
from seqpack.core.fixture import FIXTURE_DOCUMENTS, fixture_epoch
from seqpack.hf.data import pack_dataset, packed_metadata, to_batches, unpack_dataset
from seqpack.io.readers import load_examples
from seqpack.io.shards import SCHEMA

from packed_helpers import assert_same_batches, expected_flags, random_records


def _dataset(records):
    return datasets.Dataset.from_list([{**r, "labels": r.get("labels")} for r in records])


def test_fixture_packs_into_one_dataset_row_per_packed_row():
    docs = list(FIXTURE_DOCUMENTS.values())
    ds = datasets.Dataset.from_dict({"id": list(FIXTURE_DOCUMENTS), "input_ids": docs})
    packed = pack_dataset(ds, 6, "next-fit", vocab_size=266, max_rows_per_batch=2)
    assert isinstance(packed, datasets.Dataset) and len(packed) == 2
    assert packed.column_names == SCHEMA.names
    assert packed["tokens"] == [docs[0] + docs[1], docs[2]]
    assert packed["seq_starts"] == [[0, 3], [0]]
    batches = list(to_batches(packed))
    want = fixture_epoch(2).batches
    for name in ("inputs", "targets", "segments", "positions", "loss_mask"):
        assert np.array_equal(getattr(batches[0], name), getattr(want[0], name))


@pytest.mark.parametrize("policy", ["next-fit", "best-fit-decreasing"])
def test_pack_then_unpack_recovers_every_example(rng, policy):
    records = random_records(rng, 80, vocab=400, max_len=30)
    packed = pack_dataset(_dataset(records), 32, policy, vocab_size=400, tokenizer_id="tok")
    lengths = [len(r["input_ids"]) - 1 for r in records]
    plan = plan_rows(lengths, 32, policy)
    assert len(packed) == plan.num_rows
    meta = packed_metadata(packed)
    assert meta["statistics"]["rows"] == plan.num_rows and meta["policy"]["name"] == policy
    back = unpack_dataset(packed)
    assert back["id"] == [r["id"] for r in records]
    assert back["input_ids"] == [r["input_ids"] for r in records]
    for record, labels in zip(records, back["labels"], strict=True):
        assert [label != -100 for label in labels[1:]] == expected_flags(record)
        assert all(lab in (-100, tok) for lab, tok in zip(labels, record["input_ids"], strict=True))
    # the layout rebuilt from the dataset equals packing the same examples directly
    table = load_examples(
        _dataset(records), vocab_size=400, tokenizer_id="tok", split_id=meta["binding"]["split_id"]
    )
    want = materialize(table, plan, PackConfig(32, 3)).batches
    assert_same_batches(to_batches(packed, 3), want)


def test_binding_defaults_split_long_and_errors(rng):
    records = random_records(rng, 10, vocab=50, max_len=40)
    packed = pack_dataset(_dataset(records), 8, "next-fit", split_long=True)
    meta = packed_metadata(packed)
    assert meta["binding"]["vocab_size"] == max(max(r["input_ids"]) for r in records) + 1
    assert meta["statistics"]["split_sources"] == sum(len(r["input_ids"]) > 9 for r in records)
    back = unpack_dataset(packed)
    for rid, ids, start, end in zip(
        back["id"], back["input_ids"], back["range_start"], back["range_end"], strict=True
    ):
        assert ids == next(r for r in records if r["id"] == rid)["input_ids"][start:end]
    other = Binding(7, "x", "y")
    with pytest.raises(BindingMismatch):
        list(to_batches(packed, expected_binding=other))
    with pytest.raises(InvalidInput, match="no seqpack metadata"):
        unpack_dataset(datasets.Dataset.from_dict({"tokens": [[1]]}))
