"""format="trl": TRL 1.16's packed schema from pack_dataset and `exactpack pack --format trl`.

Contracts ported from TRL's own ``pack_dataset`` tests (tests/test_data_utils.py,
``TestPackDatasetBfd``) where they apply, checked against the real ``trl`` package;
where exactpack deliberately differs (an over-long example is an error or split with
every pair kept, never truncated; an example with no pair is an error, never dropped)
the test says so.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("trl")

import datasets
import trl
from datasets import Dataset

from exactpack.core.errors import InvalidInput, OversizedExample
from exactpack.hf import load_trl, pack_dataset, packed_metadata, to_batches
from exactpack.io.integrity import check_checksums, check_manifest, read_manifest
from exactpack.io.store import load_packed
from exactpack.io.trl_schema import check_trl_contents

from support.trl_helpers import tokenizer


def verify_folder(folder):
    """Every check of every depth of a TRL-format output; its manifest."""
    manifest = read_manifest(folder)
    check_manifest(manifest, folder)
    check_checksums(manifest, folder)
    check_trl_contents(manifest, folder)
    return manifest


A, B, C = [0, 99, 100, 1], [0, 101, 1], [0, 102, 103, 104, 1]
#: TRL's own packed columns and labels between them, always (supervised or masked).
TRL_COLUMNS = ["input_ids", "labels", "seq_lengths"]


def _collated(row: dict) -> tuple[list[int], list[int], list[int]]:
    """One packed row as TRL's padding-free collator hands it to the model: input_ids,
    labels and position_ids (derived from seq_lengths; labels from the row or its ids)."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)([row])
    return tuple(batch[c][0].tolist() for c in ("input_ids", "labels", "position_ids"))


def _examples_of(packed: dict) -> list[tuple[list[int], list[int]]]:
    """Every example of the packed rows, as (tokens, labels) as TRL's collator trains
    them, cut by seq_lengths; the positions are checked to restart at 0 on the way."""
    out = []
    for r in range(len(packed["input_ids"])):
        row = {c: packed[c][r] for c in packed}
        ids, labels, pos = _collated(row)
        lens = row["seq_lengths"]
        assert len(ids) == len(labels) == len(pos) == sum(lens) == len(row["input_ids"])
        start = 0
        for n in lens:
            assert list(pos[start : start + n]) == list(range(n))
            out.append((list(ids[start : start + n]), list(labels[start : start + n])))
            start += n
    return out


def _expected_labels(tokens: list[int], labels: list[int] | None = None) -> list[int]:
    """The first token of an example is never a target; the others follow the input."""
    given = tokens if labels is None else labels
    return [-100, *given[1:]]


def test_fixture_schema_and_values():
    packed = pack_dataset(Dataset.from_dict({"input_ids": [A, B, C]}), 7, "next-fit", format="trl")
    assert packed.column_names == TRL_COLUMNS
    rows = packed.to_dict()
    assert rows["input_ids"] == [A + B, C]  # next-fit: A and B fill 7 tokens exactly
    assert rows["seq_lengths"] == [[len(A), len(B)], [len(C)]]
    # every pair supervised, and still labels: -100 on each example's first token, so even
    # a collator without padding_free=True never trains A's EOS -> B's BOS
    assert rows["labels"] == [
        _expected_labels(A) + _expected_labels(B),
        _expected_labels(C),
    ]
    assert _examples_of(rows) == [(e, _expected_labels(e)) for e in (A, B, C)]
    info = json.loads(packed.info.description)["exactpack"]
    assert info["format"] == "exactpack.trl-packed"
    assert info["config"]["capacity_unit"] == "tokens"
    assert info["statistics"]["tokens"] == len(A) + len(B) + len(C)


def test_labels_follow_input_labels_and_loss_mask():
    labels = [[-100, -100, 100, 1], [0, 101, -100], [-100, 102, 103, 104, 1]]
    packed = pack_dataset(
        Dataset.from_dict({"input_ids": [A, B, C], "labels": labels}), 16, format="trl"
    )
    found = sorted(_examples_of(packed.to_dict()))
    assert found == sorted(
        (e, _expected_labels(e, lab)) for e, lab in zip([A, B, C], labels, strict=True)
    )
    masks = [[1, 1, 0, 1], [1, 0, 1], [1, 1, 1, 1, 1]]
    packed = pack_dataset(
        Dataset.from_dict({"input_ids": [A, B, C], "loss_mask": masks}), 16, format="trl"
    )
    found = {tuple(e): lab for e, lab in _examples_of(packed.to_dict())}
    # a token-aligned loss_mask supervises the token it flags (its first entry is unused)
    for e, m in zip([A, B, C], masks, strict=True):
        assert found[tuple(e)] == [-100] + [x if m[j] else -100 for j, x in enumerate(e) if j]


@pytest.mark.parametrize(
    "columns",
    [
        {},
        {"labels": [A, B, C]},
        {"labels": [[-100, *A[1:]], B, [-100, *C[1:]]]},
        {"loss_mask": [[0, 1, 1, 1], [1] * 3, [1] * 5]},
        {"labels": [[-100, -100, 100, 1], B, C]},
        {"loss_mask": [[1, 1, 1, 1], [1, 1, 0], [1] * 5]},
    ],
    ids=["bare", "labels=tokens", "first-token-100", "first-flag-0", "labels", "loss_mask"],
)
def test_labels_are_always_a_column_and_trls_collator_passes_them_on(columns):
    """Against TRL's own padding-free collator: the rows always hold labels (-100 on each
    example's first token, and where masked), so TRL's collator passes them on and never
    trains a pair across two examples, whether something is masked or not."""
    packed = pack_dataset(
        Dataset.from_dict({"input_ids": [A, B, C], **columns}), 7, "next-fit", format="trl"
    )
    given = columns.get("labels") or [
        [x if f else -100 for x, f in zip(e, m, strict=True)]
        for e, m in zip(
            [A, B, C], columns.get("loss_mask", [[1] * len(e) for e in (A, B, C)]), strict=True
        )
    ]
    want = [_expected_labels(e, lab) for e, lab in zip([A, B, C], given, strict=True)]
    assert packed.column_names == TRL_COLUMNS
    assert [lab for _, lab in _examples_of(packed.to_dict())] == want
    masked = any(-100 in lab[1:] for lab in want)
    if not masked:  # the collator's labels from the ids alone are the same training
        assert want == [_expected_labels(e) for e in (A, B, C)]


def test_bfd_equals_trl_on_its_own_example():
    """TRL: [[1,2,3],[4,5,6,7],[8]] at 4 -> [[4,5,6,7],[1,2,3,8]], seq_lengths [[4],[3,1]].
    [8] alone has no pair, so exactpack's copy of the case gives it a second token."""
    ds = Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5, 6, 7], [8, 9]]})
    ours = pack_dataset(ds, 5, format="trl").to_dict()
    theirs = trl.pack_dataset(ds, 5, strategy="bfd").to_dict()
    assert {k: ours[k] for k in theirs} == theirs
    assert set(ours) - set(theirs) == {"labels"}  # TRL's columns, and labels
    assert ours["labels"] == [[-100, 5, 6, 7], [-100, 2, 3, -100, 9]]


def test_bfd_plan_equals_trl_and_never_more_rows(rng):
    lengths = rng.integers(2, 40, size=400)
    ids = [rng.integers(3, 1000, n).tolist() for n in lengths]
    ds = Dataset.from_dict({"input_ids": ids})
    ours = pack_dataset(ds, 64, format="trl")
    theirs = trl.pack_dataset(ds, 64, strategy="bfd", map_kwargs={"batch_size": len(ids)})
    assert len(ours) <= len(theirs)
    mine = sorted(sorted(r) for r in ours["seq_lengths"])
    assert mine == sorted(sorted(r) for r in theirs["seq_lengths"])
    assert sorted(map(tuple, (e for e, _ in _examples_of(ours.to_dict())))) == sorted(
        map(tuple, ids)
    )
    default = trl.pack_dataset(ds, 64, strategy="bfd")  # TRL's default: map batches of 1000
    assert len(ours) <= len(default)


@pytest.mark.parametrize(
    "fmt", [("numpy", {"dtype": "float32"}), ("torch", {}), ("numpy", {}), ("arrow", {})]
)
def test_input_format_carried_over(fmt):
    kind, kwargs = fmt
    ds = Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5, 6, 7], [8, 9]]}).with_format(
        kind, **kwargs
    )
    packed = pack_dataset(ds, 5, format="trl")
    assert packed.format["type"] == kind
    assert packed.format["format_kwargs"] == ds.format["format_kwargs"]
    assert packed.format["columns"] == TRL_COLUMNS
    own = pack_dataset(ds, 5)
    assert own.format["type"] == kind


def test_named_format_columns_keep_the_rest_hidden():
    ds = Dataset.from_dict({"input_ids": [A, B, C], "extra": [1, 2, 3]})
    ds = ds.with_format("numpy", columns=["input_ids"])
    packed = pack_dataset(ds, 16, format="trl")
    assert packed.format["columns"] == TRL_COLUMNS  # input_ids kept, the new ones shown


def test_overlong_example_is_an_error_naming_it():
    """TRL's bfd truncates ([1..5] at 4 keeps [1,2,3,4] and drops 5); exactpack never cuts."""
    ds = Dataset.from_dict({"input_ids": [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11], [12, 13]]})
    with pytest.raises(
        OversizedExample, match=r"1 of 4 examples are longer than 4 tokens .*row 0.*5 tok"
    ):
        pack_dataset(ds, 4, format="trl")


def test_every_overlong_example_is_counted_in_the_formats_unit_and_the_first_few_named():
    lengths = [3, 9, 2, 7, 12, 8, 2]  # tokens
    ds = Dataset.from_dict({"input_ids": [list(range(1, n + 1)) for n in lengths]})
    for fmt, room in (("trl", 6), ("exactpack", 7)):  # max_length 6: 6 tokens / 6 pairs a row
        over = [i for i, n in enumerate(lengths) if n > room]
        with pytest.raises(OversizedExample) as err:
            pack_dataset(ds, 6, format=fmt)
        msg = str(err.value)
        assert msg.startswith(f"{len(over)} of 7 examples are longer than {room} tokens"), msg
        for i in over[:3]:  # named, with their length in tokens
            assert f"row {i}: example {i} ('{i}'[0:{lengths[i]}]), {lengths[i]} tokens" in msg
        assert f"and {len(over) - 3} more" in msg if len(over) > 3 else "more" not in msg
        assert f"the longest, 12 tokens, needs {12 - room + 6})" in msg
        assert "cut_long=True" in msg and "truncation_mode=" in msg and "--" not in msg


def test_truncation_keeps_one_end_of_a_long_example_and_counts_what_it_left_out(tmp_path):
    long, short = [1, 2, 3, 4, 5, 6, 7, 8], [9, 10]
    ds = Dataset.from_dict({"input_ids": [long, short]})
    for mode, kept in (("keep_start", long[:5]), ("keep_end", long[-5:])):
        packed = pack_dataset(ds, 5, "next-fit", format="trl", truncation_mode=mode)
        assert packed["input_ids"] == [kept, short]
        assert packed["labels"][0] == [-100, *kept[1:]]
        stats = json.loads(packed.info.description)["exactpack"]["statistics"]
        assert (stats["truncated_sources"], stats["truncated_tokens"]) == (1, 3)
    with pytest.raises(InvalidInput, match="pass one of them"):
        pack_dataset(ds, 5, format="trl", truncation_mode="keep_start", cut_long=True)
    with pytest.raises(InvalidInput, match="truncation_mode must be"):
        pack_dataset(ds, 5, format="trl", truncation_mode="left")
    # the exactpack format keeps max_length pairs (6 tokens); its statistics stay consistent
    from exactpack.pipeline import pack_path

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"input_ids": ids}) + "\n" for ids in (long, short)))
    stats = pack_path(
        data, tmp_path / "out", max_length=5, vocab_size=16, truncation_mode="keep_end"
    )
    assert (stats["truncated_sources"], stats["truncated_tokens"]) == (1, 2)
    assert stats["eligible_targets"] == 5 + 1  # the kept window's pairs and the short one's
    rows = load_packed(tmp_path / "out").shard_rows(0)  # checked on load
    assert rows.tokens[:6].tolist() == long[-6:]


def test_an_sft_row_is_never_cut_into_pieces_that_lose_its_prompt():
    """cut_long would train an SFT row's later pieces without their prompt: refused;
    truncation_mode='keep_start' keeps the prompt and the answer's start."""
    ds = Dataset.from_dict({"prompt": ["a long question " * 2], "completion": [" an answer"]})
    with pytest.raises(InvalidInput, match="later pieces without their prompt"):
        pack_dataset(ds, 16, format="trl", tokenizer="bytes", cut_long=True)
    kept = pack_dataset(ds, 16, format="trl", tokenizer="bytes", truncation_mode="keep_start")
    assert kept["seq_lengths"] == [[16]]
    stream = ds.to_iterable_dataset()  # packed as read: the same refusal, and no truncation
    with pytest.raises(InvalidInput, match="later pieces without their prompt"):
        list(pack_dataset(stream, 16, tokenizer="bytes", cut_long=True))
    with pytest.raises(InvalidInput, match="a stream is packed as it is read"):
        list(pack_dataset(stream, 16, tokenizer="bytes", truncation_mode="keep_start"))


def test_split_long_keeps_every_pair_with_right_labels():
    """TRL's bfd_split cuts [1..5] at 4 into [1,2,3,4] + [5] and loses the pair 4->5;
    split_long cuts into windows of <= 4 tokens overlapping by one, the first label of
    each -100, so every pair is learned exactly once."""
    docs = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]
    packed = pack_dataset(Dataset.from_dict({"input_ids": docs}), 4, format="trl", cut_long=True)
    rows = packed.to_dict()
    assert max(map(len, rows["input_ids"])) <= 4
    pieces = _examples_of(rows)
    pairs = sorted(
        (tokens[j - 1], tokens[j])
        for tokens, labels in pieces
        for j in range(1, len(tokens))
        if labels[j] != -100
    )
    assert pairs == sorted((d[j], d[j + 1]) for d in docs for j in range(len(d) - 1))
    assert all(labels[0] == -100 for _, labels in pieces)
    theirs = trl.pack_dataset(Dataset.from_dict({"input_ids": docs}), 4, strategy="bfd_split")
    kept = sum(
        len(r) - len(s) for r, s in zip(theirs["input_ids"], theirs["seq_lengths"], strict=True)
    )
    assert kept < len(pairs)  # TRL's split loses a pair at each cut


@pytest.mark.parametrize("short", [[], [5]])
def test_example_without_a_pair_is_an_error(short):
    """TRL drops empty sequences; exactpack never drops an example: it names the row."""
    ds = Dataset.from_dict({"input_ids": [[1, 2], short, [3, 4, 5]]})
    with pytest.raises(InvalidInput, match="row 1"):
        pack_dataset(ds, 4, format="trl")


def test_vocab_size_and_pad_from_the_tokenizer():
    tok = tokenizer()
    ds = Dataset.from_dict({"input_ids": [[3, 4, 5], [6, 7]]})
    packed = pack_dataset(ds, 8, format="trl", tokenizer=tok)
    info = json.loads(packed.info.description)["exactpack"]
    assert info["binding"]["vocab_size"] == len(tok) != 8  # not the largest id + 1
    assert info["config"]["pad_token_id"] == tok.pad_token_id
    with pytest.raises(InvalidInput, match="not the tokenizer's pad token"):
        pack_dataset(ds, 8, format="trl", tokenizer=tok, pad_token_id=5)


def test_pad_id_outside_the_vocabulary_is_refused(tmp_path):
    ds = Dataset.from_dict({"input_ids": [[3, 4, 5], [6, 7]]})
    with pytest.raises(InvalidInput, match="pad_token_id 10 is outside the vocabulary"):
        pack_dataset(ds, 8, vocab_size=10, pad_token_id=10)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"input_ids": r}) + "\n" for r in ds["input_ids"]))
    out = tmp_path / "out"
    run = _exactpack("pack", src, "--out", out, "--max-length", 8, "--vocab-size", 10,
                   "--pad-token-id", 12, "--format", "trl")  # fmt: skip
    assert run.returncode == 2 and "pad_token_id 12 is outside" in run.stderr
    assert not out.exists()


def test_trl_rows_are_refused_by_exactpack_loaders():
    packed = pack_dataset(Dataset.from_dict({"input_ids": [A, B, C]}), 8, format="trl")
    with pytest.raises(InvalidInput, match="TRL-format rows"):
        packed_metadata(packed)
    with pytest.raises(InvalidInput, match="TRL-format rows"):
        next(to_batches(packed))


def _exactpack(*args) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "exactpack", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_cli_writes_parquet_that_load_dataset_reads(tmp_path):
    docs = [A, B, C, [0, 5, 6, 7, 8, 9, 1], [0, 7, 1]]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"input_ids": d}) + "\n" for d in docs))
    out = tmp_path / "packed"
    run = _exactpack("pack", src, "--out", out, "--max-length", 8, "--vocab-size", 266,
                   "--format", "trl", "--max-rows-per-batch", 1, "--shard-tokens", 8)  # fmt: skip
    assert run.returncode == 0, run.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "exactpack.trl-packed" and len(manifest["shards"]) > 1
    files = sorted(str(p) for p in out.glob("shard-*.parquet"))
    loaded = datasets.load_dataset(
        "parquet", data_files=files, split="train", cache_dir=str(tmp_path / "cache")
    )
    assert loaded.column_names == TRL_COLUMNS
    in_memory = pack_dataset(Dataset.from_dict({"input_ids": docs}), 8, format="trl")
    assert loaded.to_dict() == in_memory.to_dict()  # the same plan and rows either way
    checked = load_trl(out, integrity="full", cache_dir=str(tmp_path / "cache"))
    assert checked.to_dict() == loaded.to_dict()
    assert verify_folder(out)["format"] == "exactpack.trl-packed"
    with pytest.raises(InvalidInput, match="TRL-format rows"):
        load_packed(out)


def test_load_trl_finds_a_damaged_shard_and_refuses_exactpack_format(tmp_path):
    docs = [A, B, C]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"input_ids": d}) + "\n" for d in docs))
    for fmt in ("trl", "exactpack"):
        run = _exactpack("pack", src, "--out", tmp_path / fmt, "--max-length", 8,
                       "--vocab-size", 266, "--format", fmt)  # fmt: skip
        assert run.returncode == 0, run.stderr
    with pytest.raises(InvalidInput, match="not a TRL-format output"):
        load_trl(tmp_path / "exactpack")
    shard = next((tmp_path / "trl").glob("shard-*.parquet"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(InvalidInput, match="checksum mismatch"):
        load_trl(tmp_path / "trl")


def test_full_check_catches_rows_that_disagree_with_the_manifest(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"input_ids": d}) + "\n" for d in [A, B, C]))
    out = tmp_path / "trl"
    assert _exactpack("pack", src, "--out", out, "--max-length", 8, "--vocab-size", 266,
                    "--format", "trl").returncode == 0  # fmt: skip
    import pyarrow.parquet as pq

    from exactpack.io.shards import sha256_file

    shard = next(out.glob("shard-*.parquet"))
    table = pq.read_table(shard)
    lens = table.column("seq_lengths").combine_chunks()
    bad = pa.ListArray.from_arrays(lens.offsets, pa.array(lens.flatten().to_numpy()[::-1].copy()))
    k = table.schema.get_field_index("seq_lengths")
    pq.write_table(table.set_column(k, "seq_lengths", bad), shard)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"][0].update(bytes=shard.stat().st_size, sha256=sha256_file(shard))
    (out / "manifest.json").write_text(json.dumps(manifest))
    # sizes and sha256 agree now; the default load still holds the rows to the format
    for verify in (True, "full"):
        with pytest.raises(InvalidInput, match="disagree"):
            load_trl(out, integrity=verify, cache_dir=str(tmp_path / "cache"))


def test_ray_engine_refuses_trl_format(tmp_path):
    pytest.importorskip("ray")
    from exactpack import ray as ray_engine

    with pytest.raises(InvalidInput, match="local engine only"):
        ray_engine.pack(tmp_path / "x.jsonl", tmp_path / "out", max_length=8, format="trl")


def test_per_example_needs_packed_rows():
    from exactpack.hf import per_example

    with pytest.raises(InvalidInput, match="no seq_lengths"):
        per_example(lambda f: f)([{"input_ids": [1, 2]}])
    with pytest.raises(InvalidInput, match="add up to 2 tokens"):
        per_example(lambda f: f)([{"input_ids": [1, 2, 3], "seq_lengths": [2]}])


def test_w1_like_rows_never_more_than_trl_bfd():
    """W1's length distribution (lognormal around 350 tokens, 8..4096), 3,000 examples at
    capacity 4096, against TRL's bfd with its default map batches."""
    rng = np.random.default_rng(20240601)
    lengths = np.clip(np.rint(rng.lognormal(np.log(350) - 0.5, 1.0, 3_000)), 8, 4096)
    lengths = lengths.astype(np.int64)
    offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = pa.array(rng.integers(3, 32000, int(offsets[-1])).astype(np.int64))
    ds = Dataset(datasets.table.InMemoryTable(pa.table({"input_ids": pa.ListArray.from_arrays(
        pa.array(offsets), values)})))  # fmt: skip
    ours = pack_dataset(ds, 4096, format="trl")
    theirs = trl.pack_dataset(ds, 4096, strategy="bfd")
    lower = -(-int(lengths.sum()) // 4096)
    assert lower <= len(ours) <= len(theirs)
    assert sum(map(sum, ours["seq_lengths"])) == int(lengths.sum())


def test_stats_counts_tokens_with_format_trl(tmp_path):
    from exactpack.pipeline.stats import stats_path

    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"input_ids": d}) + "\n" for d in [A, B, C]))
    report = stats_path(src, max_length=8, format="trl", policies=["best-fit-decreasing"])
    assert report["tokens"] == len(A) + len(B) + len(C)
    packed = pack_dataset(Dataset.from_dict({"input_ids": [A, B, C]}), 8, format="trl")
    assert report["policies"][0]["rows"] == len(packed)
    # an example over the capacity is counted and reported (in tokens), not a stop
    over = stats_path(src, max_length=4, format="trl")["oversized"]
    assert (over["examples"], over["first_length"], over["unit"]) == (1, 5, "tokens")
    assert over["capacity_100"] == 5


@pytest.mark.parametrize("masked", [True, False])
def test_both_collators_read_the_rows_as_their_examples(masked):
    """TRL's padding-free collator (seq_lengths) and DataCollatorWithFlattening behind
    per_example build the same batch from format="trl" rows: positions restart per
    example, labels are the rows' own or (no mask) their ids with -100 on each example's
    first token, cu_seq_lens are the examples' bounds, seq_idx int32."""
    import torch
    from transformers import DataCollatorWithFlattening
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from exactpack.hf import per_example

    docs = [A, B, C, [0, 5, 6, 7, 8, 9, 1], [0, 7, 1]]
    labels = [[-100, -100, 100, 1], B, [-100, 102, 103, 104, 1], [0, 5, 6, 7, 8, 9, 1], [0, 7, 1]]
    columns = {"input_ids": docs} | ({"labels": labels} if masked else {})
    packed = pack_dataset(Dataset.from_dict(columns), 8, format="trl")
    assert packed.column_names == TRL_COLUMNS  # labels either way
    rows = [packed[i] for i in range(len(packed))]
    flat = {
        "input_ids": [x for r in rows for x in r["input_ids"]],
        "labels": [
            x
            for r in rows
            for a, b in itertools.pairwise(np.cumsum([0, *r["seq_lengths"]]).tolist())
            for x in [-100, *r["labels"][a + 1 : b]]
        ],
        "position_ids": [j for r in rows for n in r["seq_lengths"] for j in range(n)],
    }
    bounds = np.cumsum([0] + [n for r in rows for n in r["seq_lengths"]]).tolist()
    theirs = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(rows)
    flattening = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
    ours = per_example(flattening)(rows)
    for batch in (theirs, ours):
        for c, values in flat.items():
            assert batch[c].tolist() == [values], c
        assert batch["cu_seq_lens_q"].tolist() == bounds
        assert batch["seq_idx"].dtype == torch.int32
        assert (
            batch["seq_idx"][0].tolist()
            == np.repeat(np.arange(len(bounds) - 1), np.diff(bounds)).tolist()
        )
    padded = DataCollatorForLanguageModeling(
        pad_token_id=0, padding_free=True, pad_to_multiple_of=16
    )(rows)
    extra = padded["input_ids"].shape[1] - len(flat["input_ids"])
    assert padded["labels"].tolist() == [flat["labels"] + [-100] * extra]  # padding trains nothing


def test_a_tokenizers_object_binds_its_full_vocabulary():
    """A ``tokenizers.Tokenizer`` in memory counts its added tokens (an added pad token
    has the highest id) and its padding setting is its pad id."""
    from tokenizers import Tokenizer, models

    backend = Tokenizer(models.WordLevel({f"t{i}": i for i in range(10)}, unk_token="t0"))
    backend.add_special_tokens(["<pad>"])
    backend.enable_padding(pad_id=10, pad_token="<pad>")
    ds = Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 10]]})
    packed = pack_dataset(ds, 8, format="trl", tokenizer=backend)
    info = json.loads(packed.info.description)["exactpack"]
    assert info["binding"]["vocab_size"] == 11
    assert info["binding"]["tokenizer_id"].startswith("tokenizers:@sha256:")
    assert info["config"]["pad_token_id"] == 10


def _version_1_rows(rows: list[dict], masked: bool) -> list[dict]:
    """``rows`` (version 2) as version 1 stored them: labels for every row (the token,
    -100 on each example's first) and position_ids 0..n-1 per example."""
    old = []
    for row in rows:
        cuts = itertools.pairwise(np.cumsum([0, *row["seq_lengths"]]).tolist())
        given = row["labels"] if masked else row["input_ids"]
        labels = [x for a, b in cuts for x in [-100, *given[a + 1 : b]]]
        positions = [j for n in row["seq_lengths"] for j in range(n)]
        old.append(row | {"labels": labels, "position_ids": positions})
    return old


@pytest.mark.parametrize("masked", [True, False])
def test_version_2_rows_collate_as_version_1_rows_did(masked):
    """TRL's collator builds the same tensors from the rows (labels, no positions) as from
    version 1's stored labels and positions: padding-free, identical; padded with
    positions (sequence parallelism, no padding_free), identical too — every example's
    first token -100, so no pair from one example's last token to the next one's first
    is trained in either mode."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    docs = [A, B, C, [0, 5, 6, 7, 8, 9, 1], [0, 7, 1]]
    labels = [[-100, -100, 100, 1], B, [-100, 102, 103, 104, 1], [0, 5, 6, 7, 8, 9, 1], [0, 7, 1]]
    columns = {"input_ids": docs} | ({"labels": labels} if masked else {})
    new = pack_dataset(Dataset.from_dict(columns), 8, format="trl").to_list()
    free = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    padded = DataCollatorForLanguageModeling(pad_token_id=0, return_position_ids=True)
    for batch in ([new[0]], new, new[1:]):
        ours, before = free(batch), free(_version_1_rows(batch, masked))
        assert ours.keys() == before.keys()
        for key, value in ours.items():
            assert (value == before[key]).all() if hasattr(value, "all") else value == before[key]
        ours, before = padded(batch), padded(_version_1_rows(batch, masked))
        for key in ("input_ids", "attention_mask", "position_ids"):
            assert ours[key].tolist() == before[key].tolist(), key
        assert ours["labels"].tolist() == before["labels"].tolist()
        starts = ours["position_ids"] == 0
        assert (ours["labels"][starts] == -100).all()  # never an EOS -> BOS pair


@pytest.mark.parametrize("how", ["stored-positions", "one-shard-unlabeled"])
def test_a_version_2_shard_of_another_schema_is_refused(tmp_path, how):
    """Version 2 shards are TRL's columns with labels, in every shard: version 1's stored
    positions under a version 2 manifest, or one shard without labels, are refused by
    name."""
    import pyarrow.parquet as pq

    from exactpack.io.shards import sha256_file
    from exactpack.pipeline.local import pack_path

    src = tmp_path / "in.jsonl"
    docs = [A, B, C, [0, 5, 6, 7, 8, 9, 1], [0, 7, 1]]
    src.write_text("".join(json.dumps({"input_ids": d}) + "\n" for d in docs))
    out = tmp_path / "out"
    pack_path(src, out, max_length=8, vocab_size=266, format="trl", max_rows_per_batch=1,
              shard_tokens=8)  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["shards"]) > 1
    entry = manifest["shards"][-1]
    shard = out / entry["file"]
    rows = _version_1_rows(pq.read_table(shard).to_pylist(), masked=False)
    if how == "one-shard-unlabeled":
        rows = [{k: r[k] for k in ("input_ids", "seq_lengths")} for r in rows]
    table = pa.Table.from_pylist(rows)
    table = table.cast(pa.schema([(n, pa.list_(pa.int64() if n == "labels" else pa.int32()))
                                  for n in table.column_names]))  # fmt: skip
    pq.write_table(table, shard)
    entry.update(bytes=shard.stat().st_size, sha256=sha256_file(shard))
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InvalidInput, match=re.escape(f"{entry['file']}: schema")):
        load_trl(out, cache_dir=str(tmp_path / "cache"))
