"""Every reader against its source rows, read by an independent reference.

The reference reads the files directly — ``pyarrow.parquet`` row group by row
group, the ``json`` module line by line, Arrow IPC for a ``datasets`` folder's
files — never through exactpack's readers. Over random layouts (many row
groups, empty ones, small ``chunk_bytes``, blank lines, several files, several
Arrow files) every row must arrive exactly once, in order, with its tokens
and id: a reader that loses a row group, a chunk or a file fails here, with
neither Ray nor trl installed.
"""

import contextlib
import io
import json

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from exactpack.io.readers import read_documents
from exactpack.pipeline.local import pack_path

from support.strategies import scaled

VOCAB = 300


@st.composite
def corpora(draw, max_docs: int = 40):
    """Documents (id, ids) and how to lay them out."""
    n = draw(st.integers(1, max_docs))
    docs = []
    for i in range(n):
        ids = draw(st.lists(st.integers(0, VOCAB - 1), min_size=2, max_size=30))
        docs.append({"id": f"doc-{i}", "input_ids": ids})
    return docs


def _reference_parquet(paths):
    """Rows of Parquet files, row group by row group, with pyarrow alone."""
    out = []
    for path in paths:
        pf = pq.ParquetFile(path)
        for g in range(pf.metadata.num_row_groups):
            out += pf.read_row_group(g, columns=["id", "input_ids"]).to_pylist()
    return out


def _reference_jsonl(paths):
    """Rows of JSON Lines files with the json module, blank lines skipped."""
    out = []
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                out.append(json.loads(line))
    return out


def _reference_arrow_files(folder):
    """Rows of a datasets folder: its state.json's Arrow files read as IPC streams."""
    state = json.loads((folder / "state.json").read_text())
    out = []
    for entry in state["_data_files"]:
        with pa.memory_map(str(folder / entry["filename"])) as source:
            out += pa.ipc.open_stream(source).read_all().select(["id", "input_ids"]).to_pylist()
    return out


def _seen(source, chunk_bytes):
    docs = read_documents(source, chunk_bytes=chunk_bytes)
    tokens = [
        docs.tokens[a:b].tolist() for a, b in zip(docs.offsets[:-1], docs.offsets[1:], strict=True)
    ]
    return list(zip(docs.ids.tolist(), tokens, strict=True))


def _expected(rows):
    return [(r["id"], list(r["input_ids"])) for r in rows]


def _write_parquet(path, docs, draw_sizes):
    table = pa.table(
        {
            "id": [d["id"] for d in docs],
            "input_ids": pa.array([d["input_ids"] for d in docs], pa.list_(pa.int32())),
        }
    )
    with pq.ParquetWriter(path, table.schema) as writer:
        start = 0
        for size in draw_sizes:
            writer.write_table(table.slice(start, size))  # size 0: an empty row group
            start += size
        writer.write_table(table.slice(start))


@settings(max_examples=scaled(60), deadline=None)
@given(corpora(), st.data(), st.sampled_from([64, 512, 1 << 20]))
def test_every_parquet_row_group_arrives_once(tmp_path_factory, docs, data, chunk):
    folder = tmp_path_factory.mktemp("pq")
    sizes = data.draw(st.lists(st.integers(0, 7), max_size=8))
    _write_parquet(folder / "a.parquet", docs, sizes)
    want = _reference_parquet([folder / "a.parquet"])
    assert len(want) == len(docs)
    assert _seen(folder / "a.parquet", chunk) == _expected(want)


@settings(max_examples=scaled(40), deadline=None)
@given(corpora(), st.integers(1, 4), st.sampled_from([64, 1 << 20]))
def test_every_parquet_shard_of_a_folder_and_a_list_arrives_once(
    tmp_path_factory, docs, shards, chunk
):
    folder = tmp_path_factory.mktemp("pqs")
    cut = np.array_split(np.arange(len(docs)), shards)
    paths = []
    for k, part in enumerate(cut):
        path = folder / f"part-{k:02d}.parquet"
        _write_parquet(path, [docs[i] for i in part], [3] * (len(part) // 3))
        paths.append(path)
    want = _expected(_reference_parquet(paths))
    assert _seen(folder, chunk) == want
    assert _seen(paths, chunk) == want  # several paths: one input, in the order given


@settings(max_examples=scaled(60), deadline=None)
@given(corpora(), st.data(), st.sampled_from([16, 200, 1 << 20]))
def test_every_json_line_arrives_once_across_chunks_and_files(tmp_path_factory, docs, data, chunk):
    folder = tmp_path_factory.mktemp("jl")
    files = data.draw(st.integers(1, min(3, len(docs))))  # an empty file is refused, rightly
    paths = []
    for k, part in enumerate(np.array_split(np.arange(len(docs)), files)):
        lines = []
        for i in part:
            lines.append(json.dumps(docs[i]))
            if data.draw(st.booleans()):
                lines.append(data.draw(st.sampled_from(["", "  ", "\t"])))  # blank lines
        path = folder / f"p{k}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    want = _expected(_reference_jsonl(paths))
    assert len(want) == len(docs)
    assert _seen(paths if files > 1 else paths[0], chunk) == want


@settings(max_examples=scaled(40), deadline=None)
@given(st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=30))
def test_every_text_line_arrives_once_as_its_bytes(tmp_path_factory, texts):
    from exactpack.io.tokenizers import ByteTokenizer

    folder = tmp_path_factory.mktemp("tx")
    path = folder / "t.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tok = ByteTokenizer()
    docs = read_documents(path, tokenizer=tok, chunk_bytes=64)
    got = [
        docs.tokens[a:b].tolist() for a, b in zip(docs.offsets[:-1], docs.offsets[1:], strict=True)
    ]
    # the reference: the byte tokenizer's documented rule, UTF-8 bytes + 10 between BOS 0
    # and EOS 1, written here from the text (not through the tokenizer's code)
    want = [[0, *(b + 10 for b in t.encode()), 1] for t in texts]
    assert got == want


def test_every_arrow_file_of_a_datasets_folder_arrives_once(tmp_path, rng):
    docs = [
        {"id": f"doc-{i}", "input_ids": rng.integers(0, VOCAB, int(rng.integers(2, 40))).tolist()}
        for i in range(120)
    ]
    with contextlib.redirect_stderr(io.StringIO()):
        datasets.Dataset.from_list(docs).save_to_disk(str(tmp_path / "ds"), num_shards=4)
    want = _expected(_reference_arrow_files(tmp_path / "ds"))
    assert len(want) == 120 and len(json.loads((tmp_path / "ds/state.json").read_text())[
        "_data_files"]) == 4  # fmt: skip
    for chunk in (64, 1 << 20):
        assert _seen(tmp_path / "ds", chunk) == want


def test_a_packed_parquet_input_counts_every_source_row(tmp_path, rng):
    """The whole pipeline: examples and input tokens equal what pyarrow reads, row group by
    row group, from a file of many row groups (the last one short)."""
    docs = [
        {"id": f"d{i}", "input_ids": rng.integers(0, VOCAB, int(rng.integers(2, 30))).tolist()}
        for i in range(101)
    ]
    _write_parquet(tmp_path / "a.parquet", docs, [10] * 9)
    want = _reference_parquet([tmp_path / "a.parquet"])
    stats = pack_path(
        tmp_path / "a.parquet", tmp_path / "out", max_length=32, vocab_size=VOCAB, chunk_bytes=64
    )
    assert stats["examples"] == len(want) == 101
    assert stats["input_tokens"] == sum(len(r["input_ids"]) for r in want)
