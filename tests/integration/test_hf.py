import datasets
import numpy as np
import pytest

from exactpack import Binding, BindingMismatch, PackConfig, materialize, plan_rows
from exactpack.core.errors import InvalidInput
from exactpack.hf.datasets_io import (
    pack_dataset,
    packed_metadata,
    to_batches,
    unpack_dataset,
)
from exactpack.io.readers import load_examples
from exactpack.io.shards import REQUIRED, shard_table
from exactpack.pipeline.local import pack_table
from exactpack.verify.fixture import FIXTURE_DOCUMENTS, fixture_epoch

from support.packed_helpers import assert_same_batches, expected_flags, random_records


def _dataset(records):
    return datasets.Dataset.from_list([{**r, "labels": r.get("labels")} for r in records])


def test_fixture_packs_into_one_dataset_row_per_packed_row():
    docs = list(FIXTURE_DOCUMENTS.values())
    ds = datasets.Dataset.from_dict({"id": list(FIXTURE_DOCUMENTS), "input_ids": docs})
    packed = pack_dataset(ds, 6, "next-fit", vocab_size=266, max_rows_per_batch=2)
    assert isinstance(packed, datasets.Dataset) and len(packed) == 2
    assert packed.column_names == [*REQUIRED, "source_ids"] == packed_metadata(packed)["columns"]
    assert packed["tokens"] == [docs[0] + docs[1], docs[2]]
    assert packed["pair_counts"] == [[3, 2], [4]]
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
    packed = pack_dataset(_dataset(records), 8, "next-fit", cut_long=True)
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
    with pytest.raises(InvalidInput, match="no exactpack metadata"):
        unpack_dataset(datasets.Dataset.from_dict({"tokens": [[1]]}))


def _arrow_dataset(records, fingerprint=None):
    import pyarrow as pa

    table = pa.table(
        {
            "id": [r["id"] for r in records],
            "input_ids": pa.array([r["input_ids"] for r in records], pa.list_(pa.int32())),
            "labels": pa.array([r.get("labels") for r in records], pa.list_(pa.int64())),
        }
    )
    return datasets.Dataset(datasets.table.InMemoryTable(table), fingerprint=fingerprint)


@pytest.mark.parametrize("policy", ["next-fit", "best-fit-decreasing", "stream-best-fit"])
def test_the_output_equals_the_in_memory_rows_and_hashes_nothing(rng, policy, monkeypatch):
    """Zero-copy in and out: the same table as packing in memory, a fingerprint derived from
    the input's and the options (datasets never hashes the data), small chunks or large."""
    records = random_records(rng, 300, vocab=700, max_len=50)
    ds = _arrow_dataset(records, fingerprint="input-fp")

    def no_hashing(*args, **kwargs):
        raise AssertionError("datasets hashed the data")

    monkeypatch.setattr(datasets.arrow_dataset, "generate_fingerprint", no_hashing)
    one = pack_dataset(ds, 64, policy, vocab_size=700, shard_tokens=500)
    small = pack_dataset(ds, 64, policy, vocab_size=700, shard_tokens=500, chunk_bytes=700)
    table = load_examples(ds, vocab_size=700, split_id=packed_metadata(one)["binding"]["split_id"])
    _, rows = pack_table(table, 64, policy)
    want = shard_table(rows)
    for packed in (one, small):
        assert packed.with_format("arrow")[:].combine_chunks().equals(want.combine_chunks())
        assert packed._fingerprint != ds._fingerprint
    other = pack_dataset(ds, 72, policy, vocab_size=700, shard_tokens=500)
    assert other._fingerprint != one._fingerprint  # the options are part of it
    renamed = _arrow_dataset(records, fingerprint="other-fp")
    again = pack_dataset(renamed, 64, policy, vocab_size=700, shard_tokens=500)
    assert again._fingerprint != one._fingerprint
    meta = packed_metadata(one)
    assert meta["binding"]["split_id"].startswith("datasets:")  # from the fingerprint
    assert meta["binding"]["split_id"] != packed_metadata(again)["binding"]["split_id"]


def test_a_memory_mapped_input_gives_a_memory_mapped_output(tmp_path, rng):
    records = random_records(rng, 50, vocab=300, max_len=20)
    _arrow_dataset(records).save_to_disk(str(tmp_path / "ds"))
    ds = datasets.load_from_disk(str(tmp_path / "ds"))
    assert ds.cache_files
    packed = pack_dataset(ds, 32, vocab_size=300)
    files = [c["filename"] for c in packed.cache_files]
    assert len(files) == 1 and files[0].startswith(str(tmp_path / "ds"))
    assert not any(p.name.endswith(".part") for p in (tmp_path / "ds").iterdir())
    in_memory = pack_dataset(_arrow_dataset(records), 32, vocab_size=300)
    assert not in_memory.cache_files
    assert packed.with_format("arrow")[:].equals(in_memory.with_format("arrow")[:])
    back = unpack_dataset(packed)
    assert back["input_ids"] == [r["input_ids"] for r in records]
