"""Integrity: checksums and bindings on load, partitions kept apart, provenance of every cell.

Also the end-to-end invariants as properties: next-fit keeps every occurrence
whole, once and in order through the Parquet store, and the loss does not
depend on what padding or unsupervised cells hold (NaN and inf included).
"""

import re

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from exactpack import (
    BindingMismatch,
    ExampleTable,
    InvalidInput,
    PackConfig,
    SequenceExample,
    Split,
    SplitMismatch,
    pack_examples,
)
from exactpack.core.loss import token_weighted_loss
from exactpack.io.store import load_packed
from exactpack.pipeline.local import pack_path

from support.integrity_cases import DAMAGES, Damage, make_packed, run_damage
from support.packed_helpers import random_records, recovered_examples, write_jsonl
from support.strategies import BINDING, packed_epochs

torch.set_num_threads(1)
VOCAB = 500


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return make_packed(tmp_path_factory.mktemp("packed"))


def test_the_fixture_output_has_several_shards_and_loads(packed):
    store = load_packed(packed[0])
    assert len(store.manifest["shards"]) >= 3
    assert len(recovered_examples(store)) == len(packed[1])


@pytest.mark.parametrize("case", DAMAGES, ids=lambda c: c.name)
def test_a_damaged_output_or_a_wrong_expectation_is_refused(packed, tmp_path, case: Damage):
    error, message = run_damage(case, packed[0], tmp_path)
    assert error is case.error, message
    for needle in case.needles:
        assert needle in message, (needle, message)


def test_files_the_manifest_does_not_list_are_never_read(packed, tmp_path):
    """A reader trusts only the manifest: a killed run's shards, a stray copy or the user's
    files in the folder change nothing that loads."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(packed[0], out)
    want = [b.segments.tolist() for b in load_packed(out)]
    first = out / load_packed(out).manifest["shards"][0]["file"]
    (out / "shard-0002-00000.parquet").write_bytes(first.read_bytes())  # a killed run's
    (out / "shard-00099.parquet").write_bytes(b"garbage")
    (out / "notes.txt").write_text("mine")
    assert [b.segments.tolist() for b in load_packed(out, integrity="full")] == want


def test_every_shard_is_hashed_on_load(packed, tmp_path, monkeypatch):
    from exactpack.io import integrity as verify_mod

    seen = []
    real = verify_mod.sha256_file
    monkeypatch.setattr(verify_mod, "sha256_file", lambda p: seen.append(p.name) or real(p))
    store = load_packed(packed[0])
    assert seen == [s["file"] for s in store.manifest["shards"]]


# ---------------------------------------------------------------- partitions


def _split_records(tmp_path, rng):
    records = random_records(rng, 40, vocab=VOCAB, max_len=12)
    for i, r in enumerate(records):
        r["partition"] = "validation" if i % 4 == 0 else "train"
    return records


def test_train_and_validation_rows_are_packed_apart_and_never_mixed(tmp_path, rng):
    records = _split_records(tmp_path, rng)
    mixed = write_jsonl(tmp_path / "mixed.jsonl", records)
    with pytest.raises(SplitMismatch, match=r"mixed\.jsonl line 1: .* 'validation'"):
        pack_path(mixed, tmp_path / "bad", max_length=16, vocab_size=VOCAB)
    assert not (tmp_path / "bad").exists()
    outs = {}
    for part in ("train", "validation"):
        subset = [r for r in records if r["partition"] == part]
        data = write_jsonl(tmp_path / f"{part}.jsonl", subset)
        outs[part] = tmp_path / part
        pack_path(data, outs[part], max_length=16, vocab_size=VOCAB, split=part)
        got = recovered_examples(load_packed(outs[part], expected_split=part))
        assert sorted(e["source_id"] for e in got.values()) == sorted(r["id"] for r in subset)
    train = load_packed(outs["train"])
    with pytest.raises(SplitMismatch, match="holds split 'validation', not 'train'"):
        load_packed(outs["validation"], expected_split="train")
    # The split receipt differs too: the training binding refuses validation data.
    with pytest.raises(BindingMismatch, match="split_id"):
        load_packed(outs["validation"], train.binding)


@settings(max_examples=60)
@given(st.lists(st.sampled_from(["train", "validation", "test"]), min_size=1, max_size=8))
def test_a_batch_never_holds_an_example_of_another_partition(parts):
    examples = [
        SequenceExample.from_document(
            [0, 10 + i, 1], source_id=f"s{i}", partition=p, binding=BINDING
        )
        for i, p in enumerate(parts)
    ]
    if set(parts) != {"train"}:
        with pytest.raises(SplitMismatch):
            pack_examples("train", examples, BINDING, PackConfig(4, 2))
        table = ExampleTable.from_examples(
            [e for e in examples if e.partition.value == parts[0]], parts[0], BINDING
        )
        if parts[0] != "train":
            with pytest.raises(SplitMismatch):
                pack_examples("train", table, BINDING, PackConfig(4, 2))
        return
    epoch = pack_examples("train", examples, BINDING, PackConfig(4, 2))
    assert all(b.partition is Split.TRAIN for b in epoch.batches)


# ---------------------------------------------------------------- provenance


def _documents(records):
    return {r["id"]: r["input_ids"] for r in records}


def _check_cells(store, docs, rng, cells_per_batch):
    """Random cells: the token is the source document's at range_start + position (+1)."""
    checked = 0
    for batch in store:
        occ = batch.occurrences
        rows, cols = np.nonzero(batch.input_valid)
        for k in rng.choice(rows.shape[0], size=min(cells_per_batch, rows.shape[0]), replace=False):
            r, c = int(rows[k]), int(cols[k])
            i = int(np.flatnonzero((occ.row == r) & (occ.col_start <= c) & (c < occ.col_end))[0])
            assert batch.segments[r, c] == occ.segment[i]
            doc = docs[str(occ.source_ids[i])]
            at = int(occ.range_starts[i]) + int(batch.positions[r, c])
            assert batch.inputs[r, c] == doc[at]
            assert batch.targets[r, c] == doc[at + 1]
            assert at + 1 < int(occ.range_ends[i]) <= len(doc)
            checked += 1
    return checked


@pytest.mark.parametrize("policy", ["next-fit", "best-fit-decreasing", "stream-best-fit"])
def test_every_cell_traces_back_to_its_source_document(tmp_path, rng, policy):
    records = random_records(rng, 150, vocab=VOCAB, max_len=70)
    data = write_jsonl(tmp_path / "d.jsonl", records)
    pack_path(
        data,
        tmp_path / "out",
        max_length=24,
        vocab_size=VOCAB,
        policy=policy,
        cut_long=True,
        max_rows_per_batch=3,
    )
    checked = _check_cells(load_packed(tmp_path / "out"), _documents(records), rng, 8)
    assert checked > 500


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 12), st.booleans())
def test_next_fit_through_the_store_is_whole_once_and_in_order(tmp_path_factory, seed, cap, split):
    rng = np.random.default_rng(seed)
    records = random_records(rng, int(rng.integers(1, 25)), vocab=VOCAB, max_len=3 * cap)
    if not split:
        records = [r for r in records if len(r["input_ids"]) - 1 <= cap] or records[:0]
    assume(records)
    folder = tmp_path_factory.mktemp("nf")
    data = write_jsonl(folder / "d.jsonl", records)
    pack_path(
        data,
        folder / "out",
        max_length=cap,
        vocab_size=VOCAB,
        policy="next-fit",
        cut_long=split,
        max_rows_per_batch=2,
    )
    store = load_packed(folder / "out")
    got = recovered_examples(store)
    assert sorted(got) == list(range(len(got)))  # every occurrence once
    # Supplied order is storage order, and the pieces tile each document in order.
    place = [
        (b.first_row + int(r), int(c)) for b in store for r, c in zip(*_starts(b), strict=True)
    ]
    assert place == sorted(place)
    pieces = [got[i] for i in range(len(got))]
    rebuilt = {}
    for p in pieces:
        s, e = p["range"]
        rebuilt.setdefault(p["source_id"], []).append((s, e, p["tokens"]))
    assert list(rebuilt) == [r["id"] for r in records]  # documents in supplied order
    for r in records:
        spans = rebuilt[r["id"]]
        assert spans[0][0] == 0 and spans[-1][1] == len(r["input_ids"])
        for (s, e, tokens), nxt in zip(spans, [*spans[1:], None], strict=True):
            assert tokens == r["input_ids"][s:e]  # whole
            assert nxt is None or nxt[0] == e - 1  # consecutive, one token overlap


def _starts(batch):
    order = np.argsort(batch.occurrences.ordinal)
    return batch.occurrences.row[order], batch.occurrences.col_start[order]


# ---------------------------------------------------------------- loss and padding


@settings(max_examples=60, deadline=None)
@given(packed_epochs(max_capacity=8, max_examples=6), st.data())
def test_loss_ignores_whatever_excluded_cells_hold(case, data):
    """Padding and unsupervised cells may hold NaN, inf or garbage: loss and gradient stay."""
    _, _, epoch = case
    batch = epoch.batches[0]
    assume(batch.eligible_count > 0)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    logits = rng.normal(size=(*batch.shape, BINDING.vocab_size))
    excluded = ~batch.loss_mask
    poison = data.draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e308, "mixed"]))
    dirty = logits.copy()
    if poison == "mixed":
        choice = rng.choice([np.nan, np.inf, -np.inf, 1e300], size=dirty[excluded].shape)
        dirty[excluded] = choice
    else:
        dirty[excluded] = poison
    clean = token_weighted_loss(logits, batch)
    assert token_weighted_loss(dirty, batch) == clean
    t_dirty = torch.tensor(dirty, requires_grad=True)
    result = token_weighted_loss(t_dirty, batch)
    result.mean.backward()
    assert abs(result.sum.item() - clean.sum) <= 1e-10 + 1e-9 * abs(clean.sum)
    grad = t_dirty.grad.numpy()
    assert np.isfinite(grad).all() and not grad[excluded].any()


# ---------------------------------------------------------------- damage that reaches every shard


def _which(n: int) -> dict[str, int]:
    return {"first": 0, "middle": n // 2, "last": n - 1}


@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("how", ["bit-flip", "rehashed-token", "rehashed-row-removed"])
def test_damage_to_the_first_middle_or_last_shard_is_refused(packed, tmp_path, where, how):
    """Every shard is checked, the last one too (a loop that stops one short passes the
    other two)."""
    import shutil

    from support.integrity_cases import _drop_last_row, _edit_shard, _set_token, load_all

    out = tmp_path / "out"
    shutil.copytree(packed[0], out)
    shards = load_packed(out).manifest["shards"]
    k = _which(len(shards))[where]
    path = out / shards[k]["file"]
    if how == "bit-flip":
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
        needle = f"{shards[k]['file']}: checksum mismatch"
    else:
        change = _set_token(VOCAB + 1) if how == "rehashed-token" else _drop_last_row
        _edit_shard(change, k)(out)
        needle = f"{shards[k]['file']}: " + (
            "token id 501 is outside" if how == "rehashed-token" else "holds rows"
        )
    for verify in (True, False, "full"):
        if how == "bit-flip" and verify is False:
            continue  # unchecked bytes: a flip may still decode (the checksum is the check)
        with pytest.raises(InvalidInput, match=re.escape(needle)):
            load_all(out, verify)


@pytest.fixture(scope="module")
def trl_packed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trl")
    records = random_records(np.random.default_rng(4), 120, vocab=VOCAB, max_len=30)
    data = write_jsonl(folder / "data.jsonl", records)
    pack_path(data, folder / "out", max_length=32, vocab_size=VOCAB, format="trl",
              max_rows_per_batch=2, shard_tokens=200)  # fmt: skip
    return folder / "out"


@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("how", ["bit-flip", "rehashed-label", "rehashed-token"])
def test_damage_to_any_shard_of_a_trl_output_is_refused(trl_packed, tmp_path, where, how):
    import json
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from exactpack.hf.trl_training import load_trl
    from exactpack.io.shards import sha256_file

    out = tmp_path / "out"
    shutil.copytree(trl_packed, out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["shards"]) >= 3
    k = _which(len(manifest["shards"]))[where]
    entry = manifest["shards"][k]
    path = out / entry["file"]
    if how == "bit-flip":
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
        needle = "checksum mismatch"
    else:
        table = pq.read_table(path)
        name = "labels" if how == "rehashed-label" else "input_ids"
        values = table.column(name).to_pylist()
        values[0][1] = (values[0][1] + 1) % VOCAB if how == "rehashed-label" else VOCAB + 3
        column = pa.array(values, table.schema.field(name).type)
        table = table.set_column(table.schema.get_field_index(name), name, column)
        pq.write_table(table, path)
        entry.update(bytes=path.stat().st_size, sha256=sha256_file(path))
        (out / "manifest.json").write_text(json.dumps(manifest))
        needle = (
            "rows, seq_lengths or labels disagree"
            if how == "rehashed-label"
            else "a token id is outside [0, 500)"
        )
    with pytest.raises(InvalidInput, match=re.escape(f"{entry['file']}: {needle}")):
        load_trl(out, cache_dir=str(tmp_path / "cache"))


@pytest.mark.parametrize("name", ["loss-bits-dropped", "float-token-ids", "columns-listed-wrong"])
def test_packed_dataset_refuses_what_the_format_forbids(packed, tmp_path, name):
    """The training path holds shards to the format at its default depth, row_stats too."""
    import shutil

    from exactpack.training.packed_data import PackedBatches

    case = next(c for c in DAMAGES if c.name == name)
    out = tmp_path / "out"
    shutil.copytree(packed[0], out)
    case.damage(out)
    data = PackedBatches(out)
    with pytest.raises(InvalidInput, match=re.escape(case.needles[0])):
        data.row_stats()
    with pytest.raises(InvalidInput, match=re.escape(case.needles[0])):
        for i in range(len(data)):
            data[i]


def test_a_claimed_pair_count_is_checked_before_memory_is_allocated_for_it(packed, tmp_path):
    """An edited shard (checksums fixed) whose first occurrence claims 2**31 - 1 pairs is
    refused as damaged without allocating for the claim (it once allocated a 2 GiB mask
    first; NumPy reports its allocations to tracemalloc)."""
    import shutil
    import tracemalloc

    import pyarrow.parquet as pq

    from support.integrity_cases import _edit_shard

    out = tmp_path / "out"
    shutil.copytree(packed[0], out)
    _edit_shard(lambda c: (c["pair_counts"][0].__setitem__(0, 2**31 - 1), c.pop("loss_bits")))(out)
    assert pq.read_table(next(out.glob("shard-*-00001.parquet"))).num_rows > 0
    tracemalloc.start()
    try:
        with pytest.raises(InvalidInput, match="rows are inconsistent"):
            load_packed(out).shard_rows(1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 << 20, peak
