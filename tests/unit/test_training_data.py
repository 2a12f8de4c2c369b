"""PyTorch data path: row selection, PackedBatches, collator, layout, RowSampler, DataLoader."""

import dataclasses
import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from exactpack import (
    ExampleTable,
    InvalidInput,
    SequenceExample,
    Split,
    SplitMismatch,
    plan_rows,
)
from exactpack.core.compact import compact_rows
from exactpack.io.store import write_packed
from exactpack.nn.attention import AttentionLayout
from exactpack.training.distributed import RowSampler, RowStats
from exactpack.training.packed_data import (
    PackedBatches,
    PackedCollator,
    ScheduledBatch,
    concat_batches,
    decoder_inputs,
    empty_batch,
    layout_from_features,
    move_features,
    select_rows,
)
from exactpack.verify.decoder import TinyDecoder
from exactpack.verify.fixture import fixture_batch, fixture_binding

from support.packed_helpers import BATCH_FIELDS, assert_same_batches
from support.strategies import BINDING, example_lists, packed_epochs

LAYOUT_FIELDS = ("valid", "segments", "positions", "cu_seqlens")


def whole(epoch):
    return concat_batches(epoch.batches)


def test_fixture_collates_to_the_views_of_the_batch():
    batch = fixture_batch()
    f = PackedCollator(pad_id=2)(batch)
    cu = batch.cu_seqlens()
    assert f["input_ids"].tolist() == np.where(batch.input_valid, batch.inputs, 2).tolist()
    # Pre-shifted targets are shift_labels; labels are transformers' unshifted labels.
    assert f["shift_labels"].tolist() == np.where(batch.loss_mask, batch.targets, -100).tolist()
    assert f["labels"].tolist() == [
        [-100, 99, 100, -100, 101, -100],
        [-100, 102, 103, 104, -100, -100],
    ]
    assert f["position_ids"].tolist() == batch.position_ids().tolist()
    assert f["segment_ids"].tolist() == batch.segments.tolist()
    for key in ("cu_seq_lens_q", "cu_seq_lens_k"):
        assert f[key].dtype == torch.int32 and f[key].tolist() == cu.cu_seqlens.tolist()
    assert f["max_length_q"] == f["max_length_k"] == cu.max_seqlen == 4
    assert f["num_items_in_batch"] == f["num_eligible"] == batch.eligible_count == 9
    keys = ("input_ids", "labels", "shift_labels", "position_ids")
    assert all(f[k].dtype == torch.int64 for k in keys)
    assert "seq_idx" not in f  # rows mode: seq_idx belongs to flattened outputs
    assert "attention_mask" not in f and "permission_mask" not in f
    masked = PackedCollator(permission_mask=True)(batch)["permission_mask"]
    assert masked.shape == (2, 1, 6, 6) and np.array_equal(masked[:, 0].numpy(), batch.dense_mask())


@settings(max_examples=60)
@given(packed_epochs())
def test_flatten_gathers_the_valid_cells_of_rows_mode(case):
    _, _, epoch = case
    for batch in epoch.batches:
        rows, flat = PackedCollator()(batch), PackedCollator(flatten=True)(batch)
        index = rows["valid_index"]
        for key in ("input_ids", "labels", "shift_labels", "position_ids", "segment_ids"):
            assert torch.equal(flat[key], rows[key].reshape(-1)[index][None]), key
        assert torch.equal(flat["cu_seq_lens_q"], rows["cu_seq_lens_q"])
        assert "valid_index" not in flat
        # seq_idx: int32, 0-based per call, one index per flattened example
        lengths = flat["cu_seq_lens_q"].diff().long()
        want = torch.repeat_interleave(torch.arange(lengths.numel(), dtype=torch.int32), lengths)
        assert flat["seq_idx"].dtype == torch.int32 and torch.equal(flat["seq_idx"][0], want)
        # every flattened sequence starts at position 0 and counts up
        starts = flat["cu_seq_lens_q"].long()
        assert bool((flat["position_ids"][0, starts[:-1]] == 0).all())


@settings(max_examples=60)
@given(packed_epochs())
def test_compact_columns_equal_the_padded_cells_views(case):
    """The collator reads compact rows; every column equals the padded batch's own view."""
    from exactpack.training.labels import model_labels, shift_labels
    from exactpack.training.rows import compact_of

    _, _, epoch = case
    for batch in epoch.batches:
        f = PackedCollator(pad_id=1)(compact_of(batch))
        cu = batch.cu_seqlens()  # recomputed from the padded positions
        assert f["input_ids"].tolist() == np.where(batch.input_valid, batch.inputs, 1).tolist()
        assert f["labels"].tolist() == model_labels(batch).tolist()
        assert f["shift_labels"].tolist() == shift_labels(batch).tolist()
        assert f["position_ids"].tolist() == batch.position_ids().tolist()
        assert f["segment_ids"].tolist() == batch.segments.tolist()
        assert f["cu_seq_lens_q"].tolist() == cu.cu_seqlens.tolist()
        assert f["valid_index"].tolist() == cu.valid_index.tolist()
        assert f["max_length_q"] == cu.max_seqlen and f["num_eligible"] == batch.eligible_count
        assert_same_batches([compact_of(batch).to_batch()], [batch])


@settings(max_examples=60)
@given(packed_epochs())
def test_layout_from_features_equals_layout_from_batch(case):
    _, _, epoch = case
    for batch in epoch.batches:
        got = layout_from_features(PackedCollator()(batch))
        want = AttentionLayout.from_batch(batch)
        for name in (*LAYOUT_FIELDS, "valid_index"):
            a, b = getattr(got, name), getattr(want, name)
            assert a.dtype == b.dtype and torch.equal(a, b), name
        assert all(map(torch.equal, got.key_bounds(), want.key_bounds()))
        assert got.max_seqlen == want.max_seqlen
        assert np.array_equal(got.lengths, want.lengths)
        for window in (1, 3):  # the windowed views come from the same predicate
            assert np.array_equal(got.range_mask(window).numpy(), batch.dense_mask(window))


@settings(max_examples=60)
@given(packed_epochs())
def test_collated_ids_rebuild_the_predicate(case):
    """segment_ids / position_ids (rows) and cu_seq_lens (flat) give back ``dense_mask()``."""
    _, _, epoch = case
    for batch in epoch.batches:
        f = PackedCollator(permission_mask=True)(batch)
        seg, pos = f["segment_ids"], f["position_ids"]
        valid = seg != -1
        rebuilt = (
            (seg[:, :, None] == seg[:, None, :])
            & (pos[:, None, :] <= pos[:, :, None])
            & valid[:, :, None]
            & valid[:, None, :]
        )
        assert np.array_equal(rebuilt.numpy(), batch.dense_mask())
        assert torch.equal(f["permission_mask"][:, 0], rebuilt)
        flat = PackedCollator(flatten=True)(batch)
        cu = flat["cu_seq_lens_q"].tolist()
        for a, b in itertools.pairwise(cu):  # one segment per span, positions 0..l-1
            assert flat["segment_ids"][0, a:b].unique().numel() == 1
            assert flat["position_ids"][0, a:b].tolist() == list(range(b - a))
        assert bool((flat["segment_ids"] != -1).all())


def test_decoder_runs_from_collated_tensors_alone():
    torch.set_num_threads(1)
    batch = fixture_batch()
    model = TinyDecoder("large")
    features = move_features(PackedCollator(pad_id=7)(batch), "cpu")
    assert torch.equal(model(*decoder_inputs(features)), model.forward_packed(batch))


@settings(max_examples=80)
@given(packed_epochs(), st.randoms(use_true_random=False))
def test_select_then_concat_rebuilds_any_row_order(case, rnd):
    _, _, epoch = case
    batch = whole(epoch)
    rows = list(range(batch.shape[0]))
    rnd.shuffle(rows)
    picked = select_rows(batch, rows)
    for name in BATCH_FIELDS:
        assert np.array_equal(getattr(picked, name), getattr(batch, name)[rows]), name
    occ = picked.occurrences
    assert sorted(occ.ordinal.tolist()) == sorted(batch.occurrences.ordinal.tolist())
    for i in range(len(occ)):  # each occurrence's cells carry its segment in its new row
        r, a, b = int(occ.row[i]), int(occ.col_start[i]), int(occ.col_end[i])
        assert (picked.segments[r, a:b] == occ.segment[i]).all()
    keys = list(zip(occ.row.tolist(), occ.col_start.tolist(), strict=True))
    assert keys == sorted(keys)  # storage order
    back = concat_batches([select_rows(batch, [r]) for r in range(batch.shape[0])])
    assert_same_batches([back], [batch])
    undo = select_rows(picked, np.argsort(rows))
    for name in BATCH_FIELDS:
        assert np.array_equal(getattr(undo, name), getattr(batch, name)), name
    assert np.array_equal(undo.occurrences.ordinal, batch.occurrences.ordinal)
    assert np.array_equal(undo.occurrences.row, batch.occurrences.row)


def test_select_rows_errors_and_empty():
    batch = fixture_batch()
    with pytest.raises(InvalidInput, match="repeats a row"):
        select_rows(batch, [0, 0])
    with pytest.raises(InvalidInput, match="outside"):
        select_rows(batch, [2])
    none = select_rows(batch, [])
    assert none.shape == (0, 6) and len(none.occurrences) == 0 and none.eligible_count == 0
    assert_same_batches([empty_batch(6, "train", fixture_binding())], [none])


def _write(tmp_path, examples, capacity, per_call=3, shard_tokens=40):
    table = ExampleTable.from_examples(examples, Split.TRAIN, BINDING)
    plan = plan_rows(table.lengths, capacity, "best-fit-decreasing")
    rows = compact_rows(table, plan)
    path = tmp_path / "packed"
    write_packed(rows, path, max_rows_per_batch=per_call, shard_tokens=shard_tokens)
    return path, list(rows.batches(per_call))


def _examples(seed, n=40, capacity=8):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(1, capacity + 1))
        out.append(
            SequenceExample.from_document(
                rng.integers(0, 266, size=length + 1),
                source_id=f"d{i}",
                partition="train",
                binding=BINDING,
                loss_mask=rng.random(length) < 0.7,
            )
        )
    return out, capacity


@settings(max_examples=25, deadline=None)
@given(example_lists(max_capacity=8, max_examples=14), st.integers(1, 3), st.integers(8, 60))
def test_packed_dataset_reads_calls_rows_and_stats(tmp_path_factory, case, per_call, shard):
    examples, capacity = case
    path, want = _write(tmp_path_factory.mktemp("d"), examples, capacity, per_call, shard)
    ds = PackedBatches(path, BINDING, cache_shards=1)
    assert len(ds) == len(want)
    assert_same_batches([ds[i] for i in range(len(ds))], want)
    everything = concat_batches(want)
    ids = np.random.default_rng(len(examples)).permutation(ds.num_rows)[: max(1, ds.num_rows // 2)]
    assert_same_batches([ds.rows(ids)], [select_rows(everything, ids)])
    got, expect = ds.row_stats(), RowStats.from_batches(want)
    for name in ("tokens", "eligible", "attention"):
        assert np.array_equal(getattr(got, name), getattr(expect, name)), name
    assert got.eligible.sum() == sum(b.eligible_count for b in want)


def test_row_stats_of_the_fixture():
    stats = RowStats.from_batches([fixture_batch()])
    lengths = [[3, 2], [4]]
    assert stats.tokens.tolist() == [sum(r) for r in lengths]
    assert stats.attention.tolist() == [sum(x * x for x in r) for r in lengths]
    assert stats.eligible.tolist() == fixture_batch().loss_mask.sum(1).tolist()


@pytest.mark.parametrize("balance", ["tokens", "attention", "none"])
def test_sampler_gives_every_rank_equal_slots_and_every_row_once(tmp_path, balance):
    examples, capacity = _examples(1)
    path, _ = _write(tmp_path, examples, capacity)
    ds = PackedBatches(path)
    stats = ds.row_stats()
    world, micro, per = 3, 2, 3
    samplers = [
        RowSampler(
            stats,
            rows_per_micro_batch=per,
            micro_batches=micro,
            world_size=world,
            rank=r,
            seed=5,
            balance=balance,
        )
        for r in range(world)
    ]
    slots = [list(s) for s in samplers]
    assert len({len(s) for s in slots}) == 1 and len(slots[0]) == len(samplers[0])
    rows = sorted(r for rank in slots for s in rank for r in s.rows)
    assert rows == list(range(ds.num_rows))
    steps = samplers[0].schedule.steps
    for step in range(steps):
        in_step = [s for rank in slots for s in rank if s.step == step]
        assert len(in_step) == world * micro
        n = sum(int(stats.eligible[list(s.rows)].sum()) for s in in_step)
        assert {s.step_eligible for s in in_step} == {n}
        assert [s.micro for s in in_step if s.rank == 0] == list(range(micro))
    short = ds.num_rows % (world * micro * per)
    assert 0 < short < world * micro  # this case has a short last step with empty slots:
    assert sum(1 for rank in slots for s in rank if not s.rows) == world * micro - short
    item = ds[slots[1][0]]
    assert isinstance(item, ScheduledBatch)
    assert_same_batches([item.batch], [ds.rows(slots[1][0].rows)])


def test_sampler_is_deterministic_per_seed_and_epoch_and_resumes(tmp_path):
    examples, capacity = _examples(2)
    stats = RowStats.from_batches(_write(tmp_path, examples, capacity)[1])

    def make(**kw):
        return RowSampler(stats, rows_per_micro_batch=2, micro_batches=2, seed=9, **kw)

    a, b = make(), make()
    assert list(a) == list(b)
    b.set_epoch(1)
    assert list(a) != list(b)
    full = list(make())
    for k in (0, 1, 5, len(full) - 1, len(full)):
        s = make()
        it = iter(s)
        head = [next(it) for _ in range(k)]
        fresh = make()
        fresh.load_state_dict(s.state_dict())
        assert head + list(fresh) == full
    bad = make().state_dict() | {"seed": 1}
    with pytest.raises(InvalidInput, match="seed"):
        make().load_state_dict(bad)


def test_dataloader_stops_and_restores_with_identical_continuation(tmp_path):
    examples, capacity = _examples(3, n=60)
    path, _ = _write(tmp_path, examples, capacity)

    def loader():
        ds = PackedBatches(path, BINDING)
        sampler = RowSampler(ds.row_stats(), rows_per_micro_batch=3, micro_batches=2, seed=4)
        sampler.set_epoch(2)
        return sampler, DataLoader(
            ds, sampler=sampler, batch_size=None, collate_fn=PackedCollator()
        )

    _, full_loader = loader()
    full = list(full_loader)
    k = len(full) // 2 + 1
    sampler, first = loader()
    it = iter(first)
    head = [next(it) for _ in range(k)]
    state = sampler.state_dict()
    assert state["position"] == k and state["epoch"] == 2
    sampler2, second = loader()
    sampler2.load_state_dict(state)
    rest = list(second)
    assert len(head) + len(rest) == len(full)
    for got, want in zip(head + rest, full, strict=True):
        assert got["slot"] == want["slot"]
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(got[key], value), key
    steps = {f["slot"].step: f["num_items_in_batch"] for f in full}
    total = sum(f["num_eligible"] for f in full)
    assert sum(steps.values()) == total  # every step's denominator covers its own targets


def test_collator_rejects_what_it_cannot_collate():
    with pytest.raises(InvalidInput, match="cannot collate"):
        PackedCollator()({"input_ids": [1]})
    with pytest.raises(InvalidInput, match="pad_id"):
        PackedCollator(pad_id=-1)
    with pytest.raises(InvalidInput, match="flatten"):
        PackedCollator(flatten=True, permission_mask=True)
    b = fixture_batch()
    stacked = PackedCollator()([select_rows(b, [0]), select_rows(b, [1])])
    assert torch.equal(stacked["input_ids"], PackedCollator()(b)["input_ids"])


def test_a_training_collator_refuses_validation_rows():
    b = fixture_batch()
    assert torch.equal(
        PackedCollator(partition="train")(b)["input_ids"], PackedCollator()(b)["input_ids"]
    )
    held_out = dataclasses.replace(b, partition=Split.VALIDATION)
    with pytest.raises(SplitMismatch, match="expects train rows but got a validation"):
        PackedCollator(partition="train")(held_out)
    with pytest.raises(SplitMismatch, match="expects validation rows but got a train"):
        PackedCollator(partition="validation")(b)
    assert PackedCollator()(held_out)["num_eligible"] == 9  # no partition given: any


def test_packed_dataset_refuses_another_partition(tmp_path):
    examples, capacity = _examples(3, n=6)
    path, _ = _write(tmp_path, examples, capacity)
    assert len(PackedBatches(path, BINDING, expected_split="train")) > 0
    with pytest.raises(SplitMismatch, match="holds split 'train', not 'validation'"):
        PackedBatches(path, BINDING, expected_split="validation")
    store = PackedBatches(path).store
    with pytest.raises(SplitMismatch, match="not 'test'"):
        PackedBatches(store, expected_split=Split.TEST)
