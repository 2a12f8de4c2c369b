"""Damaged packed outputs: each one must be refused by ``load_packed`` with a clear error.

A case damages a copy of a small packed output (three or more shards) and
loads it the way a training job would. ``tests/test_integrity.py`` asserts
every case; ``tests/gen_reliability.py`` lists them in ``docs/reliability.md``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqpack import Binding, BindingMismatch, InvalidInput, PartitionMismatch, SeqpackError
from seqpack.io.readers import load_examples
from seqpack.io.store import MANIFEST, load_packed, write_packed
from seqpack.pipeline.local import pack_table

from packed_helpers import random_records, write_jsonl

VOCAB = 500


def make_packed(folder: Path) -> tuple[Path, list[dict]]:
    """A packed output of several shards (tiny shard size) and its source records."""
    records = random_records(np.random.default_rng(3), 120, vocab=VOCAB, max_len=30)
    table = load_examples(write_jsonl(folder / "data.jsonl", records), vocab_size=VOCAB)
    _, rows = pack_table(table, 32)
    write_packed(rows, folder / "out", max_rows_per_batch=2, shard_tokens=200)
    return folder / "out", records


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
    error: type[SeqpackError]
    needles: tuple[str, ...]
    load: Callable[[Path], Any] = load_packed


DAMAGES: list[Damage] = [
    Damage("bit-flip", "one bit flipped in a shard", _flip(0.5), InvalidInput,
           ("shard-00001.parquet: checksum mismatch", "pack again")),
    Damage("footer-flip", "one bit flipped in a shard's footer", _flip(0.999), InvalidInput,
           ("shard-00001.parquet: checksum mismatch",)),
    Damage("truncated", "a shard cut short by 100 bytes", _rewrite_shard(lambda b: b[:-100]),
           InvalidInput, ("shard-00001.parquet: checksum mismatch", "truncated")),
    Damage("appended", "a byte appended to a shard", _rewrite_shard(lambda b: b + b"\0"),
           InvalidInput, ("shard-00001.parquet: checksum mismatch",)),
    Damage("emptied", "a shard emptied", _rewrite_shard(lambda b: b""), InvalidInput,
           ("shard-00001.parquet: checksum mismatch",)),
    Damage("deleted", "a shard deleted", lambda out: _shard(out).unlink(), InvalidInput,
           ("shard-00001.parquet is missing", "incomplete")),
    Damage("swapped", "two shards swapped", _swap, InvalidInput,
           ("shard-00000.parquet: checksum mismatch",)),
    Damage("no-manifest", "the manifest deleted (what a killed run leaves)",
           lambda out: (out / MANIFEST).unlink(), InvalidInput,
           ("has no manifest.json: not a finished seqpack output", "run seqpack pack again")),
    Damage("manifest-not-json", "the manifest is not JSON",
           lambda out: (out / MANIFEST).write_bytes(b'{"format": \xff'), InvalidInput,
           ("manifest.json: not valid JSON", "pack again")),
    Damage("manifest-list", "the manifest is a JSON list", _manifest(lambda m: [m]),
           InvalidInput, ("holds a list, not a manifest object",)),
    Damage("manifest-version", "a manifest of another format version",
           _manifest(_set("version", 99)), InvalidInput,
           ("this seqpack reads 'seqpack.packed-rows' version 1",)),
    Damage("manifest-rows", "the manifest's row count changed", _manifest(_set("rows", 10**6)),
           InvalidInput, ("shards hold", "not 1000000")),
    Damage("manifest-sha", "a shard's recorded sha256 changed",
           _manifest(_set("shards.0.sha256", "0" * 64)), InvalidInput,
           ("shard-00000.parquet: checksum mismatch",)),
    Damage("manifest-first-row", "a shard's first row changed",
           _manifest(_set("shards.1.first_row", 1)), InvalidInput,
           ("shard shard-00001.parquet starts at an unexpected row",)),
    Damage("path-traversal", "a shard named `../data.jsonl`",
           _manifest(_set("shards.0.file", "../data.jsonl")), InvalidInput,
           ("shard file '../data.jsonl' is not a plain file name", "pack again")),
    Damage("absolute-path", "a shard named `/etc/passwd`",
           _manifest(_set("shards.0.file", "/etc/passwd")), InvalidInput,
           ("shard file '/etc/passwd' is not a plain file name",)),
    Damage("no-binding", "the binding removed from the manifest",
           _manifest(lambda m: m.pop("binding") and None), InvalidInput,
           ("malformed manifest", "'binding'")),
    Damage("bad-counts", "a shard's row count is a string",
           _manifest(_set("shards.0.rows", "many")), InvalidInput, ("non-integer counts",)),
    Damage("zero-capacity", "capacity 0 in the manifest",
           _manifest(_set("config.capacity", 0)), InvalidInput,
           ("config values must be positive",)),
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
           lambda out: None, PartitionMismatch,
           ("holds partition 'train', not 'validation'", "load the validation output"),
           lambda out: load_packed(out, expected_partition="validation")),
    Damage("temporary-folder", "a killed run's hidden folder (it has a manifest)",
           lambda out: None, InvalidInput, ("temporary folder of a seqpack run",),
           lambda out: load_packed(out.rename(out.with_name(".out.seqpack-tmp-h-1-0123abcd")))),
    Damage("unverified-truncated", "a truncated shard read with `verify=False`",
           _rewrite_shard(lambda b: b[:-100]), InvalidInput,
           ("shard-00001.parquet: cannot read the shard", "pack again"),
           lambda out: load_packed(out, verify=False).shard_rows(1)),
]  # fmt: skip


def run_damage(case: Damage, packed: Path, folder: Path) -> tuple[type | None, str]:
    """Damage a copy of ``packed`` in ``folder``; load it; return (error type, message)."""
    out = folder / "out"
    shutil.copytree(packed, out)
    case.damage(out)
    try:
        case.load(out)
    except SeqpackError as err:
        return type(err), str(err).replace(f"{folder}/", "")
    return None, ""
