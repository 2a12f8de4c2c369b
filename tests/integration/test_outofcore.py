"""The out-of-core pipeline (``pack_path``): the same output as packing in memory, any chunking.

``pack_path`` reads chunk by chunk, spills, plans the whole corpus and
gathers each shard from the spill. Packing the same input the in-memory way
(read it whole, :func:`pack_table`, :func:`write_packed`) must give the same
packed directory, byte for byte: the manifest and every shard. Chunk
boundaries are exercised with tiny ``chunk_bytes`` (a line split across
reads, a line longer than a read), blocks of blank lines (an empty chunk)
and files without a final newline (the last chunk).
"""

import json

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from exactpack.io.readers import read_documents
from exactpack.io.store import load_packed, write_packed
from exactpack.pipeline.local import bind_examples, pack_path, pack_table, run_statistics
from exactpack.pipeline.options import PackOptions

from support.packed_helpers import random_records, recovered_examples, write_jsonl


def in_memory(source, out, **overrides):
    """The in-memory path over the same input: read whole, packed, written at once."""
    opts = PackOptions.of(**overrides)
    tok = opts.load_tokenizer()
    docs = read_documents(source, tokenizer=tok, text_field=opts.text_field, partition=opts.split)
    table, split = bind_examples(docs, opts, tok)
    plan, rows = pack_table(table, opts.capacity, opts.policy, **opts.policy_options)
    stats = run_statistics(plan, docs, table, split) | {
        "batches": -(-plan.num_rows // opts.max_rows_per_batch)
    }
    return write_packed(
        rows,
        out,
        max_rows_per_batch=opts.max_rows_per_batch,
        shard_tokens=opts.shard_tokens,
        extra={
            "policy": opts.manifest_fields()["policy"],
            "statistics": stats,
            "input": {"source": str(source), "text_field": opts.text_field},
        },
    )


def assert_same_output(a, b):
    """Two packed directories hold the same manifest and byte-identical shards."""
    ma = json.loads((a / "manifest.json").read_text())
    mb = json.loads((b / "manifest.json").read_text())
    assert ma == mb
    for shard in ma["shards"]:
        assert (a / shard["file"]).read_bytes() == (b / shard["file"]).read_bytes()
    return ma


CASES = {
    "labels": dict(max_length=64, vocab_size=500),
    "bfd": dict(max_length=64, vocab_size=500, policy="best-fit-decreasing"),
    "ffd": dict(max_length=64, vocab_size=500, policy="first-fit-decreasing"),
    "stream": dict(max_length=64, vocab_size=500, policy="stream-best-fit",
                   policy_options={"lookahead": 7}),
    "split": dict(max_length=16, vocab_size=500, cut_long=True, max_rows_per_batch=3),
}  # fmt: skip


@pytest.fixture(params=["spilled", "kept"])
def spilled(request, monkeypatch):
    """Both ways a read corpus is held: spilled to disk, or kept in memory (small ones)."""
    if request.param == "spilled":
        monkeypatch.setattr("exactpack.pipeline.corpus.KEEP_BYTES", 0)
    return request.param


@pytest.mark.parametrize("chunk", [97, 1 << 20])
@pytest.mark.parametrize("case", sorted(CASES))
def test_jsonl_packs_exactly_as_in_memory_whatever_the_chunks(tmp_path, rng, case, chunk, spilled):
    records = random_records(rng, 160, vocab=500, max_len=60)
    path = write_jsonl(tmp_path / "d.jsonl", records)
    options = CASES[case] | {"shard_tokens": 700}
    stats = pack_path(path, tmp_path / "ooc", chunk_bytes=chunk, **options)
    in_memory(path, tmp_path / "mem", **options)
    manifest = assert_same_output(tmp_path / "ooc", tmp_path / "mem")
    assert len(manifest["shards"]) > 1 and stats["shards"] == len(manifest["shards"])
    assert stats["input_tokens"] == sum(len(r["input_ids"]) for r in records)
    assert stats["tokens_per_s"] > 0
    if case == "split":
        assert manifest["statistics"]["split_sources"] > 0
        assert any({"example_ids", "range_starts"} <= set(x["columns"]) for x in manifest["shards"])


def test_chunk_boundaries_blank_blocks_long_lines_and_no_final_newline(tmp_path, rng, spilled):
    records = random_records(rng, 40, vocab=300, max_len=40)
    lines = [json.dumps(r) for r in records]
    # a block of blank lines (an empty chunk), CRLF endings, and no newline at the end
    text = "\n".join(lines[:20]) + "\n" + "\n" * 300 + "\r\n".join(lines[20:])
    path = tmp_path / "d.jsonl"
    path.write_text(text)
    opts = dict(max_length=48, vocab_size=300, policy="best-fit-decreasing", shard_tokens=300)
    in_memory(path, tmp_path / "mem", **opts)
    for chunk in (16, 100, 333, 1 << 20):  # 16: every line is longer than a read
        out = tmp_path / f"ooc-{chunk}"
        pack_path(path, out, chunk_bytes=chunk, **opts)
        assert_same_output(out, tmp_path / "mem")
    got = recovered_examples(load_packed(tmp_path / "ooc-16"))
    assert sorted(ex["source_id"] for ex in got.values()) == sorted(r["id"] for r in records)


def test_parquet_row_groups_datasets_folders_and_text(tmp_path, rng, spilled):
    records = random_records(rng, 90, vocab=400, max_len=30)
    folder = tmp_path / "parquet"
    folder.mkdir()
    for k in range(3):
        part = records[k * 30 : (k + 1) * 30]
        table = pa.table(
            {
                "id": [r["id"] for r in part],
                "input_ids": pa.array([r["input_ids"] for r in part], pa.list_(pa.int32())),
                "labels": pa.array([r.get("labels") for r in part], pa.list_(pa.int64())),
            }
        )
        with pq.ParquetWriter(folder / f"{k}.parquet", table.schema) as writer:
            writer.write_table(table.slice(0, 0))  # an empty row group
            writer.write_table(table, row_group_size=7)
    ds = datasets.Dataset.from_list([{**r, "labels": r.get("labels")} for r in records])
    ds.save_to_disk(str(tmp_path / "ds"), max_shard_size=2000)
    texts = write_jsonl(tmp_path / "t.jsonl", [{"text": "x" * (i % 50 + 1)} for i in range(80)])
    cases = [
        (folder, dict(max_length=32, vocab_size=400, policy="best-fit-decreasing")),
        (tmp_path / "ds", dict(max_length=32, vocab_size=400, policy="best-fit-decreasing")),
        (texts, dict(max_length=20, tokenizer="bytes", cut_long=True)),
    ]
    for k, (source, opts) in enumerate(cases):
        opts = opts | {"shard_tokens": 300}
        pack_path(source, tmp_path / f"ooc{k}", chunk_bytes=200, **opts)
        in_memory(source, tmp_path / f"mem{k}", **opts)
        manifest = assert_same_output(tmp_path / f"ooc{k}", tmp_path / f"mem{k}")
        assert manifest["rows"] == load_packed(tmp_path / f"ooc{k}").num_rows
        if k < 2:  # against the rows written, not a second pass of the same reader
            got = recovered_examples(load_packed(tmp_path / f"ooc{k}"))
            assert sorted(ex["source_id"] for ex in got.values()) == sorted(
                r["id"] for r in records
            )
    # split text without ids: the pieces name their sources, so the ids are stored
    shards = json.loads((tmp_path / "ooc2/manifest.json").read_text())["shards"]
    assert any("source_ids" in shard["columns"] for shard in shards)


def test_an_id_column_of_row_numbers_is_not_stored(tmp_path):
    records = [{"id": i, "input_ids": [0, 5 + i % 7, 1]} for i in range(30)]
    path = write_jsonl(tmp_path / "d.jsonl", records)
    pack_path(path, tmp_path / "a", max_length=8, vocab_size=20, chunk_bytes=64)
    in_memory(path, tmp_path / "b", max_length=8, vocab_size=20)
    manifest = assert_same_output(tmp_path / "a", tmp_path / "b")
    assert all("source_ids" not in shard["columns"] for shard in manifest["shards"])
    got = recovered_examples(load_packed(tmp_path / "a"))
    assert [got[i]["source_id"] for i in range(30)] == [str(i) for i in range(30)]


def test_progress_shows_documents_tokens_and_rates(tmp_path, rng, capsys):
    path = write_jsonl(tmp_path / "d.jsonl", random_records(rng, 50, vocab=100, max_len=30))
    stats = pack_path(path, tmp_path / "out", max_length=32, vocab_size=100, progress=True,
                      chunk_bytes=500)  # fmt: skip
    err = capsys.readouterr().err
    for needle in ("exactpack: reading", "docs", "tokens", "B/s", "exactpack: planning",
                   "exactpack: writing", "rows"):  # fmt: skip
        assert needle in err, needle
    assert stats["tokens_per_s"] == pytest.approx(stats["input_tokens"] / stats["seconds"])


def test_identical_ids_across_chunks_are_reported(tmp_path):
    records = [{"id": "same" if i in (3, 40) else f"d{i}", "input_ids": [0, 5, 1]}
               for i in range(50)]  # fmt: skip
    path = write_jsonl(tmp_path / "d.jsonl", records)
    stats = pack_path(path, tmp_path / "out", max_length=8, vocab_size=10, chunk_bytes=100)
    assert stats["duplicate_ids"] == 1
    assert stats["duplicate_first"]["at"].endswith("d.jsonl line 41")
    assert stats["duplicate_first"]["first_seen"].endswith("d.jsonl line 4")
    assert np.isfinite(stats["tokens_per_s"])


def test_a_small_corpus_is_kept_and_a_large_one_spilled(tmp_path, rng, monkeypatch):
    from exactpack.io.spill import Spill

    opened = []
    real = Spill.open
    monkeypatch.setattr(Spill, "open", lambda self, *a: opened.append(1) or real(self, *a))
    path = write_jsonl(tmp_path / "d.jsonl", random_records(rng, 300, vocab=300, max_len=40))
    pack_path(path, tmp_path / "a", max_length=48, vocab_size=300, chunk_bytes=2000)
    assert opened == []  # a few kilobytes of ids: kept in memory
    monkeypatch.setattr("exactpack.pipeline.corpus.KEEP_BYTES", 10_000)  # passed mid-way
    pack_path(path, tmp_path / "b", max_length=48, vocab_size=300, chunk_bytes=2000)
    assert opened == [1]
    pack_path(path, tmp_path / "c", max_length=48, vocab_size=300, max_metadata_bytes=1 << 40)
    assert opened == [1, 1]  # with a budget the corpus is always spilled
    assert_same_output(tmp_path / "a", tmp_path / "b")
