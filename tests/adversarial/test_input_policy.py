"""The one input policy (exactpack.io.files), case class by case class: files outside the input,
special files, names in any case, stray files, bombs (Parquet, compressed, JSON keys),
compressed / piped / many-file inputs equal to the plain file, and Ray's driver."""

import bz2
import contextlib
import gzip
import io
import json
import lzma
import os
import subprocess
import sys
import time

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from exactpack.core.errors import InvalidInput, NotAvailable
from exactpack.io.files import ReadLimits, open_regular, open_stream, read_limited, resolve_inside
from exactpack.io.jsonl import line_blocks
from exactpack.io.readers import read_documents
from exactpack.pipeline.local import pack_path

DOCS = [{"id": f"d{i}", "input_ids": [0, 5 + i % 7, 6, 1]} for i in range(40)]


def _jsonl(docs=DOCS) -> bytes:
    return "".join(json.dumps(d) + "\n" for d in docs).encode()


def _save(folder, docs=DOCS, shards=1):
    with contextlib.redirect_stderr(io.StringIO()):
        datasets.Dataset.from_list(docs).save_to_disk(str(folder), num_shards=shards)


def _shards(out):
    return [s["sha256"] for s in json.loads((out / "manifest.json").read_text())["shards"]]


def _pack(source, out, **kw):
    return pack_path(source, out, max_length=8, vocab_size=300, policy="next-fit", **kw)


# --- files outside the input -----------------------------------------------------------


@pytest.mark.parametrize("name", ["../other/data-00000-of-00001.arrow", "/etc/passwd"])
def test_a_state_json_naming_a_file_outside_the_folder_is_refused(tmp_path, name):
    _save(tmp_path / "other")
    _save(tmp_path / "ds")
    state = json.loads((tmp_path / "ds/state.json").read_text())
    state["_data_files"] = [{"filename": name}]
    (tmp_path / "ds/state.json").write_text(json.dumps(state))
    with pytest.raises(InvalidInput, match="outside itself"):
        read_documents(tmp_path / "ds")
    with pytest.raises(InvalidInput, match="outside itself"):
        _pack(tmp_path / "ds", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_symlink_leaving_a_datasets_folder_is_refused(tmp_path):
    _save(tmp_path / "other")
    _save(tmp_path / "ds")
    data = tmp_path / "ds/data-00000-of-00001.arrow"
    data.unlink()
    data.symlink_to(tmp_path / "other/data-00000-of-00001.arrow")
    with pytest.raises(InvalidInput, match="outside the input"):
        read_documents(tmp_path / "ds")


def test_a_symlink_leaving_a_folder_of_shards_is_refused_one_inside_is_read(tmp_path):
    (tmp_path / "elsewhere.jsonl").write_bytes(_jsonl())
    (tmp_path / "in").mkdir()
    (tmp_path / "in/a.jsonl").write_bytes(_jsonl())
    (tmp_path / "in/b.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    with pytest.raises(InvalidInput, match=r"b\.jsonl resolves to .*outside the input"):
        read_documents(tmp_path / "in")
    (tmp_path / "in/b.jsonl").unlink()
    (tmp_path / "in/b.jsonl").symlink_to("a.jsonl")  # inside: read as the file it names
    assert len(read_documents(tmp_path / "in")) == 2 * len(DOCS)


def test_names_read_from_files_stay_inside_and_small_files_are_bounded(tmp_path):
    for name in ("../x", "/abs", "a/../../x", "C:\\x", ""):
        with pytest.raises(InvalidInput, match="outside itself"):
            resolve_inside(tmp_path, name)
    assert resolve_inside(tmp_path, "sub/x.arrow") == tmp_path / "sub" / "x.arrow"
    sparse = tmp_path / "chat_template.jinja"
    with sparse.open("wb") as f:
        f.truncate(1 << 40)  # a sparse terabyte: refused from its size, never read
    with pytest.raises(InvalidInput, match="1,099,511,627,776 bytes, more than the 1,024"):
        read_limited(sparse, 1024)
    with pytest.raises(InvalidInput, match="outside the input"):
        open_regular("/etc/hostname", root=tmp_path)


# --- special files -----------------------------------------------------------------------


def test_a_fifo_inside_a_datasets_folder_is_refused_at_once(tmp_path):
    _save(tmp_path / "ds")
    data = tmp_path / "ds/data-00000-of-00001.arrow"
    data.unlink()
    os.mkfifo(data)  # no writer: opening it for reading would block forever
    started = time.perf_counter()
    with pytest.raises(InvalidInput, match="is a FIFO"):
        read_documents(tmp_path / "ds")
    (tmp_path / "ds/dataset_info.json").unlink()
    os.mkfifo(tmp_path / "ds/dataset_info.json")
    with pytest.raises(InvalidInput, match="is a FIFO"):
        read_documents(tmp_path / "ds")
    assert time.perf_counter() - started < 10


# --- names in any case, stray files ------------------------------------------------------


def test_uppercase_and_json_shards_are_read_stray_data_files_are_named(tmp_path):
    pq.write_table(pa.table({"input_ids": [[0, 5, 1]] * 3}), tmp_path / "A.parquet")
    pq.write_table(pa.table({"input_ids": [[0, 6, 1]] * 2}), tmp_path / "B.PARQUET")
    (tmp_path / "dataset_info.json").write_text("{}")  # metadata beside shards: ignored
    (tmp_path / "README.md").write_text("notes")
    assert len(read_documents(tmp_path)) == 5
    (tmp_path / "c.csv").write_text("input_ids\n")
    (tmp_path / "d.parquet.bak").write_text("old")
    with pytest.raises(InvalidInput, match=r"holds c\.csv, d\.parquet\.bak beside its shards"):
        read_documents(tmp_path)
    folder = tmp_path / "jl"
    folder.mkdir()
    (folder / "a.jsonl").write_bytes(_jsonl(DOCS[:3]))
    (folder / "b.json").write_text(json.dumps(DOCS[3:5]))  # a JSON array shard is read too
    (folder / "c.JSONL.GZ").write_bytes(gzip.compress(_jsonl(DOCS[5:9])))
    assert read_documents(folder).ids.tolist() == [d["id"] for d in DOCS[:9]]


# --- bombs ---------------------------------------------------------------------------------


def _parquet_bomb(path):
    # 16 M identical ids: run-length encoded, a couple of KB on disk, 144 MB decoded
    ids = pa.array(np.zeros(16_000_000, np.int64))
    lists = pa.ListArray.from_arrays(np.arange(0, 16_000_001, 1000, dtype=np.int32), ids)
    pq.write_table(pa.table({"input_ids": lists}), path, compression="zstd")


def _read_in_a_child(path) -> tuple[str, str]:
    """``read_documents(path)`` in a fresh process (bounded by a timeout): its refusal
    and how many MiB its peak RSS grew by."""
    code = (
        "import resource, sys\n"
        "from exactpack.io.readers import read_documents\n"
        "from exactpack.core.errors import InvalidInput\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n    read_documents(sys.argv[1])\nexcept InvalidInput as e:\n    print(e)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    message, grown = proc.stdout.strip().splitlines()
    return message, grown


def test_a_parquet_decompression_bomb_is_refused_before_memory_grows(tmp_path):
    _parquet_bomb(tmp_path / "bomb.parquet")
    assert (tmp_path / "bomb.parquet").stat().st_size < 10_000
    message, grown = _read_in_a_child(tmp_path / "bomb.parquet")
    assert "row group 0 would decode to" in message and "decompression bomb" in message
    assert int(grown) < 64  # MiB: the 144 MB of values were never decoded


def test_a_page_header_claiming_a_huge_boolean_map_is_refused_quickly(tmp_path):
    # a Thrift map of 2**60 (bool, bool) entries: each entry is one byte in the compact
    # protocol, so the walk reaches the chunk's end; it once skipped them reading nothing
    pq.write_table(pa.table({"input_ids": [[0, 5, 1]] * 4}), tmp_path / "ok.parquet")
    data = (tmp_path / "ok.parquet").read_bytes()
    start = pq.ParquetFile(tmp_path / "ok.parquet").metadata.row_group(0).column(0)
    start = start.dictionary_page_offset or start.data_page_offset
    # field 15 (delta 15) of type 11 (map), size varint 2**60, key/value types 1/1
    huge = bytes([0xFB]) + bytes([0x80] * 8 + [0x10]) + bytes([0x11])
    (tmp_path / "m.parquet").write_bytes(data[:start] + huge + data[start + len(huge) :])
    message, _ = _read_in_a_child(tmp_path / "m.parquet")
    assert "row group 0 cannot be read as Parquet" in message


def test_the_budget_bounds_a_parquet_row_group(tmp_path):
    # one row group of 9 M ids (81 MB decoded): over a 1 GiB budget's share of one read
    # (4 x --chunk-bytes, at least 64 MiB), refused before it is decoded
    ids = pa.array(np.arange(9_000_000, dtype=np.int64) % 3000)
    docs = pa.table({"input_ids": pa.ListArray.from_arrays(np.arange(0, 9_000_001, 30_000), ids)})
    pq.write_table(docs, tmp_path / "a.parquet", row_group_size=300)
    with pytest.raises(InvalidInput, match="more than the 67,108,864 bytes a read may use"):
        pack_path(tmp_path / "a.parquet", tmp_path / "o", max_length=40_000, vocab_size=4000,
                  max_metadata_bytes=1 << 30, chunk_bytes=1 << 10)  # fmt: skip
    assert not (tmp_path / "o").exists()


def test_a_gzip_bomb_is_refused_after_a_bounded_read(tmp_path):
    # one 100 MB line in 100 KB: refused once 64 MiB (the floor; 200x is less) came out
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(b"{" + b"x" * (100 << 20), 9))
    assert (tmp_path / "b.jsonl.gz").stat().st_size < 500_000
    with pytest.raises(InvalidInput, match="decompresses to more than 67,108,864 bytes"):
        read_documents(tmp_path / "b.jsonl.gz")


@pytest.mark.parametrize(
    ("name", "line"), [("e.txt.gz", b"\n"), ("e.txt.gz", b"\r"), ("r.jsonl.gz", b"{}\n")]
)
def test_lines_count_toward_the_limit_as_they_are_read(tmp_path, name, line):
    """Each line becomes a document: 1 MB of gzipped empty lines ran two minutes to 3.8 GB
    before the limit on bytes tripped. Lines now count 256 bytes each as they are read."""
    (tmp_path / name).write_bytes(gzip.compress(line * 3_000_000, 9))
    limits = ReadLimits(floor=1 << 20)  # 1 MiB: 4,096 lines
    stream = open_stream(tmp_path / name, limits=limits)
    with (
        stream,
        pytest.raises(InvalidInput, match=r"counting 256 bytes for each of its [\d,]+\+ lines"),
    ):
        for _ in line_blocks(stream, 1 << 16, tmp_path / name):
            pass
    assert stream.out <= 1 << 16  # refused within the first block, before a document exists
    real = b'{"input_ids": [0, 5, 9, 1], "id": "doc-0001"}\n' * 20_000  # 46 bytes a line
    (tmp_path / "ok.jsonl.gz").write_bytes(gzip.compress(real))
    with open_stream(tmp_path / "ok.jsonl.gz", limits=ReadLimits(floor=7 << 20)) as ok:
        assert sum(len(b) for b in line_blocks(ok, 1 << 16, tmp_path / "ok.jsonl.gz")) == len(real)


def test_many_distinct_json_keys_are_refused_quickly(tmp_path):
    path = tmp_path / "k.jsonl"
    path.write_text("".join(json.dumps({"input_ids": [0, 5, 1], f"k{i}": 1}) + "\n"
                            for i in range(15_000)))  # fmt: skip
    started = time.perf_counter()
    with pytest.raises(InvalidInput, match=r"k\.jsonl line 1,?024: more than 1,024 distinct keys"):
        read_documents(path)
    assert time.perf_counter() - started < 10  # was 56 s and 3.6 GB
    few = tmp_path / "few.jsonl"  # keys that vary in a sparse way over a block: cells bound
    few.write_text("".join(json.dumps({"input_ids": [0, 1], f"k{i % 900}": 1}) + "\n"
                           for i in range(20_000)))  # fmt: skip
    with pytest.raises(InvalidInput, match="mostly empty cells"):
        read_documents(few)


def test_a_json_array_with_a_duplicate_key_is_refused_naming_the_row(tmp_path):
    (tmp_path / "a.json").write_text(
        '[{"input_ids": [0, 5, 1]}, {"input_ids": [0, 5, 1], "input_ids": [0, 9, 1]}]'
    )
    with pytest.raises(InvalidInput, match=r"a\.json row 1: key 'input_ids' appears twice"):
        read_documents(tmp_path / "a.json")


# --- compressed, piped, many files ---------------------------------------------------------


@pytest.mark.parametrize(
    ("suffix", "compress"),
    [(".gz", gzip.compress), (".bz2", bz2.compress), (".xz", lzma.compress), (".zst", None)],
)
def test_a_compressed_corpus_packs_as_the_plain_file(tmp_path, suffix, compress):
    plain = tmp_path / "c.jsonl"
    plain.write_bytes(_jsonl())
    packed = tmp_path / f"c.jsonl{suffix}"
    if compress is None:
        with pa.CompressedOutputStream(str(packed), "zstd") as out:
            out.write(plain.read_bytes())
    else:
        packed.write_bytes(compress(plain.read_bytes()))
    _pack(plain, tmp_path / "a", chunk_bytes=100)
    _pack(packed, tmp_path / "b", chunk_bytes=100)
    assert _shards(tmp_path / "a") == _shards(tmp_path / "b")


def test_standard_input_and_a_gzip_file_pack_as_the_plain_file(tmp_path):
    (tmp_path / "c.jsonl").write_bytes(_jsonl())
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(_jsonl()))
    argv = ["--max-length", "8", "--vocab-size", "300", "--policy", "next-fit"]

    def cli(source, out, stdin=None):
        proc = subprocess.run(
            [sys.executable, "-m", "exactpack", "pack", source, "--out", str(out), *argv],
            input=stdin, capture_output=True, timeout=120, check=False, cwd=tmp_path,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr

    cli("c.jsonl", tmp_path / "plain")
    cli("c.jsonl.gz", tmp_path / "gz")
    cli("-", tmp_path / "piped", stdin=_jsonl())
    want = _shards(tmp_path / "plain")
    assert _shards(tmp_path / "gz") == want == _shards(tmp_path / "piped")


def test_a_bad_line_on_standard_input_is_named_without_a_second_read(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "exactpack", "pack", "-", "--out", str(tmp_path / "o"),
         "--max-length", "8", "--vocab-size", "300"],
        input=_jsonl(DOCS[:3]) + b'{"input_ids": [0, 1\n', capture_output=True, text=False,
        timeout=120, check=False,
    )  # fmt: skip
    err = proc.stderr.decode()
    assert proc.returncode == 2 and err.count("\n") == 1, err
    assert "<stdin> line 4: not valid JSON" in err
    assert not (tmp_path / "o").exists()


def test_several_paths_and_a_glob_are_one_input_in_order(tmp_path):
    (tmp_path / "p").mkdir()
    for k in range(3):
        (tmp_path / "p" / f"part-{k}.jsonl").write_bytes(_jsonl(DOCS[k * 10 : (k + 1) * 10]))
    _pack(tmp_path / "p", tmp_path / "folder")
    _pack(sorted((tmp_path / "p").glob("*.jsonl")), tmp_path / "list")
    _pack(str(tmp_path / "p" / "part-*.jsonl"), tmp_path / "glob")
    assert _shards(tmp_path / "folder") == _shards(tmp_path / "list") == _shards(tmp_path / "glob")
    with pytest.raises(InvalidInput, match="matches no file"):
        read_documents(str(tmp_path / "nothing-*.jsonl"))
    pq.write_table(pa.table({"input_ids": [[0, 1]]}), tmp_path / "x.parquet")
    with pytest.raises(InvalidInput, match="mix Parquet and JSON Lines"):
        read_documents([tmp_path / "p", tmp_path / "x.parquet"])


# --- Ray's driver: the same policy before Ray starts ----------------------------------------


def test_ray_lays_out_blocks_through_the_same_policy(tmp_path):
    from exactpack.ray.blocks import file_blocks

    (tmp_path / "zero.jsonl").symlink_to("/dev/zero")  # would be read until memory ran out
    with pytest.raises(InvalidInput, match="is a character device"):
        file_blocks(tmp_path / "zero.jsonl", None)
    (tmp_path / "f").mkdir()
    os.mkfifo(tmp_path / "f/a.jsonl")
    with pytest.raises(InvalidInput, match="is a FIFO"):
        file_blocks(tmp_path / "f", None)
    (tmp_path / "g").mkdir()
    pq.write_table(pa.table({"input_ids": [[0, 5, 1]] * 4}), tmp_path / "g/A.PARQUET")
    assert sum(b.pieces[0].stop for b in file_blocks(tmp_path / "g", None)) == 4
    (tmp_path / "g/extra.csv").write_text("x")
    with pytest.raises(InvalidInput, match=r"holds extra\.csv"):
        file_blocks(tmp_path / "g", None)
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(_jsonl()))
    with pytest.raises(InvalidInput, match="decompress it first, or pack it with --engine local"):
        file_blocks(tmp_path / "c.jsonl.gz", None)


def test_ray_workers_bound_parquet_row_groups(tmp_path):
    from exactpack.ray.blocks import InputSlice, read_slice

    _parquet_bomb(tmp_path / "bomb.parquet")
    with pytest.raises(InvalidInput, match="decompression bomb"):
        read_slice(InputSlice(str(tmp_path / "bomb.parquet"), 0, 16_000, 0), "text")


def test_an_unreachable_ray_address_fails_within_seconds():
    pytest.importorskip("ray")
    from exactpack.ray.driver import check_reachable

    started = time.perf_counter()
    with pytest.raises(NotAvailable, match=r"no Ray cluster answers at '127\.0\.0\.1:1'"):
        check_reachable("127.0.0.1:1")
    with pytest.raises(InvalidInput, match="is not HOST:PORT"):
        check_reachable("10.0.0.1:port")
    assert time.perf_counter() - started < 10


def test_progress_counts_the_compressed_bytes(tmp_path):
    from exactpack.io.readers import open_input

    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(_jsonl(DOCS * 50)))
    source = open_input(tmp_path / "c.jsonl.gz")
    sizes = [size for _, _, size in source.chunks(2000)]
    assert len(sizes) > 3  # several chunks, each counted by what it took of the file
    assert sum(sizes) == source.bytes == (tmp_path / "c.jsonl.gz").stat().st_size


def test_a_dataset_dict_split_outside_the_folder_and_a_packed_folder_are_refused(tmp_path):
    with contextlib.redirect_stderr(io.StringIO()):
        datasets.DatasetDict({"train": datasets.Dataset.from_list(DOCS)}).save_to_disk(
            str(tmp_path / "dd")
        )
    assert len(read_documents(tmp_path / "dd")) == len(DOCS)
    (tmp_path / "dd/dataset_dict.json").write_text(json.dumps({"splits": ["../elsewhere"]}))
    with pytest.raises(InvalidInput, match=r"names a split folder '\.\./elsewhere' outside itself"):
        read_documents(tmp_path / "dd")
    (tmp_path / "in.jsonl").write_bytes(_jsonl())
    _pack(tmp_path / "in.jsonl", tmp_path / "packed")
    with pytest.raises(InvalidInput, match=r"is a exactpack output .* it is already packed"):
        read_documents(tmp_path / "packed")
