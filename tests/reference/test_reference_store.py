"""Packed stores read back against the source documents, not against ``materialize``.

Every cell a store hands back must trace to its source: occurrence ``o`` of
source ``s`` selecting range ``[a, b)`` at columns ``[c0, c1)`` of a row holds
input ``doc_s[a + p]``, target ``doc_s[a + p + 1]`` and the source's own loss
flag for that target at column ``c0 + p``; its cells share one segment that
no other occurrence of the call uses; and over the whole store every
next-token pair of every source appears exactly once. Only the public API is
used (``pack_path``, ``load_packed``, ``PackedBatches``, ``pack_dataset`` /
``unpack_dataset``), never the shard columns.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exactpack.core.policies import POLICIES
from exactpack.io.store import load_packed
from exactpack.pipeline.local import pack_path
from exactpack.training.packed_data import PackedBatches

from support.reference import split_ranges
from support.strategies import scaled

VOCAB = 50


@st.composite
def corpora(draw):
    capacity = draw(st.integers(2, 12))
    split = draw(st.booleans())
    longest = 3 * capacity + 2 if split else capacity + 1
    # A file holds labels or loss masks, not both (a record may have neither).
    kind = draw(st.sampled_from(["labels", "mask"]))
    records = []
    for i in range(draw(st.integers(1, 30))):
        n = draw(st.integers(2, longest))
        ids = draw(st.lists(st.integers(0, VOCAB - 1), min_size=n, max_size=n))
        record = {"id": f"doc-{i}", "input_ids": ids}
        if draw(st.booleans()):
            pass
        elif kind == "labels":
            record["labels"] = [t if draw(st.booleans()) else -100 for t in ids]
        else:
            record["loss_mask"] = [int(draw(st.booleans())) for _ in ids[1:]]
        records.append(record)
    options = {
        "max_length": capacity,
        "cut_long": split,
        "policy": draw(st.sampled_from(sorted(POLICIES))),
        "max_rows_per_batch": draw(st.integers(1, 5)),
        "shard_tokens": draw(st.sampled_from([8, 64, 1 << 20])),
        "vocab_size": VOCAB,
    }
    return records, options


def source_flags(record) -> list[bool]:
    """The loss flag of each target of a record, from its own labels or mask."""
    ids = record["input_ids"]
    if "labels" in record:
        return [label != -100 for label in record["labels"][1:]]
    if "loss_mask" in record:
        return [bool(m) for m in record["loss_mask"]]
    return [True] * (len(ids) - 1)


def check_call(batch, sources, pairs_seen):
    """Trace every cell of one model call to its source document."""
    rows, width = batch.shape
    owned = np.zeros((rows, width), dtype=bool)
    segments = set()
    occ = batch.occurrences
    for i in range(len(occ)):
        rec = sources[str(occ.source_ids[i])]
        doc, flags = rec["input_ids"], source_flags(rec)
        a, b = int(occ.range_starts[i]), int(occ.range_ends[i])
        r, c0, c1 = int(occ.row[i]), int(occ.col_start[i]), int(occ.col_end[i])
        assert c1 - c0 == b - a - 1 and 0 <= a < b <= len(doc)
        assert str(occ.example_ids[i]) in (rec["id"], f"{rec['id']}[{a}:{b}]")
        segment = int(batch.segments[r, c0])
        assert segment not in segments and segment == int(occ.segment[i])
        segments.add(segment)
        for p in range(c1 - c0):
            c = c0 + p
            assert int(batch.inputs[r, c]) == doc[a + p]
            assert int(batch.targets[r, c]) == doc[a + p + 1]
            assert bool(batch.loss_mask[r, c]) == flags[a + p]
            assert int(batch.segments[r, c]) == segment and int(batch.positions[r, c]) == p
            assert batch.input_valid[r, c] and batch.target_valid[r, c]
            pairs_seen.append((rec["id"], a + p))
        owned[r, c0:c1] = True
    free = ~owned
    assert (batch.inputs[free] == -1).all() and (batch.targets[free] == -1).all()
    assert (batch.segments[free] == -1).all() and (batch.positions[free] == 0).all()
    assert not (batch.input_valid[free] | batch.target_valid[free] | batch.loss_mask[free]).any()


def every_pair(records):
    return sorted((rec["id"], t) for rec in records for t in range(len(rec["input_ids"]) - 1))


@settings(max_examples=scaled(25), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(corpora(), st.integers(0, 3))
def test_every_cell_of_a_store_traces_to_its_source_document(tmp_path_factory, case, files):
    """One JSON Lines file (``files == 0``) or a folder of one to three."""
    records, options = case
    path = tmp_path_factory.mktemp("store")
    files = min(files, len(records))  # no empty file: each holds a row
    data = path / ("d.jsonl" if files == 0 else "in")
    if files == 0:
        data.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        data.mkdir()
        for i in range(files):
            text = "".join(json.dumps(r) + "\n" for r in records[i::files])
            (data / f"part-{i}.jsonl").write_text(text)
    stats = pack_path(data, path / "out", **options)
    store = load_packed(path / "out")
    sources = {rec["id"]: rec for rec in records}
    pairs, first = [], 0
    for batch in store:
        assert batch.first_row == first and batch.shape[1] == options["max_length"]
        assert batch.shape[0] <= options["max_rows_per_batch"]
        first += batch.shape[0]
        check_call(batch, sources, pairs)
    assert first == store.num_rows == stats["rows"]
    assert sorted(pairs) == every_pair(records)
    want_examples = sum(
        len(split_ranges(len(r["input_ids"]), options["max_length"])) for r in records
    )
    assert stats["examples"] == want_examples
    assert stats["eligible_targets"] == sum(sum(source_flags(r)) for r in records)


@settings(max_examples=scaled(10), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(corpora(), st.integers(0, 2**31), st.sampled_from(["jsonl", 1, 2, 5]))
def test_rows_and_row_stats_of_a_packed_dataset_trace_to_the_sources(
    tmp_path_factory, case, seed_, source
):
    """From a JSON Lines file or a Parquet file of row groups of ``source`` rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records, options = case
    path = tmp_path_factory.mktemp("rows")
    if source == "jsonl":
        data = path / "d.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        records = uniform(records, "labels" if any("labels" in r for r in records) else "mask")
        data = path / "d.parquet"
        pq.write_table(pa.Table.from_pylist(records), data, row_group_size=source)
    pack_path(data, path / "out", **options)
    ds = PackedBatches(path / "out")
    sources = {rec["id"]: rec for rec in records}
    order = np.random.default_rng(seed_).permutation(ds.num_rows)
    pairs = []
    picked = ds.rows(order)
    check_call(picked, sources, pairs)
    assert sorted(pairs) == every_pair(records)
    stats = ds.row_stats()
    occ = picked.occurrences
    for local, row in enumerate(order.tolist()):
        here = occ.row == local
        lengths = (occ.col_end - occ.col_start)[here]
        assert stats.tokens[row] == lengths.sum()
        assert stats.attention[row] == float((lengths.astype(np.float64) ** 2).sum())
        eligible = 0
        for i in np.flatnonzero(here).tolist():
            a, b = int(occ.range_starts[i]), int(occ.range_ends[i])
            eligible += sum(source_flags(sources[str(occ.source_ids[i])])[a : b - 1])
        assert stats.eligible[row] == eligible


def uniform(records, kind):
    """The same supervision with every record carrying the column (a Parquet schema)."""
    out = []
    for rec in records:
        rec = dict(rec)
        if kind == "labels":
            rec.setdefault("labels", list(rec["input_ids"]))
            rec.pop("loss_mask", None)
        else:
            rec.setdefault("loss_mask", [1] * (len(rec["input_ids"]) - 1))
            rec.pop("labels", None)
        out.append(rec)
    return out


@settings(max_examples=scaled(25), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(corpora(), st.integers(1, 6), st.sampled_from([1, 64, 1 << 20]), st.integers(1, 3))
def test_every_row_of_every_parquet_row_group_and_file_is_packed_once(
    tmp_path_factory, case, group, chunk, files
):
    """Parquet read directly by pyarrow's writer layout: many row groups (``group`` rows
    each), tiny ``chunk_bytes``, one to three files in a folder; every source pair once."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records, options = case
    kind = "labels" if any("labels" in r for r in records) else "mask"
    records = uniform(records, kind)
    path = tmp_path_factory.mktemp("parquet")
    (path / "in").mkdir()
    parts = [records[i::files] for i in range(files)]
    for i, part in enumerate(p for p in parts if p):
        pq.write_table(pa.Table.from_pylist(part), path / "in" / f"part-{i}.parquet",
                       row_group_size=group)  # fmt: skip
    groups = sum(pq.ParquetFile(f).num_row_groups for f in (path / "in").iterdir())
    assert groups >= -(-len(records) // group)  # the layout really has the row groups
    stats = pack_path(path / "in", path / "out", chunk_bytes=chunk, **options)
    sources = {rec["id"]: rec for rec in records}
    pairs = []
    for batch in load_packed(path / "out"):
        check_call(batch, sources, pairs)
    assert sorted(pairs) == every_pair(records)
    assert stats["eligible_targets"] == sum(sum(source_flags(r)) for r in records)


def test_pack_dataset_and_unpack_dataset_give_the_sources_back(seed):
    datasets = pytest.importorskip("datasets")
    from exactpack.hf.datasets_io import pack_dataset, to_batches, unpack_dataset

    rng = np.random.default_rng(seed)
    records = []
    for i in range(60):
        ids = rng.integers(0, VOCAB, size=int(rng.integers(2, 30))).tolist()
        labels = [t if rng.random() < 0.7 else -100 for t in ids]
        records.append({"id": f"doc-{i}", "input_ids": ids, "labels": labels})
    source = datasets.Dataset.from_list(records)
    packed = pack_dataset(
        source, 8, "best-fit-decreasing", cut_long=True, vocab_size=VOCAB, max_rows_per_batch=3
    )
    sources = {rec["id"]: rec for rec in records}
    pairs, first = [], 0
    for batch in to_batches(packed):
        assert batch.first_row == first
        first += batch.shape[0]
        check_call(batch, sources, pairs)
    assert sorted(pairs) == every_pair(records)
    back = unpack_dataset(packed)
    want = []
    for rec in records:
        flags = source_flags(rec)
        for a, b in split_ranges(len(rec["input_ids"]), 8):
            tokens = rec["input_ids"][a:b]
            labels = [-100] + [
                t if f else -100 for t, f in zip(tokens[1:], flags[a : b - 1], strict=True)
            ]
            want.append((rec["id"], a, b, tokens, labels))
    got = [
        (r["id"], r["range_start"], r["range_end"], r["input_ids"], r["labels"])
        for r in back.to_list()
    ]
    assert got == want


@settings(max_examples=scaled(40), deadline=None)
@given(st.lists(st.integers(2, 20), min_size=1, max_size=40), st.integers(1, 7))
def test_stats_count_every_row_of_every_row_group(lengths, group):
    """``stats_path`` on a Parquet file of many row groups counts what pyarrow wrote:
    every source, its pairs (``tokens``) and its pieces under ``--cut-long``."""
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    from exactpack.pipeline.stats import stats_path

    records = [{"id": f"r{i}", "input_ids": [i % VOCAB] * n} for i, n in enumerate(lengths)]
    with tempfile.TemporaryDirectory() as folder:
        data = f"{folder}/d.parquet"
        pq.write_table(pa.Table.from_pylist(records), data, row_group_size=group)
        assert pq.ParquetFile(data).num_row_groups == -(-len(records) // group)
        stats = stats_path(data, max_length=8, cut_long=True, vocab_size=VOCAB)
    assert stats["sources"] == len(records)
    assert stats["tokens"] == sum(n - 1 for n in lengths)
    assert stats["examples"] == sum(len(split_ranges(n, 8)) for n in lengths)
