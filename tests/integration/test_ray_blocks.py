"""The Ray engine's driver- and worker-side parts that need no cluster: JSON Lines blocks by
line ranges, the tokenizer the tasks encode with, the per-node record."""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactpack import InvalidInput
from exactpack.io.jsonl import read_jsonl
from exactpack.io.tokenizers import HFTokenizer, load_tokenizer
from exactpack.pipeline.options import PackOptions
from exactpack.ray import blocks as ray_blocks
from exactpack.ray.blocks import block_table, file_blocks, jsonl_pieces, read_slice
from exactpack.ray.driver import per_block, per_node
from exactpack.ray.shard_layout import ShardCuts
from exactpack.ray.tasks import Settings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from workloads import stdlib_texts, train_bpe

BLANKS = ("", " ", "\t", "  \r")


@st.composite
def jsonl_files(draw):
    """1-4 JSON Lines files: records, blank lines among them, maybe no final newline."""
    files = []
    for k in range(draw(st.integers(1, 4))):
        lines, n = [], draw(st.integers(1, 25))
        for i in range(n):
            lines += draw(st.lists(st.sampled_from(BLANKS), max_size=2))
            text = draw(st.text(st.characters(codec="utf-8"), max_size=12))
            lines.append(json.dumps({"id": f"{k}-{i}", "text": text}, ensure_ascii=False))
        end = draw(st.sampled_from(["", "\n", "\n\n", "\n  "]))
        files.append("\n".join(lines) + end)
    return files


def _write(folder, texts):
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, text in enumerate(texts):
        path = folder / f"part-{k:02d}.jsonl"
        path.write_bytes(text.encode("utf-8"))
        paths.append(path)
    return paths


@given(jsonl_files(), st.sampled_from([None, 1, 2, 3, 7, 1000]), st.integers(1, 64))
def test_line_range_blocks_read_every_record_once_in_order(
    tmp_path_factory, texts, size, scan_bytes
):
    paths = _write(tmp_path_factory.mktemp("j"), texts)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ray_blocks, "SCAN_BYTES", scan_bytes)  # lines across reads
        runs = jsonl_pieces(paths, size)
    want = [row for p in paths for row in read_jsonl(p).to_pylist()]
    got = [row for run in runs for piece in run for row in read_slice(piece, "text").to_pylist()]
    assert got == want
    sizes = [sum(p.stop - p.start for p in run) for run in runs]
    assert sum(sizes) == len(want)
    if size is None:
        assert len(runs) == len(paths)
    else:
        assert all(n == size for n in sizes[:-1]) and 0 < sizes[-1] <= size
    for run in runs:
        for piece in run:  # a range starts a line, numbered right; its first record is next
            k, lo, line = paths.index(Path(piece.name)), piece.lines.lo, piece.lines.line
            data = Path(piece.name).read_bytes()
            assert data[:lo].count(b"\n") + 1 == line and (lo == 0 or data[lo - 1] == 10)
            first = next(text for text in data[lo:].split(b"\n") if text.strip())
            assert json.loads(first)["id"] == f"{k}-{piece.start}"


def test_many_indented_records_and_blank_lines_are_counted_like_the_reader(tmp_path):
    lines = []
    for i in range(3000):  # more lines beginning with a blank than are stripped one by one
        lines.append(("  " if i % 3 else "") + json.dumps({"id": str(i), "text": "t"}))
        if i % 7 == 0:
            lines.append(" \t ")
    (path,) = _write(tmp_path / "in", ["\n".join(lines)])
    want = read_jsonl(path).column("id").to_pylist()
    for size in (None, 1000):
        blocks = file_blocks(tmp_path / "in", size)
        got = [i for b in blocks for i in block_table(b, "text", [])[0].column("id").to_pylist()]
        assert got == want


def test_a_bad_line_in_a_range_is_named_by_its_file_and_line(tmp_path):
    lines = [json.dumps({"text": f"doc {i}"}) for i in range(9)]
    lines.insert(3, "")  # line 4 is blank
    lines[7] = '{"text": "unterminated'  # line 8 (record 6, the third block of 3)
    (path,) = _write(tmp_path / "in", ["\n".join(lines) + "\n"])
    blocks = file_blocks(tmp_path / "in", 3)
    assert [b.pieces[0].lines.line for b in blocks] == [1, 5, 8]
    block_table(blocks[0], "text", [])
    with pytest.raises(InvalidInput, match=rf"^{path} line 8: not valid JSON") as err:
        block_table(blocks[2], "text", [])
    assert "exactpack-block-" not in str(err.value)  # never the worker's temporary copy
    with pytest.raises(InvalidInput) as local:  # the local reader's message for the file
        read_jsonl(path)
    assert str(local.value) == str(err.value)


def test_a_row_of_a_range_is_named_by_its_line(tmp_path):
    lines = [json.dumps({"id": f"d{i}", "text": "ok"}) for i in range(8)]
    lines[6] = json.dumps({"id": "d6", "text": None})  # a missing text, line 7
    _write(tmp_path / "in", ["\n".join(lines)])
    block = file_blocks(tmp_path / "in", 4)[1]
    table, origin = block_table(block, "text", [])
    assert origin.locate(2) == f"{tmp_path / 'in' / 'part-00.jsonl'} line 7"
    assert table.column("id").to_pylist() == ["d4", "d5", "d6", "d7"]


def test_inputs_the_ray_engine_refuses_are_named(tmp_path):
    (tmp_path / "array.json").write_text('[{"text": "a"}]')
    with pytest.raises(InvalidInput, match=r"array\.json holds one JSON array.*JSON Lines"):
        file_blocks(tmp_path / "array.json", None)
    _write(tmp_path / "empty", ["{}\n", "\n  \n"])
    with pytest.raises(InvalidInput, match=r"part-01\.jsonl is empty"):
        file_blocks(tmp_path / "empty", None)
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "a.csv").write_text("text\n")
    with pytest.raises(InvalidInput, match=r"no \*\.parquet or \*\.jsonl shards"):
        file_blocks(tmp_path / "none", None)
    with pytest.raises(InvalidInput, match=r"unknown input type '\.csv'"):
        file_blocks(tmp_path / "none" / "a.csv", None)


def test_a_file_changed_after_the_scan_is_refused(tmp_path):
    (path,) = _write(tmp_path / "in", ["\n".join(json.dumps({"text": "x"}) for _ in range(6))])
    block, scanned = file_blocks(tmp_path / "in", 3)[0], path.stat().st_size
    path.write_text(path.read_text().replace("\n", "\n\n{}\n", 1))
    now = path.stat().st_size
    with pytest.raises(
        InvalidInput, match=rf"holds {now} bytes where the driver scanned {scanned}"
    ):
        block_table(block, "text", [])


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    texts = [t for _, t in stdlib_texts(200, 2000)[:40]]
    path = train_bpe(texts, 400, tmp_path_factory.mktemp("tok") / "tokenizer.json")
    return path, texts


def test_the_tokenizer_a_task_encodes_with_gives_the_ids_of_a_full_encode(bpe):
    """A task encodes with the loaded tokenizer itself: ``encode_batch_fast`` (no offsets or
    strings), the same ids as the Rust tokenizer's full ``encode_batch``."""
    tokenizers = pytest.importorskip("tokenizers")
    path, texts = bpe
    ids, offsets = load_tokenizer(path).encode_batch(texts)
    full = [e.ids for e in tokenizers.Tokenizer.from_file(str(path)).encode_batch(texts)]
    assert ids.dtype == np.int32 and np.array_equal(np.diff(offsets), [len(x) for x in full])
    assert np.array_equal(ids, np.concatenate(full))


@pytest.mark.parametrize("kind", ["tokenizers", "transformers"])
def test_a_pickled_tokenizer_needs_no_files(bpe, tmp_path, kind):
    """What the driver ships (Settings through the object store) carries the tokenizer's
    content: it encodes with its folder gone (a transformers tokenizer still records the
    folder's name as metadata, ``name_or_path``, but never reads it)."""
    path, texts = bpe
    folder = tmp_path / "tok"
    if kind == "transformers":
        from transformers import PreTrainedTokenizerFast

        hf = PreTrainedTokenizerFast(tokenizer_file=str(path), bos_token="<s>", eos_token="</s>")
        hf.save_pretrained(folder)
    else:
        folder.mkdir()
        shutil.copy(path, folder / "tokenizer.json")
    loaded = load_tokenizer(folder)
    assert isinstance(loaded, HFTokenizer) and loaded.kind == kind
    want = loaded.encode_batch(texts)
    cloudpickle = pytest.importorskip("ray.cloudpickle")  # what ray.put pickles with
    shipped = cloudpickle.dumps(Settings(PackOptions(max_length=64, tokenizer=loaded)))
    shutil.rmtree(folder)
    assert (str(folder).encode() in shipped) == (kind == "transformers")
    again = cloudpickle.loads(shipped).options.load_tokenizer()
    assert again.identity == loaded.identity and again.vocab_size == loaded.vocab_size
    for got, ref in zip(again.encode_batch(texts), want, strict=True):
        assert np.array_equal(got, ref)


def test_write_seconds_are_shared_by_rows_and_nodes_sum_their_tasks():
    layout = ShardCuts(2, 4)
    stats = [
        {"examples": 9, "rows": 6, "tokens": 50, "cuts": []},
        {"examples": 3, "rows": 2, "tokens": 10, "cuts": []},
    ]
    shards = [s for b in stats for s in layout.add(b)]
    assert [[(j, a, b) for j, a, b, _ in s.spans] for s in shards] == [
        [(0, 0, 4)],
        [(0, 4, 6), (1, 0, 2)],
    ]
    timed = [
        b
        | {"node": n, "node_ip": "127.0.0.1", "read_seconds": 1.0, "tokenize_seconds": 2.0}
        | {"plan_seconds": 0.5, "plan_cpu_seconds": 3.0}
        for b, n in zip(stats, ["a", "b"], strict=True)
    ]
    runs = [
        {"node": "b", "node_ip": "127.0.0.1", "write_seconds": 0.2, "write_cpu_seconds": 0.1},
        {"node": "a", "node_ip": "127.0.0.1", "write_seconds": 0.4, "write_cpu_seconds": 0.3},
    ]
    blocks = per_block(layout, timed, shards, runs)  # shard 1: 2 rows of block 0, 2 of block 1
    assert [b["write_seconds"] for b in blocks] == pytest.approx([0.2 + 0.2, 0.2])
    assert [b["write_cpu_seconds"] for b in blocks] == pytest.approx([0.1 + 0.15, 0.15])
    assert [b["first_row"] for b in blocks] == [0, 6]
    nodes = per_node(blocks, [{"shard": 0} | runs[0], {"shard": 1} | runs[1]])
    assert [n["node"] for n in nodes] == ["a", "b"]  # busiest first: 3.5 + 0.4 > 3.5 + 0.2
    a = nodes[0]
    assert (a["blocks"], a["examples"], a["tokens"], a["shards"]) == (1, 9, 50, 1)
    assert a["busy_seconds"] == pytest.approx(3.9)
    assert (a["plan_cpu_seconds"], a["write_cpu_seconds"]) == pytest.approx((3.0, 0.3))
    assert a["plan_tokens_per_second"] == pytest.approx(50 / 3.5)
