"""`exactpack pack` and `exactpack stats` through the real entry point (`python -m exactpack`)."""

import json
import subprocess
import sys

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from exactpack import plan_rows
from exactpack.core.policies import POLICIES
from exactpack.io.store import load_packed

from support.packed_helpers import expected_flags, random_records, recovered_examples, write_jsonl


def exactpack(*args):
    return subprocess.run(
        [sys.executable, "-m", "exactpack", *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture(scope="module")
def records():
    import numpy as np

    return random_records(np.random.default_rng(7), 150, vocab=1000, max_len=64)


@pytest.fixture
def jsonl(tmp_path, records):
    return write_jsonl(tmp_path / "data.jsonl", records)


def test_pack_json_stats_and_exact_round_trip(tmp_path, jsonl, records):
    out = tmp_path / "packed"
    proc = exactpack(
        "pack", jsonl, "--max-length", 128, "--policy", "best-fit-decreasing", "--out", out,
        "--vocab-size", 1000, "--json", "--max-rows-per-batch", 3,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    plan = plan_rows([len(r["input_ids"]) - 1 for r in records], 128, "best-fit-decreasing")
    want = plan.stats()
    for key in ("examples", "tokens", "rows", "lower_bound", "efficiency"):
        assert stats[key] == want[key]
    assert stats["seconds"] > 0
    store = load_packed(out)
    assert store.max_rows_per_batch == 3 and len(store) == -(-want["rows"] // 3)
    got = recovered_examples(store)
    assert len(got) == len(records)
    for ex in got.values():
        record = next(r for r in records if r["id"] == ex["source_id"])
        assert ex["tokens"] == record["input_ids"]
        assert ex["loss"] == expected_flags(record)
        assert ex["range"] == (0, len(record["input_ids"]))


def test_parquet_folder_and_datasets_folder_inputs(tmp_path, records):
    ids = [r["input_ids"] for r in records]
    shards = tmp_path / "shards"
    shards.mkdir()
    for k in range(3):
        part = ids[k * 50 : (k + 1) * 50]
        pq.write_table(pa.table({"input_ids": part}), shards / f"{k:02d}.parquet")
    datasets.Dataset.from_dict({"input_ids": ids}).save_to_disk(str(tmp_path / "ds"))
    results = []
    for source in (shards, tmp_path / "ds"):
        out = tmp_path / f"out-{source.name}"
        proc = exactpack("pack", source, "--max-length", 100, "--policy", "next-fit", "--out", out,
                       "--vocab-size", 1000, "--json")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        results.append(json.loads(proc.stdout.splitlines()[-1]))
        got = recovered_examples(load_packed(out))
        assert [got[i]["tokens"] for i in range(len(ids))] == ids
    assert results[0]["rows"] == results[1]["rows"]


def test_text_with_the_byte_tokenizer_and_overwrite(tmp_path):
    texts = ["hello world", "packing keeps contexts apart", "ü"]
    path = write_jsonl(
        tmp_path / "t.jsonl", [{"id": f"t{i}", "text": t} for i, t in enumerate(texts)]
    )
    out = tmp_path / "out"
    args = (
        "pack",
        path,
        "--max-length",
        40,
        "--policy",
        "next-fit",
        "--out",
        out,
        "--tokenizer",
        "bytes",
    )
    assert exactpack(*args).returncode == 0
    again = exactpack(*args)
    assert again.returncode == 2
    assert (
        again.stderr.strip()
        == f"exactpack pack: error: {out} already exists — pass --overwrite to replace it"
    )
    replaced = exactpack(*args, "--overwrite", "--json")
    assert replaced.returncode == 0, replaced.stderr
    store = load_packed(out)
    assert store.binding.tokenizer_id == "exactpack/bytes-266" and store.binding.vocab_size == 266
    got = recovered_examples(store)
    from exactpack.io.tokenizers import ByteTokenizer

    for ex in got.values():
        assert ByteTokenizer().decode(ex["tokens"]) == texts[int(ex["source_id"][1:])]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ((), "pre-tokenized input needs --vocab-size"),
        (("--vocab-size", 10), "is not below the vocabulary size 10"),
        (
            ("--vocab-size", 1000, "--max-length", 8),
            "are longer than 9 tokens (max_length 8; a row holds 8 prediction pairs)",
        ),
        (("--vocab-size", 1000, "--policy", "nope"), "unknown policy 'nope'"),
    ],
)
def test_errors_are_one_line_with_exit_code_2(tmp_path, jsonl, extra, message):
    args = ["pack", jsonl, "--out", tmp_path / "out", "--policy", "next-fit", "--max-length", 64]
    proc = exactpack(*args, *extra)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("exactpack pack: error: ")
    assert message in proc.stderr
    assert not (tmp_path / "out").exists()


def test_stats_json_table_and_plot(tmp_path, jsonl, records):
    png = tmp_path / "stats.png"
    proc = exactpack("stats", jsonl, "--max-length", 128, "--json", "--plot", png)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.splitlines()[-1])
    assert [p["policy"] for p in report["policies"]] == list(POLICIES)
    lengths = [len(r["input_ids"]) - 1 for r in records]
    for entry in report["policies"]:
        assert entry["rows"] == plan_rows(lengths, 128, entry["policy"]).num_rows
    assert png.read_bytes()[:4] == b"\x89PNG"
    text = exactpack("stats", jsonl, "--max-length", 128, "--policy", "next-fit")
    assert text.returncode == 0 and "next-fit" in text.stdout and "rows/LB" in text.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl", "stats.png"]


def test_max_length_is_the_input_ids_width_in_every_format(tmp_path, jsonl):
    """One --max-length, two formats: exactpack rows are input_ids of exactly N tokens (a cell
    per input token), TRL rows at most N tokens (TRL's max_length)."""
    from exactpack.training import PackedBatches, PackedCollator

    base = ("pack", jsonl, "--vocab-size", 1000, "--max-length", 64, "--json")
    assert exactpack(*base, "--out", tmp_path / "s").returncode == 0
    assert exactpack(*base, "--out", tmp_path / "t", "--format", "trl").returncode == 0
    rows = PackedBatches(tmp_path / "s")
    assert PackedCollator()(rows[0])["input_ids"].shape[1] == 64 == rows.capacity
    trl = pq.read_table(sorted((tmp_path / "t").glob("*.parquet"))[0])
    widths = [len(ids) for ids in trl.column("input_ids").to_pylist()]
    assert max(widths) <= 64 and max(widths) > 32
    missing = exactpack("pack", jsonl, "--vocab-size", 1000, "--out", tmp_path / "m")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "required: --max-length" in missing.stderr


def test_max_length_is_the_only_keyword_for_the_row_width():
    from exactpack.pipeline.options import PackOptions

    options = PackOptions(max_length=64, vocab_size=10)
    assert options == PackOptions.of(max_length=64, vocab_size=10) == PackOptions(64, vocab_size=10)
    assert options.capacity == options.max_length == 64
    assert PackOptions(max_length=64, format="trl").pair_capacity == 63
    with pytest.raises(TypeError, match="capacity"):
        PackOptions(capacity=64)
    with pytest.raises(ValueError, match="max_length must be"):
        PackOptions(max_length=0)


def test_a_plain_text_file_is_one_document_per_line_as_datasets_reads_it(tmp_path):
    """``.txt`` / ``.txt.gz``: one document per line, split as the ``datasets`` "text"
    builder splits it (universal newlines, empty lines kept), packed like the JSON Lines
    file of the same ``{"text": line}`` rows (issue 23)."""
    import gzip

    from exactpack.io.readers import read_documents
    from exactpack.io.tokenizers import ByteTokenizer
    from exactpack.pipeline.local import pack_path

    raw = "hello world\r\nsecond line\n\nü and \r a lone CR\n  \nlast, no newline".encode()
    (tmp_path / "c.txt").write_bytes(raw)
    (tmp_path / "c.txt.gz").write_bytes(gzip.compress(raw))
    lines = datasets.load_dataset(
        "text", data_files=str(tmp_path / "c.txt"), split="train", cache_dir=str(tmp_path / "hf")
    )["text"]
    assert len(lines) == 7 and lines[2] == ""
    tok = ByteTokenizer()
    for name in ("c.txt", "c.txt.gz"):
        docs = read_documents(tmp_path / name, tokenizer=tok)
        got = [
            tok.decode(docs.tokens[a:b])
            for a, b in zip(docs.offsets[:-1], docs.offsets[1:], strict=True)
        ]
        assert got == lines and docs.ids.tolist() == [str(i) for i in range(7)]
    write_jsonl(tmp_path / "c.jsonl", [{"text": line} for line in lines])
    outs = {}
    for name in ("c.txt", "c.txt.gz", "c.jsonl"):
        args = ("pack", tmp_path / name, "--tokenizer", "bytes", "--max-length", 40)
        done = exactpack(*args, "--out", tmp_path / f"out-{name}")
        assert done.returncode == 0, done.stderr
        outs[name] = recovered_examples(load_packed(tmp_path / f"out-{name}"))
    assert outs["c.txt"] == outs["c.jsonl"] == outs["c.txt.gz"]
    stats = pack_path(tmp_path / "c.txt", tmp_path / "lib", max_length=40, tokenizer="bytes")
    assert stats["examples"] == 7
    (tmp_path / "bad.txt").write_bytes(b"fine\nnot \xff utf-8\n")
    bad = exactpack(
        "pack",
        tmp_path / "bad.txt",
        "--tokenizer",
        "bytes",
        "--max-length",
        8,
        "--out",
        tmp_path / "x",
    )
    assert bad.returncode == 2 and "bad.txt line 2: not UTF-8 text" in bad.stderr
