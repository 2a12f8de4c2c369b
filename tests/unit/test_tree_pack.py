"""``exactpack pack --tree``: files -> forest-row packed directories -> load -> tree batches.

The written rows are held to the in-memory route (``pack_dataset(tree=True)``
and the core layout), every sequence is recovered from the loaded rows
exactly (tokens, supervision, multiplicities), flat outputs still load, and
``--format trl`` is refused.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from exactpack.cli import main
from exactpack.core.errors import InvalidInput
from exactpack.io.store import PackedStore, load_packed
from exactpack.pipeline import pack_path

datasets = pytest.importorskip("datasets")
from exactpack.hf import pack_dataset  # noqa: E402
from exactpack.io.store import tree_batch_from_rows  # noqa: E402

VOCAB = 40
ARRAYS = (
    "inputs",
    "targets",
    "positions",
    "segments",
    "node_ends",
    "weights",
    "input_valid",
    "seq_index",
    "seq_nodes",
    "seq_loss_mask",
    "node_parent",
)


def _grpo(rng: np.random.Generator, groups: int) -> dict[str, list]:
    prompts, comps = [], []
    for _ in range(groups):
        prompts.append(rng.integers(0, VOCAB, rng.integers(1, 6)).tolist())
        members, prev = [], []
        for _ in range(rng.integers(1, 5)):
            keep = prev[: rng.integers(0, 3)]  # share 0-2 first tokens with the previous one
            c = keep + rng.integers(0, VOCAB, rng.integers(1, 6)).tolist()
            members.append(c)
            prev = c
        comps.append(members)
    return {"prompt_ids": prompts, "completion_ids": comps}


def _dpo(rng: np.random.Generator, groups: int) -> dict[str, list]:
    g = _grpo(rng, groups)
    pairs = [(c + c)[:2] for c in g["completion_ids"]]
    return {
        "prompt_input_ids": g["prompt_ids"],
        "chosen_input_ids": [p[0] for p in pairs],
        "rejected_input_ids": [p[1] for p in pairs],
    }


def _dpo_trl(rng: np.random.Generator, groups: int) -> dict[str, list]:
    """TRL 1.16's DPO columns (prompt_ids / chosen_ids / rejected_ids)."""
    return {k.replace("_input", ""): v for k, v in _dpo(rng, groups).items()}


def _generic(rng: np.random.Generator, groups: int) -> dict[str, list]:
    g = _grpo(rng, groups)
    rows = [(p + c, k) for k, (p, cs) in enumerate(zip(*g.values(), strict=True)) for c in cs]
    order = rng.permutation(len(rows))  # a group's rows need not be adjacent
    return {"input_ids": [rows[i][0] for i in order], "group": [rows[i][1] for i in order]}


def _write(columns: dict[str, list], path) -> None:
    if path.suffix == ".parquet":
        pq.write_table(pa.table(columns), path)
    else:
        rows = [
            dict(zip(columns, vals, strict=True)) for vals in zip(*columns.values(), strict=True)
        ]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _sequences(columns: dict[str, list]) -> list[tuple[list[int], list[bool]]]:
    """Every input sequence, row by row, with its per-pair supervision."""
    if "prompt_ids" in columns:
        items = [
            (p, cs) for p, cs in zip(columns["prompt_ids"], columns["completion_ids"], strict=True)
        ]
    elif "prompt_input_ids" in columns:
        items = [
            (p, [c, r])
            for p, c, r in zip(
                columns["prompt_input_ids"],
                columns["chosen_input_ids"],
                columns["rejected_input_ids"],
                strict=True,
            )
        ]
    else:
        return [(s, [True] * (len(s) - 1)) for s in columns["input_ids"]]
    return [
        (p + c, [i >= len(p) - 1 for i in range(len(p) + len(c) - 1)])
        for p, cs in items
        for c in cs
    ]


def _recovered(records: list[dict]) -> dict[int, tuple[list[int], list[bool]]]:
    """Each sequence read back from the rows alone: its tokens and supervision; and the
    rows' weights must be the count of sequences supervising each cell."""
    out = {}
    for rec in records:
        count = np.zeros(len(rec["input_ids"]), dtype=np.int64)
        for s, cells, mask in zip(
            rec["sequence_index"], rec["sequence_cells"], rec["sequence_mask"], strict=True
        ):
            tokens = [rec["input_ids"][c] for c in cells] + [rec["target_ids"][cells[-1]]]
            assert [rec["position_ids"][c] for c in cells] == list(range(len(cells)))
            assert s not in out
            out[s] = (tokens, list(mask))
            np.add.at(count, np.asarray(cells)[np.asarray(mask, bool)], 1)
        assert count.tolist() == rec["weights"]
    return out


@pytest.mark.parametrize("make", [_grpo, _dpo, _dpo_trl, _generic])
@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_pack_load_collate_equals_the_in_memory_tree_rows(tmp_path, make, suffix):
    columns = make(np.random.default_rng(7), 12)
    src = tmp_path / f"in{suffix}"
    _write(columns, src)
    stats = pack_path(src, tmp_path / "out", max_length=24, vocab_size=VOCAB, tree="on")
    store = load_packed(tmp_path / "out", integrity="full")
    assert isinstance(store, PackedStore) and store.layout == "tree"
    assert store.manifest["version"] == 2 and store.manifest["layout"] == "tree"
    records = store.records()
    ref = list(pack_dataset(datasets.Dataset.from_dict(columns), 24, tree=True))
    assert records == ref
    got = tree_batch_from_rows(records, store.capacity, store.binding.vocab_size)
    want = tree_batch_from_rows(ref, 24, VOCAB)
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    assert (got.tokens_stored, got.tokens_flat) == (stats["tokens_stored"], stats["tokens_flat"])


@pytest.mark.parametrize("seed", range(4))
def test_every_sequence_round_trips_through_the_files(tmp_path, seed):
    rng = np.random.default_rng(seed)
    make = (_grpo, _dpo, _generic)[seed % 3]
    columns = make(rng, int(rng.integers(1, 30)))
    _write(columns, tmp_path / "in.parquet")
    capacity = int(rng.integers(12, 40))
    opts = {"max_length": capacity, "vocab_size": VOCAB, "max_rows_per_batch": 3}
    pack_path(tmp_path / "in.parquet", tmp_path / "out", **opts, tree="on")
    records = load_packed(tmp_path / "out").records()
    want = _sequences(columns)
    got = _recovered(records)
    if "group" in columns:  # every target supervised; compare as multisets (order differs)
        assert sorted(got.values()) == sorted(want)
    else:
        assert got == dict(enumerate(want))


def test_flat_outputs_still_load_and_other_versions_are_refused(tmp_path):
    src = tmp_path / "flat.jsonl"
    src.write_text('{"input_ids": [1, 2, 3]}\n{"input_ids": [4, 5]}\n')
    pack_path(src, tmp_path / "flat", max_length=4, vocab_size=8)
    flat = load_packed(tmp_path / "flat")
    assert isinstance(flat, PackedStore) and flat.manifest["version"] == 2
    assert len(flat) == 1 and flat[0].inputs.shape == (1, 4)  # one model call of one row
    _write(_grpo(np.random.default_rng(0), 2), tmp_path / "t.jsonl")
    pack_path(tmp_path / "t.jsonl", tmp_path / "tree", max_length=16, vocab_size=VOCAB, tree="on")
    mpath = tmp_path / "tree" / "manifest.json"
    manifest = json.loads(mpath.read_text())
    mpath.write_text(json.dumps(manifest | {"version": 4}))
    with pytest.raises(InvalidInput, match=r"reads 'exactpack\.packed-rows' version 2"):
        load_packed(tmp_path / "tree")


def test_format_trl_with_tree_is_refused_with_the_reason(tmp_path, capsys):
    _write(_grpo(np.random.default_rng(0), 2), tmp_path / "t.jsonl")
    with pytest.raises(InvalidInput, match="cannot express a tree"):
        pack_path(
            tmp_path / "t.jsonl",
            tmp_path / "o",
            max_length=16,
            vocab_size=VOCAB,
            format="trl",
            tree="on",
        )
    argv = [
        "pack",
        str(tmp_path / "t.jsonl"),
        "--tree",
        "--max-length",
        "16",
        "--vocab-size",
        str(VOCAB),
        "--format",
        "trl",
        "--out",
        str(tmp_path / "o"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no node / parent / weight columns" in err[0]
    assert not (tmp_path / "o").exists()


def test_cli_pack_tree_writes_what_the_library_writes(tmp_path, capsys):
    _write(_dpo(np.random.default_rng(3), 5), tmp_path / "d.jsonl")
    argv = [
        "pack",
        str(tmp_path / "d.jsonl"),
        "--tree",
        "--max-length",
        "20",
        "--vocab-size",
        str(VOCAB),
        "--out",
        str(tmp_path / "cli"),
        "--json",
    ]
    assert main(argv) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    pack_path(tmp_path / "d.jsonl", tmp_path / "lib", max_length=20, vocab_size=VOCAB, tree="on")
    assert load_packed(tmp_path / "cli").records() == load_packed(tmp_path / "lib").records()
    assert stats["tokens_stored"] < stats["tokens_flat"]


def test_auto_groups_rows_sharing_their_first_tokens_within_a_window(tmp_path):
    rng = np.random.default_rng(5)
    heads = [rng.integers(0, VOCAB, 6).tolist() for _ in range(3)]
    rows = [
        heads[int(rng.integers(0, 3))] + rng.integers(0, VOCAB, int(rng.integers(1, 5))).tolist()
        for _ in range(20)
    ]
    _write({"input_ids": rows}, tmp_path / "sft.jsonl")
    out = {}
    for window in (20, 4):
        stats = pack_path(
            tmp_path / "sft.jsonl",
            tmp_path / f"w{window}",
            tree="auto",
            tree_prefix=6,
            tree_block=window,
            max_length=64,
            vocab_size=VOCAB,
        )
        records = load_packed(tmp_path / f"w{window}").records()
        got = _recovered(records)
        assert got == {i: (r, [True] * (len(r) - 1)) for i, r in enumerate(rows)}
        for rec in records:  # sequences sharing a cell share their first 6 tokens and window
            first = {}
            for s, cells in zip(rec["sequence_index"], rec["sequence_cells"], strict=True):
                first.setdefault(cells[0], []).append(s)
            for members in first.values():
                assert len({(tuple(rows[s][:6]), s // window) for s in members}) == 1
        out[window] = stats
    # one window: a group per distinct head; windows of 4 rows: at most a group per head each
    assert out[20]["groups"] == len({tuple(h) for h in heads if any(r[:6] == h for r in rows)})
    assert out[20]["groups"] <= out[4]["groups"] <= 5 * 3
    assert out[20]["tokens_stored"] <= out[4]["tokens_stored"] < out[4]["tokens_flat"]


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory):
    pytest.importorskip("transformers")
    from support.sft_helpers import chat_tokenizer

    return chat_tokenizer(tmp_path_factory.mktemp("tok"))


def _sft_reading(rows: dict[str, list], folder) -> list[tuple[list[int], list[bool]]]:
    """The SFT prompt-completion reading of ``rows`` (io/sft.py): tokens and pair flags."""
    from exactpack.io.readers import read_documents
    from exactpack.io.tokenizers import as_tokenizer

    tok = as_tokenizer(str(folder))
    docs = read_documents(datasets.Dataset.from_dict(rows), tokenizer=tok)
    out = []
    for i in range(len(docs)):
        a, b = int(docs.offsets[i]), int(docs.offsets[i + 1])
        out.append((docs.tokens[a:b].tolist(), docs.loss_mask[a - i : b - i - 1].tolist()))
    return out


def _packed_as_trl(rows: dict[str, list], out, folder) -> tuple[dict, dict]:
    """``rows`` tree-packed from a file (``out``) and by ``pack_dataset``, both checked
    against DPOTrainer's own tokenization of them; the pack's stats and TRL's reading."""
    from support.sft_helpers import trl_dpo_prepared

    _write(rows, out.with_suffix(".jsonl"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a merged prompt, warned as TRL warns
        stats = pack_path(
            out.with_suffix(".jsonl"), out, max_length=256, tokenizer=str(folder), tree="on"
        )
        rows_ds = pack_dataset(
            datasets.Dataset.from_dict(rows), 256, tree=True, tokenizer=str(folder)
        )
    want = dict(enumerate(trl_dpo_prepared(rows, folder, out.parent)))
    assert _recovered(load_packed(out).records()) == want
    assert _recovered(list(rows_ds)) == want
    return stats, want


def test_text_and_chat_dpo_rows_tokenize_as_trl_dpo_trainer_does(tmp_path, chat_folder):
    """TRL 1.16's rule: prompt + answer tokenized whole, both answers cut at the shorter common
    prefix with the prompt — "What col" merges into the chosen answer's "color", so the
    rejected answer is supervised from "col"'s last piece too (SFT's per-answer cut would
    not); files and pack_dataset(tree=True) read the same."""
    from support.sft_helpers import CHATS

    text = {
        "prompt": ["What color is the sky?", "Hello there,", "What col"],
        "chosen": [" It is blue.", " how are you?</s>", "or is the sky?"],
        "rejected": [" It is green.", " go away.", " It is green."],
    }
    chats = {
        "prompt": [c[:-1] for c in CHATS[:2]],
        "chosen": [c[-1:] for c in CHATS[:2]],
        "rejected": [[{"role": "assistant", "content": "No idea."}] for _ in CHATS[:2]],
    }
    for k, rows in enumerate((text, chats)):
        stats, want = _packed_as_trl(rows, tmp_path / f"dpo{k}", chat_folder)
        assert stats["tokens_stored"] < stats["tokens_flat"]  # the prompt is stored once
        if k == 0:  # SFT's reading of the merged row: the same tokens, one target fewer
            (tokens, mask), *_ = _sft_reading(
                {"prompt": ["What col"], "completion": [" It is green."]}, chat_folder
            )
            assert tokens == want[5][0] and sum(mask) == sum(want[5][1]) - 1
    with pytest.raises(InvalidInput, match="no tokenizer was given"):
        pack_path(
            tmp_path / "dpo0.jsonl", tmp_path / "x", max_length=64, vocab_size=VOCAB, tree="on"
        )


@pytest.mark.timeout(120)
def test_rows_with_an_implicit_prompt_tokenize_as_trl_dpo_trainer_does(tmp_path, chat_folder):
    """No prompt column: TRL 1.16's extract_prompt (the answers' common leading characters
    or messages, a space before the difference left to the answers), then the DPO rule —
    what DPOTrainer itself trains on the same rows."""
    from support.sft_helpers import CHATS

    text = {"chosen": ["Sky? It is blue.", "Hi! go"], "rejected": ["Sky? It is green.", "Hi! gone"]}
    chats = {
        "chosen": CHATS[:2],
        "rejected": [[*c[:-1], {"role": "assistant", "content": "No idea."}] for c in CHATS[:2]],
    }
    for k, rows in enumerate((text, chats)):
        _packed_as_trl(rows, tmp_path / f"implicit{k}", chat_folder)


def test_auto_reads_sft_text_through_the_tokenizer_and_plain_rows_need_auto(tmp_path):
    rows = {"prompt": ["2+2=", "2+2=", "3+3="], "completion": ["4", "four", "6"]}
    _write(rows, tmp_path / "sft.jsonl")
    pack_path(
        tmp_path / "sft.jsonl",
        tmp_path / "o",
        tree="auto",
        tree_prefix=4,
        max_length=64,
        tokenizer="bytes",
    )
    records = load_packed(tmp_path / "o").records()
    assert "completion" not in records[0]  # --tree auto carries no column
    want = dict(enumerate(_sft_reading(rows, "bytes")))
    assert _recovered(records) == want
    with pytest.raises(InvalidInput, match="pass --tree auto"):
        pack_path(
            tmp_path / "sft.jsonl", tmp_path / "p", max_length=64, tokenizer="bytes", tree="on"
        )


def test_flat_readers_refuse_a_tree_output_naming_the_tree_reader(tmp_path):
    from exactpack.training.packed_data import PackedBatches

    _write(_grpo(np.random.default_rng(1), 3), tmp_path / "t.jsonl")
    pack_path(tmp_path / "t.jsonl", tmp_path / "tree", max_length=16, vocab_size=VOCAB, tree="on")
    with pytest.raises(
        InvalidInput, match=r"records\(\) and exactpack.hf.hf_collator\(\.\.\., tree=True\)"
    ):
        PackedBatches(tmp_path / "tree")


def test_a_damaged_tree_shard_is_refused_by_its_checksum(tmp_path):
    _write(_grpo(np.random.default_rng(2), 3), tmp_path / "t.jsonl")
    pack_path(tmp_path / "t.jsonl", tmp_path / "tree", max_length=16, vocab_size=VOCAB, tree="on")
    manifest = load_packed(tmp_path / "tree", integrity="full").manifest
    shard = tmp_path / "tree" / manifest["shards"][0]["file"]
    shard.write_bytes(shard.read_bytes()[:-9] + b"damaged!!")
    with pytest.raises(InvalidInput, match="checksum mismatch"):
        load_packed(tmp_path / "tree")


def test_auto_flags_without_auto_are_refused(tmp_path, capsys):
    _write({"input_ids": [[1, 2, 3]]}, tmp_path / "s.jsonl")
    for extra in (["--tree"], []):
        argv = [
            "pack",
            str(tmp_path / "s.jsonl"),
            *extra,
            "--tree-prefix",
            "4",
            "--max-length",
            "8",
            "--vocab-size",
            "8",
            "--out",
            str(tmp_path / "o"),
        ]
        assert main(argv) == 2 and "for --tree auto" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_tree_inputs_take_the_flat_doors(tmp_path, monkeypatch, capsys):
    """Several files, a glob, gzip and standard input: the rows of one file, read as one."""
    import gzip
    import io
    import sys

    columns = _grpo(np.random.default_rng(11), 10)
    _write(columns, tmp_path / "whole.jsonl")
    half = {k: v[:5] for k, v in columns.items()}, {k: v[5:] for k, v in columns.items()}
    _write(half[0], tmp_path / "part-0.jsonl")
    _write(half[1], tmp_path / "part-1.jsonl")
    (tmp_path / "part-1.jsonl.gz").write_bytes(
        gzip.compress((tmp_path / "part-1.jsonl").read_bytes())
    )
    opts = {"max_length": 24, "vocab_size": VOCAB}
    pack_path(tmp_path / "whole.jsonl", tmp_path / "one", **opts, tree="on")
    want = load_packed(tmp_path / "one").records()
    sources = {
        "several": [str(tmp_path / "part-0.jsonl"), str(tmp_path / "part-1.jsonl.gz")],
        "glob": str(tmp_path / "part-?.jsonl"),
    }
    for name, source in sources.items():
        pack_path(source, tmp_path / name, **opts, tree="on")
        assert load_packed(tmp_path / name).records() == want, name
    stdin = io.TextIOWrapper(io.BytesIO((tmp_path / "whole.jsonl").read_bytes()))
    monkeypatch.setattr(sys, "stdin", stdin)
    argv = ["pack", "-", "--tree", "--max-length", "24", "--vocab-size", str(VOCAB)]
    assert main([*argv, "--out", str(tmp_path / "piped")]) == 0
    assert load_packed(tmp_path / "piped").records() == want
    capsys.readouterr()
    stats_argv = ["stats", *sources["several"], "--tree", "--max-length", "24", "--json"]
    assert main(stats_argv) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stats["sequences"] == sum(len(c) for c in columns["completion_ids"])


def test_records_of_many_rows_collate_to_the_packed_batch():
    """Node ids stay contiguous past the second row (they once doubled from row 3 on)."""
    import dataclasses

    from exactpack.core.binding import Binding
    from exactpack.core.tree import SequenceGroups, pack_tree
    from exactpack.io.shards import row_records

    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, VOCAB, 8) for _ in range(12)]
    comps = [[rng.integers(0, VOCAB, int(rng.integers(2, 6))) for _ in range(3)] for _ in prompts]
    groups = SequenceGroups.from_prompt_completions(prompts, comps, Binding(VOCAB, "t", "s"))
    (want,) = pack_tree(groups, 24).batches
    assert want.shape[0] >= 3
    got = tree_batch_from_rows(row_records(want), 24, VOCAB)
    for field in dataclasses.fields(want):
        if field.name not in ("occurrences", "partition", "binding", "first_row"):
            np.testing.assert_array_equal(
                getattr(got, field.name), getattr(want, field.name), err_msg=field.name
            )
    np.testing.assert_array_equal(got.sequences()[0], want.sequences()[0])


# Tree content checked on load as flat content is: a shard damaged field by field, with its
# manifest checksum recomputed, is refused naming the row and what disagrees.

#: One row of 11 cells and 8 nodes (two tries; branches at 7 and at 8, a leaf node 3).
DAMAGE_ROWS = [
    {"prompt_ids": [5, 6, 7], "completion_ids": [[8, 9, 10], [8, 4], [3]]},
    {"prompt_ids": [1, 2], "completion_ids": [[3, 3], [4]]},
]


def _set(name, index, value):
    def edit(rec):
        rec[name][index] = value

    return edit


def _node(name, cells, value):  # the same value on every cell of one node
    def edit(rec):
        for c in cells:
            rec[name][c] = value

    return edit


DAMAGES = [
    ("input id", _set("input_ids", 4, VOCAB), r"token id 40 is outside \[0, 40\)"),
    ("target id", _set("target_ids", 6, 99), r"token id 99 is outside"),
    ("node end past the row", _node("node_ends", [10], 9), "node 7's end 9 is not one past"),
    ("node ends not nested", _node("node_ends", [4], 5), "node 3's end 5 is not one past"),
    ("parent after its child", _node("parent_ids", [3], 3), "node 2's parent 3 is not an earlier"),
    ("parent cycle", _node("parent_ids", [0, 1], 0), "node 0's parent 0 is not an earlier"),
    ("node ids", _set("node_ids", 10, 9), "node_ids do not run 0, 1, 2"),
    ("position", _set("position_ids", 6, 5), "not the depth along each path"),
    ("target off the path", _set("target_ids", 3, 9), "cell 4's input is not the target before"),
    ("weight", _set("weights", 3, 1), "cell 3 has weight 1 but 2 sequence"),
    ("negative weight", _set("weights", 0, -1), "weight -1 is negative"),
    ("sequence index twice", _set("sequence_index", 0, 1), "share a sequence_index"),
    ("sequence index range", _set("sequence_index", 0, 5), r"sequence_index lies outside 0\.\.4"),
    ("sequence not a path", _set("sequence_cells", 1, [0, 1, 2, 4]), "not one path from a root"),
    ("sequence mask", _set("sequence_mask", 0, [False, True]), "not one flag per cell"),
    ("row number", lambda rec: rec.update(row=3), "it is numbered 3"),
]


def _damaged_output(tmp_path, edit, max_length=12, row=0):
    """A tree output of :data:`DAMAGE_ROWS` whose row ``row`` got ``edit``, the manifest's
    size and sha256 of the shard recomputed (only the content check can catch it)."""
    from exactpack.io.shards import TREE_SCHEMA, sha256_file

    _write({k: [r[k] for r in DAMAGE_ROWS] for k in DAMAGE_ROWS[0]}, tmp_path / "t.jsonl")
    out = tmp_path / "tree"
    pack_path(tmp_path / "t.jsonl", out, max_length=max_length, vocab_size=VOCAB, tree="on")
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["shards"][0]
    shard = out / entry["file"]
    records = pq.read_table(shard).to_pylist()
    edit(records[row])
    pq.write_table(pa.Table.from_pylist(records, schema=TREE_SCHEMA), shard)
    entry |= {"bytes": shard.stat().st_size, "sha256": sha256_file(shard)}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def test_the_damage_fixture_loads_whole():
    rec = pack_dataset(
        datasets.Dataset.from_dict({k: [r[k] for r in DAMAGE_ROWS] for k in DAMAGE_ROWS[0]}),
        12,
        tree=True,
        vocab_size=VOCAB,
    )[0]
    assert len(rec["input_ids"]) == 11 and rec["node_ids"][-1] == 7
    assert rec["node_ends"] == [5, 5, 2, 5, 4, 5, 5, 8, 7, 7, 8]


@pytest.mark.parametrize(("what", "edit", "match"), DAMAGES, ids=[d[0] for d in DAMAGES])
def test_a_damaged_tree_field_is_refused_on_load(tmp_path, what, edit, match):
    out = _damaged_output(tmp_path, edit)
    load_packed(out, integrity=False)  # the manifest alone still agrees
    with pytest.raises(InvalidInput, match=match) as err:
        load_packed(out, integrity="full")
    text = str(err.value)
    assert "\n" not in text and "row 0: " in text and text.endswith("damaged; pack again")
    with pytest.raises(InvalidInput, match=match):
        load_packed(out).records()  # the default load checks each row it reads


def test_sequence_indexes_across_rows_are_a_permutation(tmp_path):
    """Two rows (capacity 8): each row's indexes are distinct, but row 1 repeats row 0's —
    refused by the shard's check, as two flat occurrences sharing an ordinal are."""
    out = _damaged_output(tmp_path, lambda rec: None, max_length=8)
    first = load_packed(out).records()[0]["sequence_index"][0]
    (tmp_path / "d").mkdir()
    out = _damaged_output(tmp_path / "d", _set("sequence_index", 0, first), 8, row=1)
    with pytest.raises(InvalidInput, match=r"row 1: it holds the same sequence_index as an earl"):
        load_packed(out, integrity="full")


def test_pack_tree_carries_per_pair_columns_to_the_shards(tmp_path):
    """A DPO JSONL with id and precomputed reference log-probs, packed by ``pack --tree`` in
    blocks of 3 pairs and calls of 2 rows: each sequence's values are its input pair's; in one
    block the records are pack_dataset(tree=True)'s; the types are in the manifest; a shard whose
    carried column has a value too many (size and sha256 recomputed) is refused on load."""
    from exactpack.io.shards import sha256_file

    columns = _dpo_trl(np.random.default_rng(3), 7)
    columns |= {"id": [f"p{i}" for i in range(7)], "ref_chosen_logps": [-i - 0.5 for i in range(7)],
                "ref_rejected_logps": [-2.0 * i for i in range(7)]}  # fmt: skip
    _write(columns, tmp_path / "dpo.jsonl")
    out = tmp_path / "out"
    opts = {"max_length": 16, "vocab_size": VOCAB, "max_rows_per_batch": 2, "tree_block": 3}
    pack_path(tmp_path / "dpo.jsonl", out, tree="on", **opts)
    records = load_packed(out, integrity="full").records()
    for rec in records:
        for s, *vals in zip(rec["sequence_index"], rec["id"], rec["ref_chosen_logps"],
                            rec["ref_rejected_logps"], strict=True):  # fmt: skip
            assert vals == [columns[n][s // 2] for n in ("id", "ref_chosen_logps",
                                                          "ref_rejected_logps")]  # fmt: skip
    pack_path(tmp_path / "dpo.jsonl", tmp_path / "one", tree="on", max_length=16, vocab_size=VOCAB)
    want = list(pack_dataset(datasets.Dataset.from_dict(columns), 16, tree=True))
    assert load_packed(tmp_path / "one").records() == want  # one block: the same rows
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["shards"][0]
    assert entry["carried"] == {"id": "string", "ref_chosen_logps": "double",
                                "ref_rejected_logps": "double"}  # fmt: skip
    shard = out / entry["file"]
    table = pq.read_table(shard)
    rows = table.to_pylist()
    rows[0]["id"] = [*rows[0]["id"], "extra"]
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), shard)
    entry |= {"bytes": shard.stat().st_size, "sha256": sha256_file(shard)}
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InvalidInput, match=r"row 0: carried column 'id' holds 3 values for 2 seq"):
        load_packed(out).records()
    _write(columns | {"weights": [1] * 7}, tmp_path / "clash.jsonl")
    with pytest.raises(InvalidInput, match=r"column 'weights' is carried .* rename it"):
        pack_path(tmp_path / "clash.jsonl", tmp_path / "clash", tree="on", **opts)


def test_tree_rows_constructor_checks_its_arguments_as_the_loader_does():
    import copy

    rec = pack_dataset(
        datasets.Dataset.from_dict({k: [r[k] for r in DAMAGE_ROWS] for k in DAMAGE_ROWS[0]}),
        12,
        tree=True,
        vocab_size=VOCAB,
    )[0]
    tree_batch_from_rows([rec], 12, VOCAB)
    for capacity in (12.0, True, 0, 2**31):  # refused before anything is allocated
        with pytest.raises(InvalidInput, match="capacity must be an integer"):
            tree_batch_from_rows([rec], capacity, VOCAB)
    with pytest.raises(InvalidInput, match=r"holds 11 cells; a row holds 1\.\.8"):
        tree_batch_from_rows([rec], 8, VOCAB)
    with pytest.raises(InvalidInput, match=r"token id 10 is outside \[0, 10\)"):
        tree_batch_from_rows([rec], 12, 10)  # a vocabulary smaller than the ids
    with pytest.raises(InvalidInput, match="vocab_size must be an integer"):
        tree_batch_from_rows([rec], 12, 0)
    for what, edit, match in DAMAGES:
        if what in ("row number", "sequence index range"):  # records: any subset of rows
            continue
        bad = copy.deepcopy(rec)
        edit(bad)
        with pytest.raises(InvalidInput, match=match) as err:
            tree_batch_from_rows([bad], 12, VOCAB)
        assert str(err.value).startswith("tree record 0: "), what
    big = copy.deepcopy(rec)
    big["weights"][0] = 2**31
    with pytest.raises(InvalidInput, match="weights holds a value outside int32"):
        tree_batch_from_rows([big], 12, VOCAB)
    with pytest.raises(InvalidInput, match="the same sequence_index"):
        tree_batch_from_rows([rec, rec], 12, VOCAB)


def test_tree_options_are_pack_options(tmp_path):
    """One options class: ``tree`` / ``tree_prefix`` / ``tree_block`` are PackOptions fields
    (their flags built from the field metadata), taken by every entry point."""
    from exactpack.cli.flags import cli_flags
    from exactpack.pipeline.options import PackOptions
    from exactpack.pipeline.stats import stats_path

    for command in ("pack", "stats"):
        assert {"--tree", "--tree-prefix", "--tree-block"} <= set(cli_flags(command))
    with pytest.raises(InvalidInput, match="tree must be one of on, auto"):
        PackOptions(max_length=8, tree="yes")
    with pytest.raises(InvalidInput, match="tree_prefix must be an integer"):
        PackOptions(max_length=8, tree="auto", tree_prefix=0)
    _write(_grpo(np.random.default_rng(5), 4), tmp_path / "t.jsonl")
    opts = PackOptions(max_length=24, vocab_size=VOCAB, tree="on")
    pack_path(tmp_path / "t.jsonl", tmp_path / "a", opts, tree="on")
    pack_path(tmp_path / "t.jsonl", tmp_path / "b", opts)  # the flat entry point, tree rows
    assert load_packed(tmp_path / "b").records() == load_packed(tmp_path / "a").records()
    report = stats_path(tmp_path / "t.jsonl", opts)
    assert report["tokens_stored"] < report["tokens_flat"]
    rows = _grpo(np.random.default_rng(5), 4)
    ds = datasets.Dataset.from_dict(rows)
    assert list(pack_dataset(ds, options=opts)) == list(pack_dataset(ds, 24, tree=True))


def test_parent_ids_are_held_to_the_nodes_by_hand():
    """The drawn layout of exactpack.core.tree (one prompt, completions a b c / a d / e f)
    as a record, its parent_ids written by hand, then each edited: a parent that differs
    inside one node, a parent that is no earlier node, a root given a parent."""
    from exactpack.core.binding import Binding
    from exactpack.core.tree import SequenceGroups, pack_tree
    from exactpack.io.shards import row_records

    a, b, c, d, e, f = 20, 21, 22, 23, 30, 31
    groups = SequenceGroups.from_prompt_completions(
        [[10, 11, 12, 13]], [[[a, b, c], [a, d], [e, f]]], Binding(64, "t", "s")
    )
    (record,) = row_records(pack_tree(groups, 12).batches[0])
    # nodes 0 (cols 0-2), 1 (col 3), 2 (cols 4-5), 3 (col 6), 4 (cols 7-8)
    assert record["node_ids"] == [0, 0, 0, 1, 2, 2, 3, 4, 4]
    assert record["parent_ids"] == [-1, -1, -1, 0, 1, 1, 1, 0, 0]
    tree_batch_from_rows([record], 12, 64)  # as written: accepted
    for cell, parent in ((5, 0), (3, 3), (0, 2), (7, 9)):
        bad = {**record, "parent_ids": list(record["parent_ids"])}
        bad["parent_ids"][cell] = parent
        with pytest.raises(InvalidInput, match="parent"):
            tree_batch_from_rows([bad], 12, 64)


def test_a_tree_input_is_packed_block_by_block_never_splitting_a_group(tmp_path):
    """Small ``chunk_bytes``: several blocks, each planned on its own; a group's rows that
    straddle a chunk stay one trie, sequence_index numbers the input's rows, and model calls
    never straddle a shard."""
    rng = np.random.default_rng(2)
    rows = [(g, rng.integers(0, VOCAB, int(rng.integers(3, 9))).tolist()) for g in range(60)]
    rows = [(g, [1 + g % 9, 2, 3, *tail[: 1 + k]]) for g, tail in rows for k in range(3)]
    columns = {"input_ids": [ids for _, ids in rows], "group": [f"g{g}" for g, _ in rows]}
    _write(columns, tmp_path / "in.jsonl")
    opts = {"max_length": 40, "vocab_size": VOCAB, "max_rows_per_batch": 4, "tree": "on"}
    stats = pack_path(tmp_path / "in.jsonl", tmp_path / "out", chunk_bytes=1500, **opts)
    whole = pack_path(tmp_path / "in.jsonl", tmp_path / "one", **opts)
    assert stats["blocks"] > 3 and whole["blocks"] == 1
    assert stats["groups"] == whole["groups"] == 60  # no group split at a chunk boundary
    assert stats["tokens_stored"] == whole["tokens_stored"]  # the same tries
    store = load_packed(tmp_path / "out", integrity="full")
    records = store.records()
    assert _recovered(records) == dict(enumerate(_sequences(columns)))
    for rec in records:  # every row holds whole groups
        groups = {columns["group"][i] for i in rec["sequence_index"]}
        for g in groups:
            assert sum(columns["group"][i] == g for i in rec["sequence_index"]) == 3
    calls = [store[i] for i in range(len(store))]
    assert sum(c.shape[0] for c in calls) == store.num_rows == stats["rows"]
    assert len(calls) == stats["batches"] == sum(-(-s["rows"] // 4) for s in store.shards)


def test_tree_packing_keeps_the_flat_input_policy(tmp_path, monkeypatch, capsys):
    """Issue 37, class 1: a budget too small is refused before reading, a row of another
    split is a SplitMismatch, --tree auto never re-reads the file to name a row, and the
    largest look-ahead plans the input it has (no allocation by its size)."""
    from exactpack.core.errors import BudgetExceeded, SplitMismatch
    from exactpack.io import documents

    rows = [{"input_ids": [1, 2, 3 + k % 5], "group": k // 2} for k in range(6)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    opts = {"max_length": 16, "vocab_size": VOCAB, "tree": "on"}
    with pytest.raises(BudgetExceeded, match="one block of groups"):
        pack_path(tmp_path / "in.jsonl", tmp_path / "b", max_metadata_bytes=1 << 20, **opts)
    argv = ["pack", str(tmp_path / "in.jsonl"), "--tree", "--max-length", "16", "--vocab-size",
            str(VOCAB), "--max-metadata-bytes", "1MB", "--out", str(tmp_path / "c")]  # fmt: skip
    assert main(argv) == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1
    split = [*rows, {"input_ids": [1, 2, 3], "group": 9, "partition": "test"}]
    (tmp_path / "split.jsonl").write_text("".join(json.dumps(r) + "\n" for r in split))
    with pytest.raises(SplitMismatch, match="line 7: the row belongs to partition 'test'"):
        pack_path(tmp_path / "split.jsonl", tmp_path / "s", **opts)
    assert not (tmp_path / "s").exists() and not (tmp_path / "b").exists()
    calls = []
    monkeypatch.setattr(documents, "_line_of", lambda *a: calls.append(a) or 0)
    many = "".join(json.dumps({"input_ids": [k % 7, 1, 2, k % 11]}) + "\n" for k in range(3000))
    (tmp_path / "auto.jsonl").write_text(many)
    auto = pack_path(tmp_path / "auto.jsonl", tmp_path / "a", **opts | {"tree": "auto"},
                     tree_prefix=2)  # fmt: skip
    assert calls == [] and auto["sequences"] == 3000 and auto["groups"] == 7
    huge = {"lookahead": 2**31 - 1, "max_open_rows": 2**31 - 1}
    stats = pack_path(tmp_path / "in.jsonl", tmp_path / "l", policy="stream-best-fit",
                      policy_options=huge, **opts)  # fmt: skip
    assert stats["sequences"] == 6 and stats["groups"] == 3


def test_a_prompt_rendered_differently_alone_is_warned_as_trl_warns(tmp_path, chat_folder):
    """Issue 37, class 1: a template that renders the prompt alone differently (here with a
    marker it drops inside prompt + answer) would supervise the prompt's tokens silently."""
    from support.sft_helpers import CHATS

    rows = {
        "prompt": [c[:-1] for c in CHATS[:2]],
        "chosen": [c[-1:] for c in CHATS[:2]],
        "rejected": [[{"role": "assistant", "content": "No idea."}] for _ in CHATS[:2]],
    }
    _write(rows, tmp_path / "dpo.jsonl")
    opts = {"max_length": 256, "tokenizer": str(chat_folder), "tree": "on"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the template's own rendering agrees: no warning
        pack_path(tmp_path / "dpo.jsonl", tmp_path / "ok", **opts)
    odd = "{% if add_generation_prompt %}ALONE {% endif %}"
    odd += "{% for m in messages %}{{ m.content }}\n{% endfor %}"
    (tmp_path / "odd.jinja").write_text(odd)
    with pytest.warns(UserWarning, match=r"dpo.jsonl line 1: the tokenized prompt is not a prefix"):
        pack_path(
            tmp_path / "dpo.jsonl",
            tmp_path / "odd",
            chat_template=str(tmp_path / "odd.jinja"),
            **opts,
        )


@pytest.mark.parametrize("chunk_bytes", [1, 1 << 26])  # a block per chunk / one block
def test_a_bad_row_is_named_by_its_file_line_in_any_block(tmp_path, chunk_bytes):
    """Errors name the file line, not a block-local group: also for a group carried from
    one file's last chunk into the block that reads the next file."""
    rows = [{"input_ids": [1, 2, 3, 4 + i], "group": i // 2} for i in range(6)]
    _write_rows(tmp_path / "a.jsonl", [*rows, {"input_ids": [1], "group": 3}])
    _write_rows(tmp_path / "b.jsonl", rows)
    files = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    opts = {"max_length": 40, "vocab_size": VOCAB, "tree": "on", "chunk_bytes": chunk_bytes}
    with pytest.raises(InvalidInput, match=r"a\.jsonl line 7: 1 token\(s\)"):
        pack_path(files, tmp_path / "out", **opts)
    _write_rows(tmp_path / "a.jsonl", rows)
    _write_rows(tmp_path / "b.jsonl", [*rows, {"input_ids": [1, 2, VOCAB], "group": 9}])
    with pytest.raises(InvalidInput, match=rf"b\.jsonl line 7: token id {VOCAB} at position 2"):
        pack_path(files, tmp_path / "out2", **opts)


def _write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_tree_block_cuts_a_chunk_into_blocks_of_whole_groups(tmp_path):
    """One chunk of 12 rows in groups of 3, --tree-block 4: blocks end at the first group
    change after 4 rows (rows 0-5, 6-8, 9-11); no group is split, so the tries are the
    one-block run's."""
    _write_rows(
        tmp_path / "g.jsonl", [{"input_ids": [1, 2, 3, 4 + i], "group": i // 3} for i in range(12)]
    )
    opts = {"max_length": 40, "vocab_size": VOCAB, "tree": "on"}
    one = pack_path(tmp_path / "g.jsonl", tmp_path / "one", **opts)
    cut = pack_path(tmp_path / "g.jsonl", tmp_path / "cut", **opts, tree_block=4)
    assert (one["blocks"], cut["blocks"]) == (1, 3)
    assert cut["groups"] == cut["tries"] == one["tries"] == 4
    assert _recovered(load_packed(tmp_path / "cut").records()) == _recovered(
        load_packed(tmp_path / "one").records()
    )
