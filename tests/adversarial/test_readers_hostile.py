"""Hostile inputs for the readers: special files, mixed folders, lines that try to fool the
guard in front of Arrow's JSON reader, and errors that must name the real line."""

import json
import os
import socket
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from exactpack.core.errors import InvalidInput
from exactpack.io import jsonl
from exactpack.io.readers import load_examples, read_documents
from exactpack.pipeline.local import pack_path


def exactpack(*args, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "exactpack", *map(str, args)],
        capture_output=True, text=True, check=False, timeout=timeout,
    )  # fmt: skip


@pytest.mark.parametrize("name", ["data.jsonl", "data.parquet", "shards/part-0.parquet"])
def test_a_fifo_is_refused_at_once_never_opened_for_reading(tmp_path, name):
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    os.mkfifo(path)
    source = path if "/" not in name else path.parent
    # no writer ever opens the FIFO: reading it would block forever
    proc = exactpack("pack", source, "--out", tmp_path / "out", "--max-length", 8,
                   "--vocab-size", 10, timeout=60)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1
    assert "is a FIFO (named pipe), not a regular file" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_devices_and_sockets_are_refused(tmp_path):
    (tmp_path / "zero.jsonl").symlink_to("/dev/zero")  # would grow memory without end
    with pytest.raises(InvalidInput, match=r"zero\.jsonl is a character device, not a regular"):
        read_documents(tmp_path / "zero.jsonl")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "s.jsonl"))
        with pytest.raises(InvalidInput, match=r"s\.jsonl is a socket"):
            read_documents(tmp_path / "s.jsonl")
    finally:
        sock.close()
    (tmp_path / "folder.jsonl").mkdir()
    with pytest.raises(InvalidInput, match="no \\*\\.parquet or \\*\\.jsonl"):
        read_documents(tmp_path / "folder.jsonl")


def test_a_folder_mixing_formats_is_refused(tmp_path):
    pq.write_table(pa.table({"input_ids": [[0, 1]]}), tmp_path / "a.parquet")
    (tmp_path / "b.jsonl").write_text('{"input_ids": [0, 1]}\n')
    (tmp_path / "dataset_info.json").write_text("{}")  # other files are not shards
    with pytest.raises(InvalidInput, match=r"mixes formats \(1 parquet and 1 JSON Lines files\)"):
        read_documents(tmp_path)
    (tmp_path / "b.jsonl").unlink()
    assert len(read_documents(tmp_path)) == 1


DEEP = b"[" * 20_000 + b"]" * 20_000


@pytest.mark.parametrize(
    ("line", "match"),
    [
        # a string full of closing brackets must not hide a deep array from the guard
        (b'{"text": "' + b"]" * 30_000 + b'", "x": ' + DEEP + b"}", "nested more than 64 levels"),
        (b'{"text": "' + b"]" * 30_000 + b'"}' + DEEP, "Extra data"),
        (b'{"a": "\\\\"}' + DEEP, "Extra data"),  # an escaped backslash closes the string
        (b'{"a": "\\"' + b"]" * 100 + b'", "b": ' + DEEP + b"}", "nested more than 64"),
        (b'{"input_ids": [0, 1]} {"input_ids": [0, 1]}', "Extra data"),  # two values
        (b'{"input_ids": [0, 1]} null', "Extra data"),
        (b"null", "is a null, not a JSON object"),
        (b'  {"input_ids": [0, 1]}  ]', "Extra data"),
        (b'{"input_ids": [0, 1]', "not valid JSON"),
    ],
)
def test_lines_that_try_to_fool_the_guard_are_refused_by_their_line(tmp_path, line, match):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"input_ids": [0, 1]}\n\n\r\n' + line + b"\n")
    with pytest.raises(InvalidInput, match=match) as err:
        read_documents(path)
    assert "d.jsonl line 4" in str(err.value)


def test_every_error_names_the_real_line(tmp_path):
    good = json.dumps({"input_ids": [0, 5, 1]})
    text = "\n".join([good, "", "   ", good, "\t", good, json.dumps({"input_ids": [0, 999]})])
    path = tmp_path / "d.jsonl"
    path.write_text(text.replace("\n", "\r\n"))
    for chunk in (8, 1 << 20):
        with pytest.raises(InvalidInput, match=r"d\.jsonl line 7 \(id '3'\): token id 999"):
            pack_path(path, tmp_path / "out", max_length=8, vocab_size=100, chunk_bytes=chunk)


def test_id_types_must_agree_across_chunks(tmp_path):
    lines = [{"id": i, "input_ids": [0, 1]} for i in range(20)] + [{"id": "x", "input_ids": [0, 1]}]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(InvalidInput, match="line 21: id holds string values but earlier lines"):
        pack_path(path, tmp_path / "out", max_length=8, vocab_size=10, chunk_bytes=100)


def test_overlong_lines_and_json_arrays_are_refused_not_buffered(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 4096)
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"input_ids": [0, 1]}\n{"text": "' + b"x" * 10_000 + b'"}\n')
    with pytest.raises(InvalidInput, match=r"d\.jsonl line 2: longer than 4,096 bytes"):
        read_documents(path, chunk_bytes=512)
    monkeypatch.setattr(jsonl, "JSON_ARRAY_LIMIT", 100)
    (tmp_path / "a.json").write_text(json.dumps([{"input_ids": [0, 1]}] * 20))
    with pytest.raises(InvalidInput, match="write it as JSON Lines"):
        read_documents(tmp_path / "a.json")


def test_a_line_longer_than_many_reads_is_read_whole(tmp_path):
    ids = list(range(2, 30_000))
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"input_ids": ids}) + "\n" + json.dumps({"input_ids": [0, 1]}))
    table = load_examples(path, vocab_size=30_000)
    assert table.windows.tolist() == [*ids, 0, 1]
    assert read_documents(path, chunk_bytes=7).tokens.tolist() == [*ids, 0, 1]


def test_an_unpaired_surrogate_is_named_by_its_line_and_column(tmp_path):
    """Arrow refuses the block without a line; the json module decodes the escape, so the
    re-read names the line and the column (a valid escaped pair is not flagged)."""
    path = tmp_path / "d.jsonl"
    pair = json.dumps({"text": "ok \U0001f600"})  # written as the escaped pair \ud83d\ude00
    path.write_text("\n".join([pair, "", '{"text": "bad \\ud800 here"}']) + "\n")
    with pytest.raises(InvalidInput, match=r"d\.jsonl line 3: 'text' holds an unpaired surrogate"):
        pack_path(path, tmp_path / "out", max_length=64, tokenizer="bytes")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("chunk", [16, 1 << 20])
def test_a_column_exactpack_does_not_read_may_mix_types(tmp_path, chunk):
    """Arrow's reader refuses a column whose type changes between lines; a column exactpack
    never reads must not fail the run, and the result equals the file without it."""
    rows = [{"input_ids": [0, 1, 2 + i % 3], "meta": i if i % 2 else f"s{i}"} for i in range(9)]
    mixed, plain = tmp_path / "mixed.jsonl", tmp_path / "plain.jsonl"
    mixed.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plain.write_text("".join(json.dumps({"input_ids": r["input_ids"]}) + "\n" for r in rows))
    got = pack_path(mixed, tmp_path / "a", max_length=8, vocab_size=10, chunk_bytes=chunk)
    want = pack_path(plain, tmp_path / "b", max_length=8, vocab_size=10, chunk_bytes=chunk)
    assert (got["examples"], got["rows"], got["tokens"]) == (9, want["rows"], want["tokens"])
    assert [
        t.column("tokens") for t in map(pq.read_table, sorted((tmp_path / "a").glob("*.parquet")))
    ] == [
        t.column("tokens") for t in map(pq.read_table, sorted((tmp_path / "b").glob("*.parquet")))
    ]


def test_a_byte_order_mark_alone_on_line_one_is_blank_when_the_json_module_reads_the_block(
    tmp_path,
):
    """Found by the grammar fuzzer: the block Arrow refuses (a column of mixed types) is
    read line by line, where a first line holding only the byte-order mark is blank."""
    path = tmp_path / "d.jsonl"
    rows = b'{"input_ids": [0, 1], "x": 1}\n{"input_ids": [2, 3], "x": "s"}\n'
    path.write_bytes(b"\xef\xbb\xbf\n" + rows)
    assert read_documents(path).tokens.tolist() == [0, 1, 2, 3]


def test_a_column_exactpack_reads_with_mixed_types_is_named_by_its_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "ok"}\n\n{"text": "ok too"}\n{"text": 5}\n')
    with pytest.raises(
        InvalidInput, match=r"d\.jsonl line 4: text holds a number where line 1 holds a string"
    ):
        pack_path(path, tmp_path / "out", max_length=64, tokenizer="bytes")
