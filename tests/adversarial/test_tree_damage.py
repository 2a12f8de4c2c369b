"""A tree output whose shard was changed *and* its manifest's checksum recomputed.

The sha256 then agrees, so only the records' own consistency can refuse the change:
every field of a tree record is damaged in turn (one value changed to another the
schema accepts, lengths kept), the shard rewritten with pyarrow, its size and sha256
written back into ``manifest.json`` with hashlib, and loading must raise one
:class:`InvalidInput` line naming the shard and saying it is damaged, on
``integrity="full"``, on ``records()`` and on reading the row by index.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from exactpack.core.errors import InvalidInput
from exactpack.io.store import load_packed
from exactpack.pipeline import pack_path

VOCAB = 30


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A tree output of one row per shard: prompts shared by 2-4
    completions that branch after a shared first completion token."""
    folder = tmp_path_factory.mktemp("clean")
    rows = [
        {
            "prompt_ids": [1 + g, 2, 3],
            "completion_ids": [[4, 5 + k, 6 + g] for k in range(2 + g % 3)],
        }
        for g in range(6)
    ]
    (folder / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # one-row model calls, a shard whenever a cell has been written: one row per shard
    opts = {"max_length": 16, "vocab_size": VOCAB, "max_rows_per_batch": 1, "shard_tokens": 1}
    pack_path(folder / "in.jsonl", folder / "out", tree="on", **opts)
    manifest = json.loads((folder / "out" / "manifest.json").read_text())
    assert len(manifest["shards"]) >= 3
    return folder / "out"


def _branching(rec) -> int:
    """A cell where a second branch starts (its node's parent is a real node)."""
    return next(c for c, p in enumerate(rec["parent_ids"]) if p >= 0 and rec["node_ids"][c] >= 2)


def _bump_node(rec):  # a branch's cells renumbered as the node after it
    c = _branching(rec)
    rec["node_ids"][c] += 1


def _end(rec):  # a node's Euler exit one short
    rec["node_ends"][0] -= 1


def _parent(rec):  # a branch hung under another node (a real id, in range)
    c = _branching(rec)
    rec["parent_ids"][c] = 0 if rec["parent_ids"][c] != 0 else rec["node_ids"][c] - 1


def _parents_short(rec):  # one parent fewer than cells
    rec["parent_ids"].pop()


def _parents_long(rec):
    rec["parent_ids"].append(-1)


def _root_parent(rec):  # the root given a parent
    rec["parent_ids"][0] = 0


def _weight(rec):  # a multiplicity one higher
    c = max(range(len(rec["weights"])), key=lambda i: rec["weights"][i])
    rec["weights"][c] += 1


def _zero_weight(rec):  # a supervised cell left out of the loss
    c = max(range(len(rec["weights"])), key=lambda i: rec["weights"][i])
    rec["weights"][c] = 0


def _sequence_index_out(rec):  # a bit flip: past the last sequence
    rec["sequence_index"][0] += 1 << 20


def _sequence_index_twice(rec):  # a sequence named twice
    rec["sequence_index"][-1] = rec["sequence_index"][0]


def _position(rec):
    rec["position_ids"][-1] += 1


def _sequence_cell(rec):  # a sequence routed through its sibling's cell
    cells = rec["sequence_cells"][0]
    cells[-1] = max(x for cs in rec["sequence_cells"] for x in cs if x not in cells)


def _mask(rec):
    rec["sequence_mask"][0][-1] = not rec["sequence_mask"][0][-1]


def _null_mask(rec):  # a null where a flag was
    rec["sequence_mask"][0][0] = None


def _null_input(rec):
    rec["input_ids"][1] = None


def _input(rec):
    c = _branching(rec)
    rec["input_ids"][c] = (rec["input_ids"][c] + 1) % VOCAB


DAMAGE = {
    "node_ids": _bump_node,
    "node_ends": _end,
    "parent_ids": _parent,
    "parent_ids-root": _root_parent,
    "parent_ids-short": _parents_short,
    "parent_ids-long": _parents_long,
    "weights": _weight,
    "weights-zero": _zero_weight,
    "sequence_index": _sequence_index_out,
    "sequence_index-twice": _sequence_index_twice,
    "position_ids": _position,
    "sequence_cells": _sequence_cell,
    "sequence_mask": _mask,
    "input_ids": _input,
    "input_ids-null": _null_input,
    "sequence_mask-null": _null_mask,
}


def _damage(clean, tmp_path, shard: int, change) -> str:
    """A copy of ``clean`` with ``change`` made to the first row of shard ``shard`` and the
    manifest's size and sha256 of that shard recomputed; the shard's file name."""
    out = tmp_path / "out"
    shutil.copytree(clean, out)
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["shards"][shard]
    path = out / entry["file"]
    table = pq.read_table(path)
    rows = table.to_pylist()
    change(rows[0])
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    data = path.read_bytes()
    entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return entry["file"]


ROUTES = pytest.mark.parametrize("shard", [0, -1], ids=["first-shard", "last-shard"])
FIELDS = pytest.mark.parametrize("field", list(DAMAGE))


@ROUTES
@FIELDS
def test_a_full_check_refuses_every_damaged_tree_field(clean, tmp_path, field, shard):
    """Even with a matching checksum: one line naming the shard, saying it is damaged."""
    name = _damage(clean, tmp_path, shard, DAMAGE[field])
    with pytest.raises(InvalidInput, match="damaged") as full:
        load_packed(tmp_path / "out", integrity="full")
    message = str(full.value)
    assert name in message and "\n" not in message


@FIELDS
def test_records_of_a_damaged_tree_output_are_refused(clean, tmp_path, field):
    _damage(clean, tmp_path, -1, DAMAGE[field])
    store = load_packed(tmp_path / "out")  # the manifest and the checksums agree
    with pytest.raises(InvalidInput, match="damaged"):
        store.records()


@FIELDS
def test_a_damaged_tree_row_read_by_index_is_refused(clean, tmp_path, field):
    _damage(clean, tmp_path, 1, DAMAGE[field])  # a shard boundary: row 1 opens shard 1
    store = load_packed(tmp_path / "out")
    first = store.shards[1]["first_row"]
    with pytest.raises(InvalidInput, match="damaged") as err:
        store[first]  # model calls of one row: call i is row i
    assert store.shards[1]["file"] in str(err.value)  # the shard that holds the row
    first_file = pq.read_table(tmp_path / "out" / store.shards[0]["file"]).to_pylist()
    assert store.shard_rows(0) == first_file
    assert store[0].shape == (1, 16) and store[0].tokens_stored == len(first_file[0]["input_ids"])


def test_the_undamaged_copy_loads(clean, tmp_path):
    _damage(clean, tmp_path, 0, lambda rec: None)  # rewritten, same values
    store = load_packed(tmp_path / "out", integrity="full")
    assert len(store) == store.num_rows  # one-row model calls
    assert [r for k in range(len(store.shards)) for r in store.shard_rows(k)] == [
        rec for s in store.shards for rec in pq.read_table(tmp_path / "out" / s["file"]).to_pylist()
    ]
