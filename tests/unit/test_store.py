import dataclasses
import json
import re
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactpack import (
    Binding,
    BindingMismatch,
    ExampleTable,
    PackConfig,
    Split,
    materialize,
    plan_rows,
)
from exactpack.core.compact import compact_rows, gather_segments, span_labels
from exactpack.core.errors import InvalidInput
from exactpack.core.policies import POLICIES
from exactpack.io import shards as shards_mod
from exactpack.io.shards import FULL, REQUIRED, SCHEMA, arrow_to_rows, shard_table
from exactpack.io.store import MANIFEST, load_packed, write_packed
from exactpack.verify.fixture import fixture_binding, fixture_epoch, fixture_examples

from support.packed_helpers import assert_same_batches
from support.reference import reference_calls, split_examples
from support.strategies import BINDING, example_lists, scaled

#: dtypes of the cell arrays (the layout the readers and collators rely on).
CELL_DTYPES = {"inputs": "int32", "targets": "int32", "segments": "int32", "positions": "int32"}


def assert_cells_are_the_reference(batches, examples, plan, per, provenance=True):
    """Model calls equal the cells ``tests/support/reference.py`` writes from the examples and
    the plan's placements, one cell at a time (no ``fill_cells``, no ``materialize``)."""
    calls = reference_calls(examples, plan.row_of.tolist(), plan.start_of.tolist(), per,
                            plan.capacity)  # fmt: skip
    batches = list(batches)
    assert len(batches) == len(calls)
    first = 0
    for batch, (layout, placed) in zip(batches, calls, strict=True):
        for name, cells in layout.cells().items():
            got = getattr(batch, name)
            assert got.dtype == CELL_DTYPES.get(name, "bool"), name
            assert got.tolist() == cells, name
        occ = batch.occurrences
        records = list(zip(occ.ordinal.tolist(), occ.row.tolist(), occ.col_start.tolist(),
                           occ.col_end.tolist(), occ.segment.tolist(), strict=True))  # fmt: skip
        assert records == [(p.ordinal, p.row, p.start, p.end, p.ordinal) for p in placed]
        if provenance:
            assert occ.source_ids.tolist() == [examples[p.ordinal].source_id for p in placed]
            assert occ.example_ids.tolist() == [examples[p.ordinal].example_id for p in placed]
            ranges = list(zip(occ.range_starts.tolist(), occ.range_ends.tolist(), strict=True))
            assert ranges == [tuple(examples[p.ordinal].range) for p in placed]
        assert batch.first_row == first
        first += layout.rows


def _fixture_rows(policy="next-fit"):
    table = ExampleTable.from_examples(fixture_examples(), "train", fixture_binding())
    plan = plan_rows(table.lengths, 6, policy)
    return table, plan, compact_rows(table, plan)


def test_fixture_compact_rows_hold_windows_back_to_back():
    _, plan, rows = _fixture_rows()
    docs = [ex.window.tolist() for ex in fixture_examples()]
    arrow = shard_table(rows)
    # every target supervised and whole sources: no loss bits, example ids or ranges
    assert arrow.schema.names == [*REQUIRED, "source_ids"]
    assert arrow.column("tokens").to_pylist() == [docs[0] + docs[1], docs[2]]
    assert arrow.column("pair_counts").to_pylist() == [[3, 2], [4]]  # pairs, not tokens
    assert arrow.column("seq_starts").to_pylist() == [[0, 3], [0]]
    assert arrow.column("source_ids").to_pylist() == [["A", "B"], ["C"]]
    back = arrow_to_rows(
        arrow, capacity=6, partition=rows.partition, binding=rows.binding, where="t"
    )
    assert_cells_are_the_reference(back.batches(2), fixture_examples(), plan, 2)
    assert_same_batches(back.batches(2), fixture_epoch(2).batches)
    full = shard_table(rows, FULL)
    assert full.schema == SCHEMA
    # one bit per target, first target the high bit: row 0 has 3 + 2 targets, row 1 has 4
    assert full.column("loss_bits").to_pylist() == [bytes([0b11111000]), bytes([0b11110000])]
    assert full.column("range_ends").to_pylist() == [[4, 3], [5]]
    assert_cells_are_the_reference(rows.batches(2), fixture_examples(), plan, 2)


@settings(max_examples=scaled(80))
@given(example_lists(max_capacity=10, max_examples=12), st.sampled_from(sorted(POLICIES)))
def test_compact_rows_and_materialize_build_the_reference_cells(case, policy):
    examples, capacity = case
    table = ExampleTable.from_examples(examples, Split.TRAIN, BINDING)
    plan = plan_rows(table.lengths, capacity, policy)
    for per in (1, 3):
        for native in (True, False):
            got = compact_rows(table, plan, native=native).batches(per)
            assert_cells_are_the_reference(got, examples, plan, per)
        got = materialize(table, plan, PackConfig(capacity, per)).batches
        assert_cells_are_the_reference(got, examples, plan, per)


def test_numpy_and_native_gathers_agree(rng, monkeypatch):
    src = rng.integers(0, 1000, size=5000).astype(np.int32)
    lens = rng.integers(0, 40, size=300)
    starts = rng.integers(0, 5000 - 40, size=300)
    want = np.concatenate([src[s : s + n] for s, n in zip(starts, lens, strict=True)])
    assert np.array_equal(gather_segments(src, starts, lens), want)
    monkeypatch.setattr("exactpack.core.compact.GATHER_CHUNK", 64)  # many chunks
    assert np.array_equal(gather_segments(src, starts, lens, native=False), want)


def test_window_labels_mark_unsupervised_and_first_tokens(rng):
    lens = rng.integers(1, 9, size=50)
    tokens = rng.integers(0, 266, size=int((lens + 1).sum())).astype(np.int32)
    mask = rng.random(int(lens.sum())) < 0.5
    want, p, q = [], 0, 0
    for n in lens.tolist():
        want.append(-100)
        want += [
            int(t) if m else -100
            for t, m in zip(tokens[p + 1 : p + 1 + n], mask[q : q + n], strict=True)
        ]
        p, q = p + n + 1, q + n
    assert span_labels(tokens, mask, lens).tolist() == want
    assert span_labels(tokens, mask, lens, native=False).tolist() == want


def _random_examples(rng, n=200, capacity=32):
    from exactpack import SequenceExample

    examples = []
    for i in range(n):
        length = int(rng.integers(1, capacity + 1))
        mask = rng.random(length) < 0.7
        examples.append(
            SequenceExample.from_document(
                rng.integers(0, 266, size=length + 1),
                source_id=f"s{i}",
                partition="train",
                binding=BINDING,
                loss_mask=mask,
            )
        )
    return examples


def _packed(tmp_path, rng, name="out", policy="next-fit", per=4, shard_tokens=1000, **kw):
    examples = _random_examples(rng)
    table = ExampleTable.from_examples(examples, "train", BINDING)
    plan = plan_rows(table.lengths, 32, policy)
    rows = compact_rows(table, plan)
    manifest = write_packed(
        rows, tmp_path / name, max_rows_per_batch=per, shard_tokens=shard_tokens, **kw
    )
    return examples, plan, manifest


def test_write_then_load_gives_the_same_model_calls(tmp_path, rng):
    examples, plan, manifest = _packed(tmp_path, rng, policy=sorted(POLICIES)[0])
    assert len(manifest["shards"]) > 1
    for shard in manifest["shards"]:
        assert shard["first_row"] % 4 == 0
        names = pq.read_schema(tmp_path / "out" / shard["file"]).names
        # SequenceExample ids name their range ("s0[0:5]"), so example_ids are stored
        assert names == shard["columns"] == [*REQUIRED, "source_ids", "loss_bits", "example_ids"]
    store = load_packed(tmp_path / "out", BINDING)
    assert_cells_are_the_reference(store, examples, plan, 4)
    assert_same_batches([store[-1]], [list(store)[-1]])  # indexing from the end
    assert store.manifest == json.loads((tmp_path / "out" / "manifest.json").read_text())


def test_checksums_binding_and_completeness_are_verified(tmp_path, rng):
    _packed(tmp_path, rng)
    out = tmp_path / "out"
    with pytest.raises(BindingMismatch, match="vocab_size 266 != expected 300"):
        load_packed(out, Binding(300, BINDING.tokenizer_id, BINDING.split_id))
    shard = out / "shard-0001-00001.parquet"  # generation 1, shard 1
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(InvalidInput, match=r"shard-0001-00001\.parquet: checksum mismatch"):
        load_packed(out)
    (out / "manifest.json").unlink()
    with pytest.raises(InvalidInput, match=r"no manifest\.json: not a finished exactpack output"):
        load_packed(out)


@pytest.mark.parametrize("which", [0, "middle", -1])
def test_a_damaged_shard_is_refused_wherever_it_lies(tmp_path, rng, which):
    """One flipped byte in the first, a middle or the last shard: every reader refuses."""
    from exactpack.training.packed_data import PackedBatches

    _, _, manifest = _packed(tmp_path, rng)
    names = [entry["file"] for entry in manifest["shards"]]
    assert len(names) >= 3
    name = names[len(names) // 2 if which == "middle" else which]
    shard = tmp_path / "out" / name
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    for open_ in (load_packed, PackedBatches):
        with pytest.raises(InvalidInput, match=rf"{re.escape(name)}: checksum mismatch"):
            open_(tmp_path / "out")


def test_existing_output_needs_overwrite_and_must_be_a_exactpack_output(tmp_path, rng):
    _packed(tmp_path, rng)
    with pytest.raises(InvalidInput, match="already exists — pass --overwrite"):
        _packed(tmp_path, rng)
    before = (tmp_path / "out" / "manifest.json").read_text()
    _packed(tmp_path, rng, policy="padded", overwrite=True)
    assert (tmp_path / "out" / "manifest.json").read_text() != before
    listed = [s["file"] for s in load_packed(tmp_path / "out").manifest["shards"]]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([*listed, MANIFEST])
    assert all(name.startswith("shard-0002-") for name in listed)  # the old shards are gone
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(InvalidInput, match="not a exactpack output; refusing"):
        _packed(tmp_path, rng, name="mine", overwrite=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "out"]


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_failure_mid_write_leaves_the_previous_output_intact(tmp_path, rng, monkeypatch):
    _packed(tmp_path, rng)
    before = _snapshot(tmp_path / "out")
    real = shards_mod._write_shard
    calls = []

    def failing(table, path):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full (simulated)")
        real(table, path)

    monkeypatch.setattr(shards_mod, "_write_shard", failing)
    with pytest.raises(OSError, match="simulated"):
        _packed(tmp_path, rng, policy="padded", overwrite=True)
    with pytest.raises(OSError, match="simulated"):
        calls.clear()
        _packed(tmp_path, rng, name="fresh")
    assert _snapshot(tmp_path / "out") == before  # the shards written were removed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no "fresh"
    load_packed(tmp_path / "out")


KILLER = """
import os, signal, sys
import numpy as np
from exactpack.io import shards, store
from exactpack.core.compact import compact_rows
from exactpack.core.examples import ExampleTable
from exactpack.core.policies import plan_rows
from exactpack.verify.fixture import fixture_binding, fixture_examples

real = shards._write_shard
def dying(table, path):
    real(table, path)
    os.kill(os.getpid(), signal.SIGKILL)   # the run is killed after one shard
shards._write_shard = dying
table = ExampleTable.from_examples(fixture_examples(), "train", fixture_binding())
rows = compact_rows(table, plan_rows(table.lengths, 6, "padded"))
store.write_packed(rows, sys.argv[1], max_rows_per_batch=1, shard_tokens=1, overwrite=True)
"""


def test_a_killed_run_leaves_no_complete_looking_output(tmp_path, rng):
    _packed(tmp_path, rng)
    before = _snapshot(tmp_path / "out")
    want = [b.segments.tolist() for b in load_packed(tmp_path / "out")]
    for target in ("out", "new"):
        proc = subprocess.run([sys.executable, "-c", KILLER, str(tmp_path / target)])
        assert proc.returncode == -9
    after = _snapshot(tmp_path / "out")
    assert {k: v for k, v in after.items() if k in before} == before  # the old output whole
    assert [b.segments.tolist() for b in load_packed(tmp_path / "out")] == want
    assert (tmp_path / "new").is_dir() and not (tmp_path / "new" / MANIFEST).exists()
    with pytest.raises(InvalidInput, match=r"no manifest\.json"):
        load_packed(tmp_path / "new")
    # the next writer removes exactly what the killed run wrote
    _packed(tmp_path, rng, name="new")
    _packed(tmp_path, rng, policy="padded", overwrite=True)
    for name in ("out", "new"):
        listed = [s["file"] for s in load_packed(tmp_path / name).manifest["shards"]]
        assert sorted(p.name for p in (tmp_path / name).iterdir()) == sorted([*listed, MANIFEST])


@settings(max_examples=60, deadline=None)
@given(
    example_lists(max_capacity=12, max_examples=14),
    st.sampled_from(sorted(POLICIES)),
    st.booleans(),
    st.booleans(),
)
def test_the_lean_layout_stores_exactly_what_cannot_be_derived(case, policy, split, named):
    """Each derivable column is stored only when needed, and every layout reads back whole."""
    from exactpack.core.examples import cut_long
    from exactpack.io.shards import layout_of

    examples, capacity = case
    table = ExampleTable.from_examples(examples, Split.TRAIN, BINDING)
    want_examples = examples
    if not named:
        ids = np.arange(len(table)).astype(str).astype(object)
        table = dataclasses.replace(table, source_ids=ids, example_ids=ids)
    if split:
        table, _ = cut_long(table, max(1, capacity // 2))
        capacity = max(1, capacity // 2)
        want_examples = split_examples(examples, capacity)
    plan = plan_rows(table.lengths, capacity, policy)
    rows = compact_rows(table, plan)
    layout = layout_of(rows)
    assert layout.loss_bits == (not table.loss_mask.all())
    renamed = not np.array_equal(rows.example_ids, rows.source_ids)
    assert layout.example_ids == renamed
    whole = (rows.range_starts == 0).all() and (rows.range_ends == rows.lengths + 1).all()
    assert layout.ranges == (not whole)
    numbered = np.array_equal(rows.source_ids, rows.ordinals.astype(str).astype(object))
    assert layout.source_ids == (renamed or not whole or not numbered)
    assert layout.source_ids or not named
    for chosen in (layout, FULL):
        arrow = shard_table(rows, chosen)
        assert arrow.schema.names == chosen.columns()
        back = arrow_to_rows(
            arrow, capacity=capacity, partition=rows.partition, binding=rows.binding, where="t"
        )
        assert_cells_are_the_reference(back.batches(3), want_examples, plan, 3, named and not split)


def test_loss_bits_pad_each_row_to_whole_bytes(rng):
    from exactpack.io.shards import row_bits, unpack_bits

    row_pairs = np.array([0, 1, 7, 8, 9, 23, 64, 3])
    mask = rng.random(int(row_pairs.sum())) < 0.5
    bits = row_bits(mask, row_pairs)
    assert [len(b) for b in bits.to_pylist()] == ((row_pairs + 7) // 8).tolist()
    assert np.array_equal(unpack_bits(bits, row_pairs, "t"), mask)
    assert np.array_equal(unpack_bits(bits.slice(2, 3), row_pairs[2:5], "t"),
                          mask[row_pairs[:2].sum() : row_pairs[:5].sum()])  # fmt: skip
    with pytest.raises(InvalidInput, match="loss_bits do not match"):
        unpack_bits(bits, row_pairs + 8, "t")


def test_an_output_of_another_format_version_is_refused_with_the_fix(tmp_path, rng):
    """Only the version this exactpack writes is read (nothing earlier was published)."""
    examples = _random_examples(rng)
    table = ExampleTable.from_examples(examples, "train", BINDING)
    rows = compact_rows(table, plan_rows(table.lengths, 32, "best-fit-decreasing"))
    manifest = write_packed(rows, tmp_path / "out", max_rows_per_batch=4, shard_tokens=1000)
    assert manifest["version"] == 2
    load_packed(tmp_path / "out", BINDING)
    path = tmp_path / "out" / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "version": 1}))
    with pytest.raises(InvalidInput, match=r"version 1;.*reads .* version 2 — pack it again"):
        load_packed(tmp_path / "out", BINDING)
