"""The manifest schema (msgspec, :mod:`exactpack.io.integrity`) against hostile JSON.

Run as a script (``python tests/test_manifest_schema.py PACKED``) it writes
each hostile ``manifest.json`` into ``PACKED`` in turn, loads it the way a
training job does and prints one JSON line per case: ``ok`` or the error's
type and message. The test runs it in a child process, so a crash of the
decoder (a segfault, a stack overflow) fails the test instead of killing it,
and then holds every outcome to the contract: loaded unchanged, or one
:class:`~exactpack.InvalidInput` line naming ``manifest.json`` and the fix.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import numpy as np

DEEP = b"[" * 200_000 + b"]" * 200_000


def _cases(good: bytes) -> dict[str, bytes]:
    """Hostile manifests made from the good one's bytes."""
    m = json.loads(good)
    rows, cap = str(m["rows"]).encode(), str(m["config"]["capacity"]).encode()
    file = m["shards"][0]["file"].encode()

    def put(old: bytes, new: bytes) -> bytes:
        assert old in good, old
        return good.replace(old, new, 1)

    return {
        "deep-value": put(b'"config": {', b'"x": ' + DEEP + b', "config": {'),
        "deep-object": put(b'"config": {', b'"config": ' + b'{"a": ' * 100_000 + b"1"
                           + b"}" * 100_000 + b', "y": {'),
        "deep-top": DEEP,
        "int-5000-digits": put(b'"rows": ' + rows, b'"rows": ' + b"9" * 5000),
        "int-2**64": put(b'"rows": ' + rows, b'"rows": 18446744073709551616'),
        "int-negative": put(b'"rows": ' + rows, b'"rows": -1'),
        "float-1e400": put(b'"capacity": ' + cap, b'"capacity": 1e400'),
        "nan": put(b'"capacity": ' + cap, b'"capacity": NaN'),
        "minus-infinity": put(b'"rows": ' + rows, b'"rows": -Infinity'),
        "bad-utf8-value": put(b'"partition": "train"', b'"partition": "tr\xffain"'),
        "bad-utf8-key": put(b'"rows":', b'"\xff": 1, "rows":'),
        "utf16": good.decode().encode("utf-16"),
        "lone-surrogate": put(b'"' + file + b'"', b'"\\ud800' + file + b'"'),
        "duplicate-key-last-wrong": put(b'"rows": ' + rows, b'"rows": ' + rows + b', "rows": 7'),
        "duplicate-key-last-right": put(b'"rows": ' + rows, b'"rows": 7, "rows": ' + rows),
        "huge-file-name": put(b'"' + file + b'"', b'"' + b"x" * (8 << 20) + b'"'),
        "huge-key": put(b'"rows":', b'"' + b"k" * (8 << 20) + b'": 1, "rows":'),
        "null": b"null",
        "string": b'"manifest"',
        "empty": b"",
        "bom": b"\xef\xbb\xbf" + good,
        "trailing-value": good + b" {}",
        "shards-object": put(b'"shards": [', b'"shards": {"a": [') + b"}",
        "entry-null": put(b'"shards": [', b'"shards": [null, '),
        "statistics-list": put(b'"statistics": {', b'"statistics": [{') + b"]"
        if b'"statistics": {' not in good else good.replace(b'"statistics": {', b'"s0": {', 1)
        .replace(b'"rows": ' + rows, b'"statistics": [], "rows": ' + rows, 1),
    }  # fmt: skip


def main(folder: Path) -> None:
    from exactpack import ExactpackError
    from exactpack.io.store import load_packed

    good = (folder / "manifest.json").read_bytes()
    for name, data in _cases(good).items():
        (folder / "manifest.json").write_bytes(data)
        try:
            for _ in load_packed(folder):
                pass
            outcome = {"ok": True}
        except ExactpackError as err:
            outcome = {"error": type(err).__name__, "message": str(err)}
        print(json.dumps({"case": name, **outcome}), flush=True)
    (folder / "manifest.json").write_bytes(good)


def test_hostile_manifests_are_one_clear_line_and_never_a_crash(tmp_path):
    from exactpack.pipeline.local import pack_path

    from support.packed_helpers import random_records, write_jsonl

    records = random_records(np.random.default_rng(3), 40, vocab=300, max_len=20)
    data = write_jsonl(tmp_path / "d.jsonl", records)
    pack_path(data, tmp_path / "out", max_length=32, vocab_size=300, max_rows_per_batch=2,
              shard_tokens=200)  # fmt: skip
    run = subprocess.run(
        [sys.executable, __file__, str(tmp_path / "out")], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]  # no crash, no uncaught exception
    got = {r["case"]: r for r in map(json.loads, run.stdout.splitlines())}
    assert set(got) == set(_cases((tmp_path / "out" / "manifest.json").read_bytes()))
    # as before: the json module keeps the last value and reads UTF-16 or a BOM too
    loads = {"duplicate-key-last-right", "utf16", "bom", "huge-key"}  # unknown keys: ignored
    for name, r in got.items():
        if name in loads:
            assert r.get("ok"), r
            continue
        assert r.get("error") == "InvalidInput", r
        message = r["message"]
        assert "\n" not in message and len(message) < 1000, (name, message[:300])
        if name == "lone-surrogate":  # a plain name no file has: the file is missing
            assert "is missing — the packed directory is incomplete" in message, message
            continue
        assert "manifest.json: " in message and "pack again" in message, (name, message)
    needles = {
        "deep-value": "not valid JSON",
        "int-5000-digits": "not valid JSON",
        "int-2**64": "rows is 18446744073709551616, not an integer in [0, ",
        "int-negative": "rows is -1, not an integer",
        "float-1e400": "config.capacity is inf, not an integer in [1, 2,147,483,647]",
        "nan": "config.capacity is nan, not an integer",
        "minus-infinity": "rows is -inf, not an integer",
        "bad-utf8-value": "not valid JSON",
        "huge-file-name": "of length <= 255",
        "duplicate-key-last-wrong": "shards hold",
        "null": "holds a NoneType, not a manifest object",
        "entry-null": "shards[0] is None, not `object`",
        "shards-object": "shards is {",
        "statistics-list": "statistics is [], not `object | null`",
    }
    for name, needle in needles.items():
        assert needle in got[name]["message"], (name, got[name]["message"])


def test_msgspec_keeps_the_last_duplicate_key_so_json_lines_keep_their_scanner():
    """Why input records are not decoded by msgspec: it keeps the last of two equal keys
    and bounds nesting only by the interpreter's recursion limit, while a JSON line with a
    key twice or nested over 64 deep must be refused by line (io/jsonl.py does that)."""
    assert msgspec.json.decode(b'{"input_ids": [1], "input_ids": [2]}') == {"input_ids": [2]}
    assert msgspec.json.decode(b"[" * 500 + b"]" * 500) is not None  # 500 deep: accepted


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parents[1]))
    main(Path(sys.argv[1]))
