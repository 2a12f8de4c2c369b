"""StreamDataset: documents -> StreamPacker -> scheduled model calls; resume; ranks; workers."""

import numpy as np
import pytest
from torch.utils.data import DataLoader

from exactpack import (
    ByteTokenizer,
    ExampleTable,
    InvalidInput,
    OversizedExample,
    SequenceExample,
    cut_long,
    plan_rows,
)
from exactpack.core.compact import compact_rows
from exactpack.training.packed_data import PackedCollator
from exactpack.training.stream import StreamDataset

from support.packed_helpers import assert_same_batches, recovered_examples
from support.strategies import BINDING

PACKER = {"lookahead": 8, "max_open_rows": 4, "seed": 3}


def documents(seed, n=120, longest=11):
    rng = np.random.default_rng(seed)
    return [
        rng.integers(0, 266, size=int(rng.integers(2, longest + 1))).astype(np.int32)
        for _ in range(n)
    ]


def reference_batches(docs, capacity, per_call, split=False):
    """What stream-best-fit over the same examples packs, in calls of ``per_call`` rows."""
    examples = [
        SequenceExample.from_document(d, source_id=str(i), partition="train", binding=BINDING)
        for i, d in enumerate(docs)
    ]
    table = ExampleTable.from_examples(examples, "train", BINDING)
    if split:
        table, _ = cut_long(table, capacity)
    plan = plan_rows(table.lengths, capacity, "stream-best-fit", **PACKER)
    return list(compact_rows(table, plan).batches(per_call))


def make(docs, **kw):
    args = {"binding": BINDING, "max_length": 10, "rows_per_micro_batch": 3, "read_chunk": 7}
    return StreamDataset(docs, **(args | PACKER | kw))


@pytest.mark.parametrize("split", [False, True])
def test_one_rank_yields_exactly_the_stream_best_fit_packing(split):
    docs = documents(0, longest=25 if split else 11)
    got = [item.batch for item in make(docs, cut_long=split)]
    assert_same_batches(got, reference_batches(docs, 10, 3, split))


def test_stop_and_restore_continues_identically_at_every_point():
    docs = documents(1)
    want = [item.batch for item in make(docs)]
    for k in range(len(want) + 1):
        ds = make(docs)
        it = iter(ds)
        head = [next(it).batch for _ in range(k)]
        fresh = make(docs)
        fresh.load_state_dict(ds.state_dict())
        assert_same_batches(head + [item.batch for item in fresh], want)
    mismatched = make(docs).state_dict() | {"capacity": 11}
    with pytest.raises(InvalidInput, match="capacity"):
        make(docs).load_state_dict(mismatched)


def test_resume_needs_the_same_documents_again():
    docs = documents(2)
    ds = make(docs)
    it = iter(ds)
    for _ in range(5):
        next(it)
    state = ds.state_dict()
    other = make(documents(3))
    other.load_state_dict(state)
    with pytest.raises(InvalidInput):
        list(other)


def test_ranks_get_equal_slots_and_all_rows_once_with_step_counts():
    docs = documents(4, n=154)
    world, micro = 2, 3
    per_rank = [list(make(docs, world_size=world, rank=r, micro_batches=micro)) for r in range(2)]
    assert len(per_rank[0]) == len(per_rank[1]) and len(per_rank[0]) % micro == 0
    one = make(docs, rows_per_micro_batch=1)
    rows_one = sum(item.batch.shape[0] for item in one)
    all_rows = sorted(r for rank in per_rank for item in rank for r in item.slot.rows)
    assert all_rows == list(range(rows_one))
    for a, b in zip(*per_rank, strict=True):
        assert (a.slot.step, a.slot.micro) == (b.slot.step, b.slot.micro)
        total = sum(
            x.batch.eligible_count for rank in per_rank for x in rank if x.slot.step == a.slot.step
        )
        assert a.slot.step_eligible == b.slot.step_eligible == total
    short = rows_one % (world * micro * 3)
    assert 0 < short < world * micro  # the short last step has explicitly empty slots
    empty = sum(item.batch.shape[0] == 0 for rank in per_rank for item in rank)
    assert empty == world * micro - short
    got = recovered_examples([item.batch for rank in per_rank for item in rank])
    assert sorted(got) == list(range(len(docs)))
    for ordinal, ex in got.items():
        assert ex["tokens"] == docs[ordinal].tolist()


def test_text_and_mapping_documents_and_errors():
    tok = ByteTokenizer()
    texts = ["hello", "packed rows", "x y"]
    items = [item.batch for item in make(texts, tokenizer=tok, max_length=16)]
    got = recovered_examples(items)
    assert [got[i]["tokens"] for i in range(3)] == [tok.encode(t).tolist() for t in texts]
    labels = [-100, -100, 5, 6]
    mapped = [{"input_ids": [0, 4, 5, 6], "id": "m", "labels": labels}]
    batch = next(iter(make(mapped))).batch
    assert batch.loss_mask[0, :3].tolist() == [False, True, True]
    assert batch.occurrences.source_ids.tolist() == ["m"]
    with pytest.raises(OversizedExample, match="document row 0"):
        list(make([list(range(20))]))
    with pytest.raises(InvalidInput, match="tokenizer"):
        list(make(["text"]))
    with pytest.raises(InvalidInput, match="needs at least 2"):
        list(make([[5]]))


def test_dataloader_workers_split_slots_in_order():
    docs = documents(5, n=60)
    want = [PackedCollator()(item)["input_ids"] for item in make(docs)]
    loader = DataLoader(make(docs), batch_size=None, num_workers=2, collate_fn=PackedCollator())
    got = [f["input_ids"] for f in loader]
    assert len(got) == len(want)
    assert all(a.equal(b) for a, b in zip(got, want, strict=True))
