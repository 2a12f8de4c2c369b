"""Fuzz packed outputs: any edit of a manifest or a shard fails the load or changes nothing.

Two hypothesis targets over one small packed output (three shards, made by
``pack_path`` so it carries statistics):

- a manifest edit: one to three values replaced (numbers nudged, scaled,
  negated, or swapped for 2**40, ``Infinity``, a float, a bool, text, null,
  a list), keys deleted, shard entries dropped, repeated or swapped;
- a shard edit: one value of one column of one shard changed, the shard
  rewritten and its size and sha256 recomputed in the manifest (so the
  checksums hold and only the agreement checks can object).

Each edited output is loaded and every model call read (``integrity=True`` and
``"full"``). A manifest edit gives a :class:`~exactpack.ExactpackError`, or
exactly the batches of the unedited output (cells, segments, positions,
flags, occurrences and provenance). The binding's identity strings, the
partition and the informational records (input, policy options, engine) are
claims no row can confirm; edits of those are checked against the caller's
expectations instead (``test_integrity.py``) and are not drawn here.

A shard edited *and re-hashed* is a new output as far as any check can tell
(a token changed to another in-vocabulary id is just data), so there the
contract is: a :class:`~exactpack.ExactpackError`, or batches that keep every
invariant (tokens in the vocabulary, every occurrence whole, inside its
row, its segment and positions intact, provenance consistent; once per
shard, and once in the whole output under ``integrity="full"``).
"""

import copy
import functools
import json
import math
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exactpack import ExactpackError
from exactpack.core.batch import CELL_FIELDS
from exactpack.io.shards import sha256_file
from exactpack.io.store import MANIFEST, load_packed
from exactpack.pipeline.local import pack_path

from support.packed_helpers import (
    OCCURRENCE_FIELDS,
    random_records,
    recovered_examples,
    write_jsonl,
)

FUZZ = settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
#: Paths that only claim an identity or record where the data came from.
CLAIMS = ("binding.tokenizer_id", "binding.split_id", "partition", "input", "policy.options",
          "format", "version")  # fmt: skip


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzzout")
    records = random_records(np.random.default_rng(8), 40, vocab=300, max_len=20)
    data = write_jsonl(folder / "d.jsonl", records)
    pack_path(data, folder / "ref", max_length=24, vocab_size=300, max_rows_per_batch=2,
              shard_tokens=120)  # fmt: skip
    reference = Reference(_arrays(b) for b in load_packed(folder / "ref"))
    assert len(json.loads((folder / "ref" / MANIFEST).read_text())["shards"]) >= 3
    return folder, reference


class Reference(list):
    """The unedited output's batches (a short repr in hypothesis reports)."""

    def __repr__(self) -> str:
        return f"<{len(self)} reference batches>"


def _arrays(batch):
    cells = [getattr(batch, name).copy() for name in CELL_FIELDS]
    occ = [np.asarray(getattr(batch.occurrences, name)).copy() for name in OCCURRENCE_FIELDS]
    return cells, occ, batch.first_row


def _same(got, want) -> bool:
    if len(got) != len(want):
        return False
    for (ca, oa, fa), (cb, ob, fb) in zip(got, want, strict=True):
        if fa != fb or not all(
            x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(ca, cb, strict=True)
        ):
            return False
        if not all(np.array_equal(x, y) for x, y in zip(oa, ob, strict=True)):
            return False
    return True


def _check(out, reference, edit: str = "", same: bool = True, depths=(True, "full")) -> None:
    """Load ``out`` at ``depths`` and read every model call: an error, or the reference
    batches exactly (``same``), or batches that keep every invariant."""
    for verify in depths:
        try:
            store = load_packed(out, integrity=verify)
            batches = list(store)
        except ExactpackError as err:  # anything else propagates: a failure naming the edit
            assert "\n" not in str(err), "one line"
            continue
        if same:
            got = [_arrays(b) for b in batches]
            assert _same(got, reference), f"{edit} changed what loads (verify={verify})"
            continue
        # Segments and positions intact; each occurrence once per model call (per shard),
        # and once in the whole output when every shard was read up front ("full").
        examples = {}
        for batch in batches:
            examples.update(recovered_examples([batch]))
        if verify == "full":
            assert sorted(examples) == list(range(store.occurrences)), edit
            assert len(recovered_examples(batches)) == store.occurrences, edit
        vocab = store.binding.vocab_size
        for batch in batches:
            tokens = batch.inputs[batch.input_valid]
            assert tokens.size == 0 or (tokens.min() >= 0 and tokens.max() < vocab), edit
        for e in examples.values():
            assert e["range"][1] - e["range"][0] == len(e["tokens"]), edit


def _leaves(node, prefix=""):
    """(path, parent, key) of every value in the manifest, containers included."""
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in items:
        path = f"{prefix}{key}"
        if not path.startswith(CLAIMS):
            yield path, node, key
        if isinstance(value, (dict, list)):
            yield from _leaves(value, path + ".")


REPLACEMENTS = [0, -1, 1, 2, 3, 2**31, 2**40, 2**63, -(2**63), 1.5, math.inf, -math.inf,
                True, False, None, "x", "", [], {}, 1e308]  # fmt: skip


@st.composite
def manifest_edits(draw, manifest):
    edited = copy.deepcopy(manifest)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["value", "value", "value", "delete", "shards"]))
        if kind == "shards":
            shards = edited.get("shards")
            if isinstance(shards, list) and shards:
                i = draw(st.integers(0, len(shards) - 1))
                how = draw(st.sampled_from(["drop", "repeat", "swap", "reverse"]))
                if how == "drop":
                    shards.pop(i)
                elif how == "repeat":
                    shards.insert(i, copy.deepcopy(shards[i]))
                elif how == "swap" and len(shards) > 1:
                    shards[i], shards[i - 1] = shards[i - 1], shards[i]
                else:
                    shards.reverse()
            continue
        leaves = list(_leaves(edited))
        if not leaves:
            break
        _, parent, key = draw(st.sampled_from(leaves))
        if kind == "delete":
            del parent[key]
            continue
        old = parent[key]
        if isinstance(old, int) and not isinstance(old, bool) and draw(st.booleans()):
            new = draw(st.sampled_from([old + 1, old - 1, old * 2, -old, old // 2, old + 2]))
        else:
            new = draw(st.sampled_from(REPLACEMENTS))
        parent[key] = copy.deepcopy(new)
    return edited


@FUZZ
@given(st.data())
def test_any_manifest_edit_fails_the_load_or_changes_nothing(packed, data):
    folder, reference = packed
    out = folder / "edited"  # shards shared by every example; only the manifest changes
    if not out.exists():
        shutil.copytree(folder / "ref", out)
    manifest = json.loads(_reference_text(folder))
    edited = data.draw(manifest_edits(manifest))
    (out / MANIFEST).write_text(json.dumps(edited))  # json writes inf as Infinity
    _check(out, reference)


COLUMNS = ["row", "tokens", "labels", "seq_lengths", "pair_counts", "seq_starts", "ordinals",
           "source_ids", "loss_bits", "example_ids", "range_starts", "range_ends"]  # fmt: skip


@st.composite
def shard_edits(draw, tables, names):
    """(shard, column name, its edited values as lists, a description) of one value changed;
    ``names[k]``: shard k's columns that may be edited."""
    k = draw(st.integers(0, len(tables) - 1))
    name = draw(st.sampled_from(names[k]))
    column = tables[k].column(name).to_pylist()
    r = draw(st.integers(0, len(column) - 1))
    old = copy.deepcopy(column[r])
    if isinstance(column[r], list):
        if not column[r] or draw(st.integers(0, 5)) == 0:
            column[r] = [] if draw(st.booleans()) else column[r] + column[r][:1]
        else:
            j = draw(st.integers(0, len(column[r]) - 1))
            column[r][j] = _changed(draw, column[r][j])
    else:
        column[r] = _changed(draw, column[r])
    return k, name, column, f"shard {k} {name}[{r}]: {old!r} -> {column[r]!r}"


def _changed(draw, value):
    if isinstance(value, str):
        return draw(st.sampled_from([None, "", value + "x", "other"]))
    if isinstance(value, bytes):  # packed loss flags: one bit flipped, a byte more or less
        flipped = bytes([value[0] ^ 0x80]) + value[1:] if value else b"\x80"
        return draw(st.sampled_from([None, b"", value + b"\x00", value[:-1], flipped]))
    return draw(st.sampled_from([None, value + 1, value - 1, -value - 1, 0, 2**31 - 1, -100]))


@FUZZ
@given(st.data())
def test_any_rehashed_shard_edit_fails_the_load_or_keeps_every_invariant(packed, data):
    folder, reference = packed
    out = folder / "shard-edited"
    if not out.exists():
        shutil.copytree(folder / "ref", out)
    manifest = json.loads(_reference_text(folder))
    tables = _tables(folder)
    k, name, column, edit = data.draw(shard_edits(tables, _editable(folder)))
    schema = tables[k].schema
    try:
        array = pa.array(column, type=schema.field(name).type)
    except (pa.ArrowException, OverflowError):
        return  # not storable in the shard's types: not an edit a file can hold
    table = tables[k].set_column(schema.get_field_index(name), schema.field(name), array)
    path = out / manifest["shards"][k]["file"]
    try:
        pq.write_table(table, path)
        manifest["shards"][k].update(bytes=path.stat().st_size, sha256=sha256_file(path))
        (out / MANIFEST).write_text(json.dumps(manifest))
        # "full" runs every check the fast path runs when a shard is read, and more
        _check(out, reference, edit, same=False, depths=("full",))
    finally:  # the unedited bytes back, from memory (a thousand examples: no source to open)
        path.write_bytes(_reference_bytes(folder, path.name))
        (out / MANIFEST).write_text(_reference_text(folder))


# The reference output never changes during the module, so its files are read once.
@functools.cache
def _tables(folder):
    manifest = json.loads(_reference_text(folder))
    return [pq.read_table(folder / "ref" / s["file"]) for s in manifest["shards"]]


@functools.cache
def _reference_text(folder) -> str:
    return (folder / "ref" / MANIFEST).read_text()


@functools.cache
def _reference_bytes(folder, name: str) -> bytes:
    return (folder / "ref" / name).read_bytes()


@functools.cache
def _editable(folder) -> list[list[str]]:
    """Each shard's columns in COLUMNS order (pyarrow builds ``column_names`` at every call)."""
    return [[c for c in COLUMNS if c in t.column_names] for t in _tables(folder)]
