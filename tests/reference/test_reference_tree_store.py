"""Tree outputs of several shards and heavily shared cells, against the input itself.

The reference is the input's own sequences (prompt + completion, row by row) in plain
Python: a cell is a path of tokens ``seq[: d + 2]``, its weight the number of sequences
that share that path and supervise its target (a dict of tuples). Shard files are read
with pyarrow alone. Groups of 300, 200 and 130 completions share their first cell, so a
weight held in 8 bits wraps (300 -> 44, 200 -> -56, 130 -> -126); a shard size of two
rows puts a shard boundary at every even row.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from exactpack.core.loss import token_weighted_sum
from exactpack.io.shards import row_records
from exactpack.io.store import load_packed, tree_batch_from_rows
from exactpack.pipeline import pack_path

VOCAB = 40
CAPACITY = 40
SIZES = (300, 200, 130, 5, 7, 3, 9, 30, 4, 25, 6, 31, 8, 28)  # completions per prompt
SHARD_ROWS = 2


def _columns(seed: int = 0) -> dict[str, list]:
    """Prompt ``[1 + g, 2, 3]`` and completions ``[4, x]``: cell ``3 -> 4`` is shared by
    every completion of the group, cell ``4 -> x`` by those drawing the same ``x``."""
    rng = np.random.default_rng(seed)
    prompts = [[1 + g, 2, 3] for g in range(len(SIZES))]
    comps = [[[4, int(x)] for x in rng.integers(5, VOCAB, size)] for size in SIZES]
    return {"prompt_ids": prompts, "completion_ids": comps}


def _reference(columns: dict[str, list]):
    """Every sequence (tokens, per-pair supervision) in input order, and per path of
    tokens the number of sequences supervising its last token."""
    seqs = []
    for p, cs in zip(columns["prompt_ids"], columns["completion_ids"], strict=True):
        for c in cs:
            tokens = p + c
            seqs.append((tokens, [d >= len(p) - 1 for d in range(len(tokens) - 1)]))
    weight: dict[tuple, int] = {}
    for tokens, mask in seqs:
        for d in range(len(tokens) - 1):
            weight[tuple(tokens[: d + 2])] = weight.get(tuple(tokens[: d + 2]), 0) + mask[d]
    return seqs, weight


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """A tree output of several shards (a shard size of SHARD_ROWS rows)."""
    folder = tmp_path_factory.mktemp("tree")
    columns = _columns()
    (folder / "in.jsonl").write_text(
        "".join(
            json.dumps({"prompt_ids": p, "completion_ids": c}) + "\n"
            for p, c in zip(columns["prompt_ids"], columns["completion_ids"], strict=True)
        )
    )
    # model calls of SHARD_ROWS rows, a new shard after every call
    opts = {"max_rows_per_batch": SHARD_ROWS, "shard_tokens": 1}
    pack_path(folder / "in.jsonl", folder / "out", tree="on", max_length=CAPACITY,
              vocab_size=VOCAB, **opts)  # fmt: skip
    return folder / "out", columns


def _shard_rows(out) -> list[dict]:
    """Every row of every shard file the manifest lists, read with pyarrow alone."""
    manifest = json.loads((out / "manifest.json").read_text())
    rows = []
    for entry in manifest["shards"]:
        rows += pq.read_table(out / entry["file"]).to_pylist()
    return rows


def test_the_output_has_several_shards_and_weights_beyond_8_bits(packed):
    out, columns = packed
    manifest = json.loads((out / "manifest.json").read_text())
    rows = [s["rows"] for s in manifest["shards"]]
    assert len(rows) >= 3 and set(rows[:-1]) == {SHARD_ROWS} and 0 < rows[-1] <= SHARD_ROWS
    assert [s["first_row"] for s in manifest["shards"]] == list(range(0, sum(rows), SHARD_ROWS))
    _, weight = _reference(columns)
    assert max(weight.values()) == 300 and sorted(weight.values())[-3:] == [130, 200, 300]


def test_every_cell_of_every_shard_is_its_sequences_path_and_weight(packed):
    """Each record's cells hold the tokens, depth and weight of the input's paths, every
    input sequence is in exactly one row, and row ``i`` is the store's row ``i``."""
    out, columns = packed
    seqs, weight = _reference(columns)
    rows = _shard_rows(out)
    store = load_packed(out, integrity="full")
    assert [rec["row"] for rec in rows] == list(range(store.num_rows))
    records = store.records()
    seen = []
    for rec in rows:
        assert records[rec["row"]] == {n: v for n, v in rec.items() if n != "row"}
        for s, cells, mask in zip(
            rec["sequence_index"], rec["sequence_cells"], rec["sequence_mask"], strict=True
        ):
            tokens, flags = seqs[s]
            assert mask == flags
            for d, c in enumerate(cells):
                assert (rec["input_ids"][c], rec["target_ids"][c]) == (tokens[d], tokens[d + 1])
                assert rec["position_ids"][c] == d
                assert rec["weights"][c] == weight[tuple(tokens[: d + 2])]
            seen.append(s)
    assert sorted(seen) == list(range(len(seqs)))


def test_model_calls_read_by_index_in_any_order_come_from_their_own_shard(packed):
    out, _ = packed
    rows = _shard_rows(out)
    store = load_packed(out)
    calls = -(-len(rows) // SHARD_ROWS)  # one call per shard
    assert len(store) == calls == len(store.shards)
    for i in [*range(calls)[::-1], *range(calls)]:  # out of order, each shard re-read
        part = [
            {n: v for n, v in r.items() if n != "row"}
            for r in rows[SHARD_ROWS * i : SHARD_ROWS * (i + 1)]
        ]
        want = tree_batch_from_rows(part, CAPACITY, VOCAB)
        got = store[i]
        for name in ("inputs", "targets", "segments", "node_ends", "weights", "seq_index"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
        assert got.binding == store.binding
    with pytest.raises(IndexError):
        store[len(store)]


def _reloaded(out):
    store = load_packed(out)
    return tree_batch_from_rows(store.records(), store.capacity, store.binding.vocab_size)


def test_the_reloaded_batch_keeps_every_weight_beyond_8_bits(packed):
    """One model call of every row: weights, loss mask and N as the input says."""
    out, columns = packed
    seqs, weight = _reference(columns)
    batch = _reloaded(out)
    for r, rec in enumerate(_shard_rows(out)):
        used = len(rec["weights"])
        assert batch.weights[r, :used].tolist() == rec["weights"]
        assert batch.loss_mask[r, :used].tolist() == [w > 0 for w in rec["weights"]]
        assert not batch.loss_mask[r, used:].any()
    assert int(batch.weights.max()) == max(weight.values()) == 300
    assert int(batch.weights.min()) == 0
    assert batch.eligible_count == sum(sum(mask) for _, mask in seqs)  # the flat N


def test_the_reloaded_batch_s_loss_is_the_per_sequence_sum(packed):
    """``Σ weight·nll`` equals each sequence's own supervised NLL summed with math.fsum."""
    out, columns = packed
    seqs, _ = _reference(columns)
    batch = _reloaded(out)
    logits = np.random.default_rng(1).normal(size=(*batch.shape, VOCAB))
    got = token_weighted_sum(logits, batch)
    want = []
    for rec in _shard_rows(out):
        r = rec["row"]
        for s, cells in zip(rec["sequence_index"], rec["sequence_cells"], strict=True):
            tokens, flags = seqs[s]
            for d, c in enumerate(cells):
                if flags[d]:
                    z = logits[r, c].tolist()
                    top = max(z)
                    lse = top + math.log(math.fsum(math.exp(v - top) for v in z))
                    want.append(lse - z[tokens[d + 1]])
    assert got.count == len(want) == sum(sum(mask) for _, mask in seqs)
    # float64 throughout: ~660 terms of size ~4, NumPy's pairwise sum of weight·nll
    # against fsum of each term; a few ulps of the total apart
    assert math.isclose(float(got.sum), math.fsum(want), rel_tol=1e-12, abs_tol=1e-9)


def test_the_reloaded_batch_is_the_in_memory_packing(packed):
    """The files read back build the arrays ``pack_tree`` builds from the same groups."""
    from exactpack.core.binding import Binding
    from exactpack.core.tree import SequenceGroups, pack_tree

    out, columns = packed
    binding = Binding(VOCAB, "pretokenized", "test")
    groups = SequenceGroups.from_prompt_completions(
        columns["prompt_ids"], columns["completion_ids"], binding
    )
    epoch = pack_tree(groups, CAPACITY, policy="best-fit-decreasing")
    rows = [rec for b in epoch.batches for rec in row_records(b)]
    want = tree_batch_from_rows(rows, CAPACITY, VOCAB)
    got = _reloaded(out)
    for name in ("inputs", "targets", "positions", "segments", "node_ends", "weights", "loss_mask"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    assert int(got.weights.sum()) == int(want.weights.sum()) == int(groups.loss_mask.sum())
