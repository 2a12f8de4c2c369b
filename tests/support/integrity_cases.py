"""Damaged and edited packed outputs: each one must be refused with a clear error.

A case damages a copy of a small packed output (three or more shards, made by
``pack_path`` so it carries statistics) and loads it the way a training job
would: ``load_packed`` and every model call read. Edits of shards come with
their size and sha256 recomputed in the manifest, so the checksums hold and
only the agreement of manifest and shards (:mod:`exactpack.io.integrity`) can
catch them. ``tests/adversarial/test_integrity.py`` asserts every case;
``tests/gen_reliability.py`` lists them in ``docs/reliability.md``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from exactpack import (
    Binding,
    BindingMismatch,
    BudgetExceeded,
    ExactpackError,
    InvalidInput,
    SplitMismatch,
)
from exactpack.io.shards import FIELDS, sha256_file
from exactpack.io.store import MANIFEST, load_packed
from exactpack.pipeline.local import pack_path

from support.packed_helpers import random_records, write_jsonl

VOCAB = 500


def make_packed(folder: Path) -> tuple[Path, list[dict]]:
    """A packed output of several shards (tiny shard size) and its source records."""
    records = random_records(np.random.default_rng(3), 120, vocab=VOCAB, max_len=30)
    data = write_jsonl(folder / "data.jsonl", records)
    pack_path(
        data,
        folder / "out",
        max_length=32,
        vocab_size=VOCAB,
        max_rows_per_batch=2,
        shard_tokens=200,
    )
    return folder / "out", records


def load_all(out: Path, verify: bool | str = True) -> Any:
    """What a training job does: open the output and read every model call."""
    store = load_packed(out, integrity=verify)
    for _ in store:
        pass
    return store


def _shard(out: Path, k: int = 1) -> Path:
    return out / json.loads((out / MANIFEST).read_text())["shards"][k]["file"]


def _flip(at: float) -> Callable[[Path], None]:
    def damage(out: Path) -> None:
        path = _shard(out)
        data = bytearray(path.read_bytes())
        data[int(len(data) * at)] ^= 0x01
        path.write_bytes(bytes(data))

    return damage


def _rewrite_shard(change: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def damage(out: Path) -> None:
        _shard(out).write_bytes(change(_shard(out).read_bytes()))

    return damage


def _swap(out: Path) -> None:
    a, b = _shard(out, 0), _shard(out, 1)
    a.rename(out / "tmp")
    b.rename(a)
    (out / "tmp").rename(b)


def _manifest(change: Callable[[dict], Any]) -> Callable[[Path], None]:
    def damage(out: Path) -> None:
        manifest = json.loads((out / MANIFEST).read_text())
        manifest = change(manifest) or manifest
        (out / MANIFEST).write_text(json.dumps(manifest))

    return damage


def _set(path: str, value: Any) -> Callable[[dict], None]:
    def change(manifest: dict) -> None:
        *parents, last = path.split(".")
        node = manifest
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        node[last] = value

    return change


def _fix_checksums(out: Path, k: int) -> None:
    manifest = json.loads((out / MANIFEST).read_text())
    entry = manifest["shards"][k]
    path = out / entry["file"]
    entry["bytes"], entry["sha256"] = path.stat().st_size, sha256_file(path)
    entry["columns"] = pq.read_schema(path).names  # what a careful editor updates too
    (out / MANIFEST).write_text(json.dumps(manifest))


def _edit_shard(change: Callable[[dict], Any], k: int = 1) -> Callable[[Path], None]:
    """Rewrite shard ``k`` with ``change(columns)`` applied (lists per row), checksums fixed."""

    def damage(out: Path) -> None:
        path = _shard(out, k)
        table = pq.read_table(path)
        columns = {name: table.column(name).to_pylist() for name in table.column_names}
        change(columns)
        schema = pa.schema(  # a column the edit adds gets the format's type
            [table.schema.field(n) if n in table.schema.names else (n, FIELDS[n]) for n in columns]
        )
        pq.write_table(pa.table(columns, schema=schema), path)
        _fix_checksums(out, k)

    return damage


def _retype(name: str, kind: pa.DataType, change: Callable[[dict], Any] | None = None,
            drop: bool = False) -> Callable[[Path], None]:  # fmt: skip
    """Rewrite shard 1 with column ``name`` stored as ``kind`` (values cast, then
    ``change(columns)``) or dropped, its checksums and column list fixed in the manifest."""

    def damage(out: Path) -> None:
        path = _shard(out, 1)
        table = pq.read_table(path)
        columns = {n: table.column(n).to_pylist() for n in table.column_names}
        if drop:
            del columns[name]
        elif change is not None:
            change(columns)
        fields = [
            (n, kind) if n == name else table.schema.field(n) if n in table.schema.names
            else (n, FIELDS.get(n, kind)) for n in columns
        ]  # fmt: skip
        pq.write_table(pa.table(columns, schema=pa.schema(fields)), path)
        _fix_checksums(out, 1)

    return damage


def _huge_token(c: dict) -> None:
    c["tokens"][0][1] = 2**32 + 7  # wraps to 7 as int32: inside the vocabulary


def _set_token(value: int) -> Callable[[dict], None]:
    def change(c: dict) -> None:
        c["tokens"][0][1] = value
        if "labels" in c and c["labels"][0][1] != -100:  # version 1: a label is its token
            c["labels"][0][1] = value

    return change


def _lengthen_range(c: dict) -> None:
    if "range_ends" not in c:  # version 2 stores no whole-source ranges: store them, edited
        c["range_starts"] = [[0] * len(n) for n in c["pair_counts"]]
        c["range_ends"] = [[x + 1 for x in n] for n in c["pair_counts"]]
    c["range_ends"][0][0] += 1


def _shared_row(c: dict) -> int:
    counts = c["pair_counts"] if "pair_counts" in c else c["seq_lengths"]  # version 2 or 1
    return next(r for r, lengths in enumerate(counts) if len(lengths) > 1)


def _overlap(c: dict) -> None:
    r = _shared_row(c)
    c["seq_starts"][r][1] = c["seq_starts"][r][0]


def _same_ordinal(c: dict) -> None:
    r = _shared_row(c)
    c["ordinals"][r][1] = c["ordinals"][r][0]


def _ordinal_of_shard_0(out: Path) -> None:
    first = pq.read_table(_shard(out, 0)).column("ordinals")[0].as_py()[0]
    _edit_shard(lambda c: c["ordinals"][0].__setitem__(0, first))(out)


def _shift_rows(c: dict) -> None:
    c["row"] = [r + 2 for r in c["row"]]


def _drop_last_row(c: dict) -> None:
    for values in c.values():
        values.pop()


def _swap_with_checksums(out: Path) -> None:
    _swap(out)
    _fix_checksums(out, 0)
    _fix_checksums(out, 1)


def _renumber(manifest: dict) -> None:
    """First rows and totals recomputed after entries changed (a careful edit)."""
    first = 0
    for entry in manifest["shards"]:
        entry["first_row"] = first
        first += entry["rows"]
    manifest["rows"] = first
    manifest["occurrences"] = sum(e["occurrences"] for e in manifest["shards"])


def _drop_entry(k: int, delete_file: bool) -> Callable[[Path], None]:
    def damage(out: Path) -> None:
        manifest = json.loads((out / MANIFEST).read_text())
        entry = manifest["shards"].pop(k)
        _renumber(manifest)
        if delete_file:
            (out / entry["file"]).unlink()
        (out / MANIFEST).write_text(json.dumps(manifest))

    return damage


def _more_rows(manifest: dict) -> None:
    manifest["shards"][1]["rows"] += 2
    _renumber(manifest)
    del manifest["statistics"]


def _one_more_occurrence(manifest: dict) -> None:
    manifest["shards"][1]["occurrences"] += 1
    manifest["occurrences"] += 1


def _expected_binding(field: str) -> Callable[[Path], Any]:
    def load(out: Path) -> Any:
        values = load_packed(out).binding.to_dict()
        values[field] = values[field] + 1 if field == "vocab_size" else values[field] + "-other"
        return load_packed(out, Binding.from_dict(values))

    return load


@dataclass(frozen=True)
class Damage:
    """One way a packed output can be wrong, and the refusal it must meet."""

    name: str
    input: str
    damage: Callable[[Path], None]
    error: type[ExactpackError]
    needles: tuple[str, ...]
    load: Callable[[Path], Any] = load_all


DAMAGES: list[Damage] = [
    Damage("bit-flip", "one bit flipped in a shard", _flip(0.5), InvalidInput,
           ("shard-0001-00001.parquet: checksum mismatch", "pack again")),
    Damage("footer-flip", "one bit flipped in a shard's footer", _flip(0.999), InvalidInput,
           ("shard-0001-00001.parquet: checksum mismatch",)),
    Damage("truncated", "a shard cut short by 100 bytes", _rewrite_shard(lambda b: b[:-100]),
           InvalidInput, ("shard-0001-00001.parquet: checksum mismatch", "truncated")),
    Damage("appended", "a byte appended to a shard", _rewrite_shard(lambda b: b + b"\0"),
           InvalidInput, ("shard-0001-00001.parquet: checksum mismatch",)),
    Damage("emptied", "a shard emptied", _rewrite_shard(lambda b: b""), InvalidInput,
           ("shard-0001-00001.parquet: checksum mismatch",)),
    Damage("deleted", "a shard deleted", lambda out: _shard(out).unlink(), InvalidInput,
           ("shard-0001-00001.parquet is missing", "incomplete")),
    Damage("swapped", "two shards swapped", _swap, InvalidInput,
           ("shard-0001-00000.parquet: checksum mismatch",)),
    Damage("no-manifest", "the manifest deleted (what a killed run leaves)",
           lambda out: (out / MANIFEST).unlink(), InvalidInput,
           ("has no manifest.json: not a finished exactpack output", "run exactpack pack again")),
    Damage("manifest-not-json", "the manifest is not JSON",
           lambda out: (out / MANIFEST).write_bytes(b'{"format": \xff'), InvalidInput,
           ("manifest.json: not valid JSON", "pack again")),
    Damage("manifest-list", "the manifest is a JSON list", _manifest(lambda m: [m]),
           InvalidInput, ("holds a list, not a manifest object",)),
    Damage("manifest-version", "a manifest of another format version",
           _manifest(_set("version", 99)), InvalidInput,
           ("this exactpack reads 'exactpack.packed-rows' version 2",)),
    Damage("manifest-rows", "the manifest's row count changed", _manifest(_set("rows", 10**6)),
           InvalidInput, ("shards hold", "rows, not 1,000,000")),
    Damage("manifest-sha", "a shard's recorded sha256 changed",
           _manifest(_set("shards.0.sha256", "0" * 64)), InvalidInput,
           ("shard-0001-00000.parquet: checksum mismatch",)),
    Damage("manifest-first-row", "a shard's first row changed",
           _manifest(_set("shards.1.first_row", 1)), InvalidInput,
           ("shard shard-0001-00001.parquet starts at row 1, not",)),
    Damage("path-traversal", "a shard named `../data.jsonl`",
           _manifest(_set("shards.0.file", "../data.jsonl")), InvalidInput,
           ("shard file '../data.jsonl' is not a plain file name", "pack again")),
    Damage("absolute-path", "a shard named `/etc/passwd`",
           _manifest(_set("shards.0.file", "/etc/passwd")), InvalidInput,
           ("shard file '/etc/passwd' is not a plain file name",)),
    Damage("no-binding", "the binding removed from the manifest",
           _manifest(lambda m: m.pop("binding") and None), InvalidInput,
           ("manifest.json: 'binding' is missing", "pack again")),
    Damage("bad-counts", "a shard's row count is a string",
           _manifest(_set("shards.0.rows", "many")), InvalidInput,
           ("shard shard-0001-00000.parquet rows is 'many', not an integer",)),
    Damage("zero-capacity", "capacity 0 in the manifest",
           _manifest(_set("config.capacity", 0)), InvalidInput,
           ("config.capacity is 0, not an integer in [1, 2,147,483,647]",)),
    Damage("other-vocabulary", "loaded with another expected vocabulary size",
           lambda out: None, BindingMismatch,
           ("vocab_size 500 != expected 501", "re-encode it with the expected tokenizer"),
           _expected_binding("vocab_size")),
    Damage("other-tokenizer", "loaded with another expected tokenizer",
           lambda out: None, BindingMismatch, ("tokenizer_id 'pretokenized' != expected",),
           _expected_binding("tokenizer_id")),
    Damage("other-split", "loaded with another expected split receipt",
           lambda out: None, BindingMismatch, ("split_id 'sha256:",),
           _expected_binding("split_id")),
    Damage("other-partition", "a training output loaded as validation data",
           lambda out: None, SplitMismatch,
           ("holds split 'train', not 'validation'", "load the validation output"),
           lambda out: load_packed(out, expected_split="validation")),
    Damage("unverified-truncated", "a truncated shard read with `integrity=False`",
           _rewrite_shard(lambda b: b[:-100]), InvalidInput,
           ("shard-0001-00001.parquet: cannot read the shard", "pack again"),
           lambda out: load_packed(out, integrity=False).shard_rows(1)),
    # Edited shards, their size and sha256 recomputed: only the agreement checks see them.
    Damage("token-beyond-vocabulary", "a token id >= vocab_size written into a shard",
           _edit_shard(_set_token(VOCAB + 7)), InvalidInput,
           ("shard-0001-00001.parquet: token id 507 is outside [0, 500)", "pack again")),
    Damage("negative-token", "a negative token id written into a shard",
           _edit_shard(_set_token(-5)), InvalidInput, ("token id -5 is outside [0, 500)",)),
    Damage("overlapping-occurrences", "two occurrences of a row moved onto the same cells",
           _edit_shard(_overlap), InvalidInput, ("two occurrences of a row overlap",)),
    Damage("ordinal-twice-in-a-shard", "two occurrences of a row given one ordinal (segment)",
           _edit_shard(_same_ordinal), InvalidInput, ("two occurrences share an ordinal",)),
    Damage("ordinal-out-of-range", "an ordinal beyond the occurrence count",
           _edit_shard(lambda c: c["ordinals"][0].__setitem__(0, 10**6)), InvalidInput,
           ("an ordinal lies outside 0..",)),
    Damage("ordinal-twice-across-shards", "an ordinal of shard 0 reused in shard 1 (full verify)",
           _ordinal_of_shard_0, InvalidInput,
           ("ordinals are not 0..occurrences-1 each once",),
           lambda out: load_packed(out, integrity="full")),
    Damage("provenance-range", "a provenance range one token longer than its window",
           _edit_shard(_lengthen_range),
           InvalidInput, ("a provenance range [range_start, range_end) is not its window's",)),
    Damage("row-numbers-shifted", "a shard's row numbers shifted by 2",
           _edit_shard(_shift_rows), InvalidInput,
           ("shard-0001-00001.parquet: holds first_row", "but the manifest says")),
    Damage("row-removed", "the last row of a shard removed", _edit_shard(_drop_last_row),
           InvalidInput, ("shard-0001-00001.parquet: holds rows", "but the manifest says")),
    Damage("missing-source-id", "a source id set to null",
           _edit_shard(lambda c: c["source_ids"][0].__setitem__(0, None)), InvalidInput,
           ("a value of column 'source_ids' is missing (null)",)),
    Damage("swapped-checksums-fixed", "two shards swapped, their checksums swapped too",
           _swap_with_checksums, InvalidInput,
           ("shard-0001-00000.parquet: holds first_row", "but the manifest says 0")),
    # What the format declares, each edit re-hashed and its column list fixed in the manifest.
    Damage("float-token-ids", "token ids stored as floats (1.0, 2.0, ...; were truncated)",
           _retype("tokens", pa.list_(pa.float64())), InvalidInput,
           ("column 'tokens' has type list<double>, not the format's list<int32>",)),
    Damage("int64-token-above-2**32", "token ids stored as int64, one of them 2**32 + 7",
           _retype("tokens", pa.list_(pa.int64()), _huge_token), InvalidInput,
           ("column 'tokens' has type list<int64>, not the format's list<int32>",)),
    Damage("loss-bits-dropped", "the `loss_bits` column dropped (every target would be"
           " supervised)", _retype("loss_bits", pa.binary(), drop=True), InvalidInput,
           ("shard-0001-00001.parquet: holds eligible", "but the manifest says 160")),
    Damage("pair-counts-nested", "`pair_counts` stored as lists of lists",
           _retype("pair_counts", pa.list_(pa.list_(pa.int32())),
                   lambda c: c.__setitem__("pair_counts", [[[n] for n in r]
                                                           for r in c["pair_counts"]])),
           InvalidInput, ("column 'pair_counts' has type list<list<int32>>",)),
    Damage("unknown-column", "a column the format does not declare",
           _retype("extra", pa.list_(pa.int32()),
                   lambda c: c.__setitem__("extra", c["ordinals"])), InvalidInput,
           ("column 'extra' is not a column of the packed-row format",)),
    Damage("columns-listed-wrong", "the manifest's column list of a shard edited",
           _manifest(lambda m: m["shards"][1]["columns"].remove("loss_bits")), InvalidInput,
           ("holds the columns", "but the manifest says")),
    Damage("eligible-statistic-edited", "`statistics.eligible_targets` changed",
           _manifest(_set("statistics.eligible_targets", 1000)), InvalidInput,
           ("statistics.eligible_targets is 1000 but the shards' entries give 1,487",)),
    # Edited manifests.
    Damage("shard-entry-removed", "a shard's entry removed, rows renumbered and totals fixed",
           _drop_entry(1, delete_file=False), InvalidInput,
           ("statistics.rows is 60 but the manifest's config and shards give",)),
    Damage("last-shard-removed", "the last shard and its entry removed, totals fixed",
           _drop_entry(-1, delete_file=True), InvalidInput,
           ("statistics.rows is 60 but the manifest's config and shards give",)),
    Damage("shard-listed-twice", "a shard listed twice",
           _manifest(lambda m: m["shards"].append(dict(m["shards"][1]))), InvalidInput,
           ("shard shard-0001-00001.parquet is listed twice",)),
    Damage("row-count-lie", "a shard's row count raised, first rows and totals to match",
           _manifest(_more_rows), InvalidInput,
           ("shard-0001-00001.parquet: holds rows 6 but the manifest says 8",)),
    Damage("occurrence-count-lie", "a shard's occurrence count raised, the total to match",
           _manifest(_one_more_occurrence), InvalidInput,
           ("statistics.examples is 120 but the manifest's config and shards give 121",)),
    Damage("token-count-lie", "a shard's token count lowered by one",
           _manifest(lambda m: m["shards"][0].__setitem__("tokens", m["shards"][0]["tokens"] - 1)),
           InvalidInput, ("statistics.tokens is",)),
    Damage("vocabulary-lowered", "`binding.vocab_size` lowered below the ids used",
           _manifest(_set("binding.vocab_size", 50)), InvalidInput,
           ("token id", "is outside [0, 50) (binding.vocab_size)")),
    Damage("capacity-2**40", "`config.capacity` of 2**40",
           _manifest(_set("config.capacity", 2**40)), InvalidInput,
           ("config.capacity is 1099511627776, not an integer in [1, 2,147,483,647]",)),
    Damage("capacity-infinity", "`config.capacity` of `Infinity`",
           _manifest(_set("config.capacity", float("inf"))), InvalidInput,
           ("config.capacity is inf, not an integer",)),
    Damage("capacity-lowered", "`config.capacity` lowered to 8",
           _manifest(_set("config.capacity", 8)), InvalidInput,
           ("rows of 8 cannot hold",)),
    Damage("capacity-raised", "`config.capacity` raised to 64",
           _manifest(_set("config.capacity", 64)), InvalidInput,
           ("statistics.capacity is 32 but the manifest's config and shards give 64",)),
    Damage("rows-per-call-changed", "`config.max_rows_per_batch` changed from 2 to 3",
           _manifest(_set("config.max_rows_per_batch", 3)), InvalidInput,
           ("rows, not whole model calls of 3",)),
    Damage("rows-per-call-2**40", "`config.max_rows_per_batch` of 2**40",
           _manifest(_set("config.max_rows_per_batch", 2**40)), InvalidInput,
           ("config.max_rows_per_batch is 1099511627776, not an integer",)),
    Damage("statistics-edited", "the recorded efficiency changed",
           _manifest(_set("statistics.efficiency", 0.99)), InvalidInput,
           ("statistics.efficiency is 0.99 but the manifest's config and shards give",)),
]  # fmt: skip


def run_damage(case: Damage, packed: Path, folder: Path) -> tuple[type | None, str]:
    """Damage a copy of ``packed`` in ``folder``; load it; return (error type, message)."""
    out = folder / "out"
    shutil.copytree(packed, out)
    case.damage(out)
    try:
        case.load(out)
    except ExactpackError as err:
        return type(err), str(err).replace(f"{folder}/", "")
    return None, ""


# ---------------------------------------------------------------- saved states


def _plan() -> Any:
    from exactpack.core.policies import plan_rows

    return plan_rows(np.array([3, 2, 4, 1, 6]), 6, "best-fit-decreasing")


def _plan_dict(**changes: Any) -> Callable[[Path], Any]:
    def load(folder: Path) -> Any:
        from exactpack.core.plan import Plan

        return Plan.from_dict({**_plan().to_dict(), **changes})

    return load


def _plan_file(damage: Callable[[Path], None]) -> Callable[[Path], Any]:
    def load(folder: Path) -> Any:
        from exactpack.core.plan import Plan

        _plan().save(folder / "plan.npz")
        damage(folder / "plan.npz")
        return Plan.load(folder / "plan.npz")

    return load


def _claim_huge(path: Path) -> None:
    """Rewrite ``lengths.npy`` so its header claims 2**40 entries (5 are there)."""
    import io
    import zipfile

    with zipfile.ZipFile(path) as archive:
        members = {n: archive.read(n) for n in archive.namelist()}
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": "<i8", "fortran_order": False, "shape": (2**40,)}
    )
    members["lengths.npy"] = buf.getvalue() + _plan().lengths.tobytes()
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def _stream_state(**changes: Any) -> Callable[[Path], Any]:
    def load(folder: Path) -> Any:
        from exactpack.core.stream_packer import StreamPacker

        packer = StreamPacker(8, lookahead=4, max_open_rows=2, seed=3)
        packer.push([3, 5, 2, 7, 1, 4, 6, 2, 2])
        state = json.loads(json.dumps(packer.state_dict()))
        for key, value in changes.items():
            value(state) if callable(value) else state.__setitem__(key, value)
        return StreamPacker.from_state_dict(state)

    return load


def _endless_documents():
    """A source that never ends (a generator function: every pass starts it again)."""
    k = 0
    while True:
        yield [0, 5 + k % 7, 6, 1]
        k += 1


def _dataset_state(split_id: str = "stream-a", **changes: Any) -> Callable[[Path], Any]:
    """A StreamDataset state saved one step into an endless source, edited, resumed into a
    dataset over the stream named ``split_id``."""

    def dataset(split: str) -> Any:
        from exactpack.training.stream import StreamDataset

        binding = Binding(VOCAB, "exactpack/test-ids", split)
        return StreamDataset(_endless_documents, binding=binding, max_length=8,
                             rows_per_micro_batch=1, world_size=1, rank=0, lookahead=4)  # fmt: skip

    def load(folder: Path) -> Any:
        saved = dataset("stream-a")
        next(iter(saved))
        state = json.loads(json.dumps(saved.state_dict()))
        state.update(changes)
        resumed = dataset(split_id)
        resumed.load_state_dict(state)
        return next(iter(resumed))

    return load


def _other_stream(folder: Path) -> Any:
    from exactpack.core.stream_packer import StreamPacker

    packer = StreamPacker(8, lookahead=4, stream="sha256:stream-a")
    packer.push([3, 5, 2, 7])
    return StreamPacker.from_state_dict(packer.state_dict(), stream="sha256:stream-b")


def _drop_buffered(state: dict) -> None:
    state["buffer"]["example"].pop(0)
    state["buffer"]["length"].pop(0)


def _sampler_state(**changes: Any) -> Callable[[Path], Any]:
    def load(folder: Path) -> Any:
        from exactpack.training.distributed import RowSampler, RowStats

        tokens = np.arange(1, 9, dtype=np.int64)
        sampler = RowSampler(RowStats(tokens, tokens, tokens**2.0), rows_per_micro_batch=2,
                             world_size=1, rank=0)  # fmt: skip
        return sampler.load_state_dict(sampler.state_dict() | changes)

    return load


@dataclass(frozen=True)
class StateCase:
    """A saved state damaged one way, and the refusal it must meet (``load(folder)``)."""

    name: str
    input: str
    load: Callable[[Path], Any]
    error: type[ExactpackError]
    needles: tuple[str, ...]


STATES: list[StateCase] = [
    StateCase("plan-negative-length", "a plan with a negative length",
              _plan_dict(lengths=[3, -2, 4, 1, 6]), InvalidInput,
              ("plan lengths must lie in [1, capacity 6]",)),
    StateCase("plan-zero-length", "a plan with a length of 0", _plan_dict(lengths=[3, 0, 4, 1, 6]),
              InvalidInput, ("plan lengths must lie in [1, capacity 6]",)),
    StateCase("plan-capacity-0", "a plan of capacity 0", _plan_dict(capacity=0), InvalidInput,
              ("plan capacity 0 lies outside [1, 2,147,483,647]",)),
    StateCase("plan-capacity-2**62", "a plan of capacity 2**62 (overflowed the row order)",
              _plan_dict(capacity=2**62), InvalidInput,
              ("plan capacity 4,611,686,018,427,387,904",)),
    StateCase("plan-overfull-row", "two examples placed on the same cells",
              _plan_dict(row_of=[0, 0, 0, 0, 0]), InvalidInput,
              ("two examples on the same cells",)),
    StateCase("plan-float-lengths", "float lengths (were truncated)",
              _plan_dict(lengths=[3.7, 2, 4, 1, 6]), InvalidInput,
              ("plan lengths must hold integers, got float64",)),
    StateCase("plan-file-claims-2**40", "a plan file whose header claims 2**40 lengths",
              _plan_file(_claim_huge), InvalidInput,
              ("plan.npz: not a exactpack plan (lengths claims 8,796,093,022,208 bytes",)),
    StateCase("plan-file-pickle", "a plan file that is a pickle",
              _plan_file(lambda p: p.write_bytes(b"\x80\x04\x95pickle")), InvalidInput,
              ("plan.npz: not a exactpack plan", "save it again with Plan.save")),
    StateCase("stream-huge-window", "a stream state with `window=10**10`",
              _stream_state(window=10**10), InvalidInput,
              ("window 10,000,000,000 lies outside [1, 2,147,483,647]",)),
    StateCase("stream-window-over-budget", "a stream state whose window needs 120 GB",
              _stream_state(window=2**31 - 1), BudgetExceeded,
              ("restoring the stream-best-fit state needs", "pass max_bytes=")),
    StateCase("stream-negative-rows", "a stream state with `rows_emitted=-1`",
              _stream_state(rows_emitted=-1), InvalidInput, ("rows_emitted -1 lies outside",)),
    StateCase("stream-example-removed", "a stream state with one waiting example removed",
              _stream_state(drop=_drop_buffered), InvalidInput,
              ("9 examples pushed but", "an example removed or added")),
    StateCase("stream-float-window", "a stream state with `window=4.0`",
              _stream_state(window=4.0), InvalidInput, ("window must be an integer, got 4.0",)),
    StateCase("stream-old-format", "a stream state of format /1 (no returned-example count)",
              _stream_state(format="exactpack.stream-best-fit/1"), InvalidInput,
              ("format 'exactpack.stream-best-fit/1'", "start the stream again")),
    StateCase("stream-other-stream", "a stream state resumed for another stream",
              _other_stream, BindingMismatch,
              ("saved from stream 'sha256:stream-a' but this packer packs 'sha256:stream-b'",)),
    StateCase("dataset-other-stream",
              "a StreamDataset state resumed over another stream (another split receipt)",
              _dataset_state(split_id="stream-b"), BindingMismatch,
              ("the stream-dataset state was saved from another stream (split_id 'stream-a'"
               " != 'stream-b')", "or start the stream again")),
    StateCase("dataset-docs-read-huge",
              "a StreamDataset state with `docs_read=10**15` on an endless source (was read"
              " for ever)",
              _dataset_state(docs_read=10**15), InvalidInput,
              ("the stream-dataset state's docs_read 1,000,000,000,000,000 lies outside",)),
    StateCase("sampler-float-epoch", "a sampler state with `epoch=1.5`",
              _sampler_state(epoch=1.5), InvalidInput, ("epoch must be an integer, got 1.5",)),
]  # fmt: skip


def run_state(case: StateCase, folder: Path) -> tuple[type | None, str]:
    try:
        case.load(folder)
    except ExactpackError as err:
        return type(err), str(err).replace(f"{folder}/", "")
    return None, ""
