"""Every reader against its source rows, read by an independent reference.

The reference reads the files directly — ``pyarrow.parquet`` row group by row
group, the ``json`` module line by line, Arrow IPC for a ``datasets`` folder's
files — never through exactpack's readers. Over random layouts (many row
groups, empty ones, small ``chunk_bytes``, blank lines, several files, several
Arrow files) every row must arrive exactly once, in order, with its tokens
and id: a reader that loses a row group, a chunk or a file fails here, with
neither Ray nor trl installed.
"""

import bz2
import contextlib
import gzip
import io
import itertools
import json
import lzma
import os
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from exactpack.core.errors import InvalidInput
from exactpack.io.readers import open_input, read_documents
from exactpack.io.store import load_packed
from exactpack.io.tokenizers import ByteTokenizer
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


# ------------------------------------------------------------------------------------------
# Compression members, line endings, final newlines and globs (issue 39).
#
# The reference here is the standard library alone: gzip / bz2 / lzma decompress every
# member (stream) of a file, io.TextIOWrapper's universal newlines split text lines, the
# json module parses JSON Lines. zstd frames are written with pyarrow's one-shot compressor
# (no zstd module in the standard library); their reference is the plain bytes written.

CODECS = {
    ".gz": (gzip.compress, gzip.decompress),
    ".bz2": (bz2.compress, bz2.decompress),
    ".xz": (lzma.compress, lzma.decompress),
    ".zst": (lambda b: pa.compress(b, codec="zstd", asbytes=True), None),
    "": (lambda b: b, lambda b: b),
}
# No NUL: a text file holding a NUL byte is refused as not a text (the hostile catalogue).
LINE_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\x00"),
    max_size=12,
)


def _members(suffix: str, data: bytes, cuts: list[int]) -> bytes:
    """``data`` as one compressed member (gzip member, bz2 / xz stream, zstd frame) per
    piece between ``cuts``, back to back as ``cat a.gz b.gz`` writes them."""
    compress, decompress = CODECS[suffix]
    bounds = [0, *sorted(cuts), len(data)]
    out = b"".join(compress(data[a:b]) for a, b in itertools.pairwise(bounds))
    if decompress is not None:
        assert decompress(out) == data  # the standard library reads every member
    return out


def _text_lines(data: bytes) -> list[str]:
    """A text file's lines with universal newlines (``\\n``, ``\\r\\n``, ``\\r``), breaks
    dropped, no line after a final break: what the datasets "text" builder yields."""
    text = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", newline=None).read()
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def _jsonl_rows(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode("utf-8").split("\n") if line.strip()]


def _byte_tokens(text: str) -> list[int]:
    """The byte tokenizer's documented rule: BOS 0, UTF-8 bytes + 10, EOS 1."""
    return [0, *(b + 10 for b in text.encode()), 1]


def _body(lines: list[str], ending: str, final: bool) -> bytes:
    return (ending.join(lines) + (ending if final else "")).encode()


def _tokens_of(docs) -> list[list[int]]:
    bounds = zip(docs.offsets[:-1].tolist(), docs.offsets[1:].tolist(), strict=True)
    return [docs.tokens[a:b].tolist() for a, b in bounds]


@pytest.mark.parametrize("final", [True, False], ids=["final-newline", "no-final-newline"])
@pytest.mark.parametrize("ending", ["\n", "\r\n", "\r"], ids=["LF", "CRLF", "CR"])
@pytest.mark.parametrize("suffix", list(CODECS), ids=["gz", "bz2", "xz", "zst", "plain"])
def test_every_member_and_the_last_line_of_a_text_file_arrive(tmp_path, suffix, ending, final):
    lines = ["first", "", "d\u00e9j\u00e0 vu", "x" * 40, "last line"]
    data = _body(lines, ending, final)
    path = tmp_path / f"a.txt{suffix}"
    path.write_bytes(_members(suffix, data, [3, 17, len(data) - 2]))  # cuts inside lines
    want = _text_lines(data)
    assert want == lines  # the reference agrees with the lines written
    for chunk in (8, 1 << 20):
        docs = read_documents(path, tokenizer=ByteTokenizer(), chunk_bytes=chunk)
        assert _tokens_of(docs) == [_byte_tokens(t) for t in want]
    tables = [t for t, _, _ in open_input(path).chunks(8, "text")]  # the Arrow chunks
    assert [v for t in tables if t.num_rows for v in t.column("text").to_pylist()] == want


@pytest.mark.parametrize("final", [True, False], ids=["final-newline", "no-final-newline"])
@pytest.mark.parametrize("ending", ["\n", "\r\n"], ids=["LF", "CRLF"])
@pytest.mark.parametrize("suffix", list(CODECS), ids=["gz", "bz2", "xz", "zst", "plain"])
def test_every_member_and_the_last_line_of_a_json_lines_file_arrive(
    tmp_path, suffix, ending, final
):
    rows = [{"id": f"r{i}", "input_ids": list(range(i, i + 2 + i % 5))} for i in range(7)]
    data = _body([json.dumps(r) for r in rows], ending, final)
    path = tmp_path / f"a.jsonl{suffix}"
    path.write_bytes(_members(suffix, data, [5, len(data) // 2, len(data) - 3]))
    want = _expected(_jsonl_rows(data))
    assert len(want) == 7
    for chunk in (16, 1 << 20):
        assert _seen(path, chunk) == want


@pytest.mark.parametrize("suffix", list(CODECS), ids=["gz", "bz2", "xz", "zst", "plain"])
def test_carriage_returns_alone_do_not_end_a_json_line(tmp_path, suffix):
    """JSON Lines ends a record with ``\\n`` (``\\r\\n`` by JSON's whitespace); a file of
    ``\\r`` alone is one line of several objects: refused, naming line 1, never misread."""
    data = _body([json.dumps({"input_ids": [1, 2, 3]})] * 3, "\r", True)
    path = tmp_path / f"a.jsonl{suffix}"
    path.write_bytes(_members(suffix, data, [7]))
    with pytest.raises(InvalidInput, match="line 1") as err:
        read_documents(path)
    assert "\n" not in str(err.value)


@st.composite
def split_corpora(draw):
    """A corpus (text lines or JSON rows) cut into 1-3 files, each of its own codec, line
    ending, final newline or not, and 1-4 compression members cut at any byte."""
    kind = draw(st.sampled_from(["text", "jsonl"]))
    if kind == "text":
        items = draw(st.lists(LINE_TEXT, min_size=1, max_size=25))
    else:
        items = [
            {"id": f"doc-{i}", "input_ids": ids}
            for i, ids in enumerate(
                draw(
                    st.lists(
                        st.lists(st.integers(0, VOCAB - 1), min_size=2, max_size=9),
                        min_size=1,
                        max_size=25,
                    )
                )
            )
        ]
    n_files = draw(st.integers(1, min(3, len(items))))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(items) - 1)), max_size=n_files - 1)))
    bounds = [0, *cuts, len(items)]
    files = []
    for k, (a, b) in enumerate(itertools.pairwise(bounds)):
        suffix = draw(st.sampled_from(list(CODECS)))
        endings = ["\n", "\r\n", "\r"] if kind == "text" else ["\n", "\r\n"]
        ending, final = draw(st.sampled_from(endings)), draw(st.booleans())
        part = items[a:b]
        lines = part if kind == "text" else [json.dumps(r) for r in part]
        if kind == "text" and lines[-1] == "" and not final:
            final = True  # an empty last line needs its break to exist at all
        data = _body(lines, ending, final)
        members = draw(st.sets(st.integers(1, max(1, len(data) - 1)), max_size=3))
        files.append((f"p{k}.{'txt' if kind == 'text' else 'jsonl'}{suffix}", data, members))
    return kind, items, files


@settings(max_examples=scaled(60), deadline=None)
@given(
    split_corpora(), st.sampled_from(["list", "glob", "folder"]), st.sampled_from([8, 64, 1 << 20])
)
@example(  # a text file of two gzip members, the last line without its newline
    ("text", ["ab", "c"], [("p0.txt.gz", b"ab\nc", {2})]), "glob", 8
).via("the issue's survivors: a second gzip member and a last line without a newline")
@example(("jsonl", [{"id": "d", "input_ids": [1, 2]}], [("p0.jsonl.bz2",
          b'{"id": "d", "input_ids": [1, 2]}', {9})]), "list", 1 << 20)  # fmt: skip
def test_any_split_into_files_and_members_reads_as_the_corpus(tmp_path_factory, case, door, chunk):
    kind, items, files = case
    folder = tmp_path_factory.mktemp("split")
    paths = []
    for name, data, members in reversed(files):  # created last file first
        path = folder / name
        path.write_bytes(_members(Path(name).suffix if Path(name).suffix in CODECS else "",
                                  data, sorted(members)))  # fmt: skip
        paths.insert(0, path)
    source = {"list": paths, "glob": str(folder / "p*"), "folder": folder}[door]
    if kind == "text":
        want = [line for _, data, _ in files for line in _text_lines(data)]
        assert want == items
        docs = read_documents(source, tokenizer=ByteTokenizer(), chunk_bytes=chunk)
        assert _tokens_of(docs) == [_byte_tokens(t) for t in want]
    else:
        want = _expected([row for _, data, _ in files for row in _jsonl_rows(data)])
        assert want == _expected(items)
        assert _seen(source, chunk) == want


def _reverse_created(folder: Path, n: int = 12) -> list[Path]:
    """``n`` JSON Lines files created last name first, so the directory's own order
    (ext4 hashes names; tmpfs lists newest first) is not the sorted order."""
    folder.mkdir()
    for k in reversed(range(n)):
        rows = [{"id": f"f{k:02d}-{j}", "input_ids": [1, 2 + k, 3 + j, 4]} for j in range(2)]
        (folder / f"p{k:02d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    names = sorted(os.listdir(folder))
    assert os.listdir(folder) != names, "the file system lists these names sorted; rename them"
    return [folder / n for n in names]


def test_a_glob_reads_its_matches_in_sorted_order(tmp_path):
    paths = _reverse_created(tmp_path / "in")
    want = [f"f{k:02d}-{j}" for k in range(12) for j in range(2)]
    docs = read_documents(str(tmp_path / "in" / "p*.jsonl"))
    assert docs.ids.tolist() == want
    assert read_documents(paths).ids.tolist() == want  # the sorted list names the same order
    tables = [t for t, _, _ in open_input(str(tmp_path / "in" / "p??.jsonl")).chunks(1 << 20)]
    assert [v for t in tables for v in t.column("id").to_pylist()] == want


def test_a_globbed_output_is_the_sorted_list_s_output(tmp_path):
    """The split receipt hashes the documents in reading order: a glob's is the sorted
    list's, and a list in another order has another receipt."""
    paths = _reverse_created(tmp_path / "in")
    opts = {"max_length": 8, "vocab_size": VOCAB, "policy": "next-fit"}
    pack_path(str(tmp_path / "in" / "p*.jsonl"), tmp_path / "glob", **opts)
    pack_path(paths, tmp_path / "sorted", **opts)
    pack_path(paths[::-1], tmp_path / "reversed", **opts)
    receipt = {
        n: load_packed(tmp_path / n).binding.split_id for n in ("glob", "sorted", "reversed")
    }
    assert receipt["glob"] == receipt["sorted"] != receipt["reversed"]
    store = load_packed(tmp_path / "glob")
    ids = [i for k in range(len(store.shards)) for i in store.shard_rows(k).source_ids.tolist()]
    assert ids == [f"f{k:02d}-{j}" for k in range(12) for j in range(2)]


def test_the_cli_packs_a_glob_in_sorted_order(tmp_path, capsys):
    from exactpack.cli import main

    paths = _reverse_created(tmp_path / "in")
    args = ["--max-length", "8", "--vocab-size", str(VOCAB), "--policy", "next-fit"]
    assert (
        main(["pack", str(tmp_path / "in" / "p*.jsonl"), "--out", str(tmp_path / "g"), *args]) == 0
    )
    assert main(["pack", *map(str, paths), "--out", str(tmp_path / "s"), *args]) == 0
    capsys.readouterr()
    glob_split = load_packed(tmp_path / "g").binding.split_id
    assert glob_split == load_packed(tmp_path / "s").binding.split_id


def test_pack_path_counts_every_member_and_the_last_line(tmp_path):
    """The whole pipeline on ``cat a.gz b.gz`` inputs without a final newline: examples and
    tokens equal what the standard library reads."""
    rows = [{"id": f"r{i}", "input_ids": list(range(1, 3 + i % 6))} for i in range(30)]
    data = _body([json.dumps(r) for r in rows], "\n", False)
    (tmp_path / "a.jsonl.gz").write_bytes(_members(".gz", data, [40, 400, len(data) - 10]))
    text = ["alpha", "beta gamma", "", "delta"]
    raw = _body(text, "\r\n", False)
    (tmp_path / "t.txt.gz").write_bytes(_members(".gz", raw, [4, 12]))
    want = _jsonl_rows(gzip.decompress((tmp_path / "a.jsonl.gz").read_bytes()))
    stats = pack_path(tmp_path / "a.jsonl.gz", tmp_path / "o1", max_length=16, vocab_size=VOCAB)
    assert stats["examples"] == len(want) == 30
    assert stats["input_tokens"] == sum(len(r["input_ids"]) for r in want)
    lines = _text_lines(gzip.decompress((tmp_path / "t.txt.gz").read_bytes()))
    stats = pack_path(tmp_path / "t.txt.gz", tmp_path / "o2", max_length=32, tokenizer="bytes")
    assert stats["examples"] == len(lines) == 4
    assert stats["input_tokens"] == sum(len(_byte_tokens(t)) for t in lines)


def test_the_tree_door_reads_every_member_in_sorted_file_order(tmp_path):
    """pack_path(..., tree="on") reads through the same readers: a glob of two ``cat a.gz b.gz``
    files without a final newline, created last first; each sequence's input index is
    its place in the sorted files' rows (prompt + each completion, in order)."""

    folder = tmp_path / "in"
    folder.mkdir()
    files = {  # one prompt's completions per file, each file two gzip members
        f"g{k:02d}.jsonl.gz": [{"prompt_ids": [1 + k, 2], "completion_ids": [[3, 4 + k], [5]]}] * 2
        for k in range(12)
    }
    for name in sorted(files, reverse=True):
        data = _body([json.dumps(r) for r in files[name]], "\n", False)
        (folder / name).write_bytes(_members(".gz", data, [len(data) // 2]))
    assert os.listdir(folder) != sorted(files)  # the directory's order is not the sorted one
    rows = [r for name in sorted(files) for r in _jsonl_rows(gzip.decompress(
        (folder / name).read_bytes()))]  # fmt: skip
    want = [r["prompt_ids"] + c for r in rows for c in r["completion_ids"]]
    pack_path(
        str(folder / "g*.jsonl.gz"), tmp_path / "out", max_length=32, vocab_size=VOCAB, tree="on"
    )
    got = {}
    for rec in load_packed(tmp_path / "out").records():
        for s, cells in zip(rec["sequence_index"], rec["sequence_cells"], strict=True):
            got[s] = [rec["input_ids"][c] for c in cells] + [rec["target_ids"][cells[-1]]]
    assert [got[s] for s in range(len(want))] == want and len(got) == len(want) == 48
