"""JSON Lines (and JSON array) files as Arrow tables, with errors by line.

Arrow's JSON reader is fast but not safe on hostile bytes: pyarrow 26 crashes
the process (no exception) on a file whose first record is ``null``, on
arrays nested a few thousand deep, and takes invalid UTF-8 into column names.
:func:`read_jsonl` therefore scans every line first, vectorised over chunks
of :data:`SCAN_CHUNK` bytes (about a quarter of Arrow's own reading time):
UTF-8 text, one JSON object per line, nested at most :data:`MAX_JSON_DEPTH`
levels. When Arrow still refuses a file, or a column has the wrong type,
:func:`first_bad_line` re-reads it with the json module to name the line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

from seqpack.core.errors import InvalidInput

#: Deepest JSON nesting a record may have (seqpack's columns need 2).
MAX_JSON_DEPTH = 64
#: Bytes per step of the line-shape scan that runs before Arrow reads JSON Lines.
SCAN_CHUNK = 1 << 23


#: What each column's list items must be in a JSON line, and the fix, for error messages.
_JSON_ITEMS = {
    "input_ids": "integers (token ids below 2**31)",
    "labels": "integers (token ids, or -100 for no loss)",
    "loss_mask": "booleans or 0/1",
}
_FIXES = {
    "input_ids": "write the ids your tokenizer made as JSON integers, or give text and --tokenizer",
    "labels": "write each label as the token itself or -100",
    "loss_mask": "give one true/false (or 1/0) per token or per target",
    "id": "use a string or an integer id",
}
_INT64 = 2**63


def _json_kind(value: Any, key: str) -> str | None:
    """'integer', 'boolean', 'string' or 'invalid' for one decoded field (None if absent)."""
    if value is None:
        return None
    if key == "id":
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            return "invalid"
        return "string" if isinstance(value, str) else "integer"
    if not isinstance(value, list):
        return "invalid"
    if key == "loss_mask" and value and all(isinstance(v, bool) for v in value):
        return "boolean"
    if all(isinstance(v, int) and not isinstance(v, bool) and -_INT64 <= v < _INT64 for v in value):
        if key == "loss_mask" and any(v not in (0, 1) for v in value):
            return "invalid"
        return "integer" if value else None
    return "invalid"


def _check_record(
    where: str, obj: Any, seen: dict[str, str], unit: str = "lines"
) -> InvalidInput | None:
    """Shape and column types of one decoded record; ``seen`` holds earlier records' kinds."""
    if not isinstance(obj, dict):
        return _not_object(where, obj)
    for key in ("input_ids", "labels", "loss_mask", "id"):
        kind = _json_kind(obj.get(key), key)
        if kind is None:
            continue
        if kind == "invalid":
            value = obj[key]
            if key == "id":
                shape = "a string or an integer"
            elif isinstance(value, list):
                shape = _JSON_ITEMS[key]
            else:
                shape = f"a list of {_JSON_ITEMS[key]}"
            got = _excerpt(value)
            return InvalidInput(f"{where}: {key} must be {shape}, got {got} — {_FIXES[key]}")
        if seen.setdefault(key, kind) != kind:
            return InvalidInput(
                f"{where}: {key} holds {kind} values but earlier {unit} hold {seen[key]}"
                f" — use one type in every {unit[:-1]}"
            )
    return None


def first_bad_line(path: Path) -> InvalidInput | None:
    """The first line of a JSON Lines file the json module finds wrong, or None."""
    seen: dict[str, str] = {}
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path} line {number}"
            try:
                obj = json.loads(line.decode("utf-8"), object_pairs_hook=_unique_keys)
            except RecursionError:
                return _too_deep(where)
            except _DuplicateKey as err:
                return InvalidInput(f"{where}: key {err.args[0]!r} appears twice — keep one")
            except ValueError as err:
                return _not_json(where, err)
            if (found := _check_record(where, obj, seen)) is not None:
                return found
    return None


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        keys = [k for k, _ in pairs]
        raise _DuplicateKey(next(k for k in keys if keys.count(k) > 1))
    return out


def _excerpt(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _diagnose_jsonl(path: Path, err: Exception) -> InvalidInput:
    """Find the first bad line with the json module (only after Arrow failed)."""
    return first_bad_line(path) or InvalidInput(f"{path}: cannot read as JSON Lines ({err})")


def _depth(value: Any) -> int:
    """Nesting depth of a decoded JSON value (iterative: no recursion limit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, level)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)
    return deepest


def _not_json(where: str, err: ValueError) -> InvalidInput:
    if isinstance(err, json.JSONDecodeError):
        what = f"not valid JSON ({err.msg}, column {err.colno})"
    elif isinstance(err, UnicodeDecodeError):
        what = f"not UTF-8 text (byte {err.object[err.start]:#04x})"
    else:
        what = f"not JSON text ({err})"
    return InvalidInput(f"{where}: {what} — write one JSON object per line, UTF-8 encoded")


def _not_object(where: str, value: Any) -> InvalidInput:
    kinds = {type(None): "null", bool: "boolean", int: "number", float: "number", str: "string"}
    return InvalidInput(
        f"{where}: is a {kinds.get(type(value), 'list')}, not a JSON object — write one JSON"
        " object per line"
    )


def _too_deep(where: str) -> InvalidInput:
    return InvalidInput(
        f"{where}: JSON nested more than {MAX_JSON_DEPTH} levels deep — seqpack reads flat"
        " records (lists of token ids); flatten the data"
    )


def _check_line(path: Path, line: bytes, number: int) -> None:
    """Exact check of one suspicious line: an object, valid JSON, not nested too deeply."""
    where = f"{path} line {number}"
    text = line.strip()
    if number == 1 and text.startswith(b"\xef\xbb\xbf"):
        text = text[3:].lstrip()
    if not text:
        return
    try:
        value = json.loads(text.decode("utf-8"))
    except RecursionError:
        raise _too_deep(where) from None
    except ValueError as err:  # UnicodeDecodeError included
        raise _not_json(where, err) from None
    if not isinstance(value, dict):
        raise _not_object(where, value)
    if _depth(value) > MAX_JSON_DEPTH:
        raise _too_deep(where)


_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b"[]{}\n")
_STEP = np.zeros(256, dtype=np.int32)
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1


def _scan_chunk(path: Path, chunk: bytes, first_line: int) -> int:
    """Vectorised shape check of whole lines ``chunk``; suspicious lines get :func:`_check_line`.

    The bytes must be UTF-8 (Arrow takes invalid bytes into column names). A
    line must start with ``{``; its bracket depth, counted without regard to
    strings (an over-estimate), must stay within :data:`MAX_JSON_DEPTH`.
    Returns the number of newlines in ``chunk``.
    """
    if not chunk.isascii():
        try:
            chunk.decode("utf-8")
        except UnicodeDecodeError as err:
            number = first_line + chunk.count(b"\n", 0, err.start)
            raise _not_json(f"{path} line {number}", err) from None
    data = np.frombuffer(chunk, dtype=np.uint8)
    ends = np.flatnonzero(data == 10)
    starts = np.concatenate(([0], ends + 1))
    bounds = np.append(ends, data.shape[0])
    keep = starts < data.shape[0]
    suspicious = set(np.flatnonzero(keep & (data[np.minimum(starts, data.shape[0] - 1)] != 123)))
    kept = np.frombuffer(chunk.translate(None, _NOT_STRUCTURE), dtype=np.uint8)
    if kept.size:
        depth = np.cumsum(_STEP[kept], dtype=np.int32)
        newline = kept == 10
        index = np.arange(kept.shape[0], dtype=np.int32)
        last = np.maximum.accumulate(np.where(newline, index, -1))
        local = depth - np.where(last >= 0, depth[np.maximum(last, 0)], 0)
        deep = np.flatnonzero(local > MAX_JSON_DEPTH)
        if deep.size:
            lines = np.cumsum(newline, dtype=np.int32) - newline
            suspicious.update(np.unique(lines[deep]).tolist())
    for i in sorted(suspicious):
        _check_line(path, chunk[starts[i] : bounds[i]], first_line + int(i))
    return int(ends.shape[0])


def _check_jsonl_shape(path: Path) -> None:
    """Refuse, by line, what Arrow's JSON reader cannot survive.

    pyarrow's reader crashes the process (no exception) on a file whose
    first record is ``null`` and on arrays nested a few thousand deep, so
    every line is checked first: it must be a JSON object nested at most
    :data:`MAX_JSON_DEPTH` levels. Chunks of :data:`SCAN_CHUNK` bytes.
    """
    line, rest = 1, b""
    with path.open("rb") as f:
        while True:
            block = f.read(SCAN_CHUNK)
            buf = rest + block
            cut = buf.rfind(b"\n") + 1 if block else len(buf)
            if cut:
                line += _scan_chunk(path, buf[:cut], line)
            rest = buf[cut:]
            if not block:
                return


def _read_json_array(path: Path) -> pa.Table:
    try:
        rows = json.loads(path.read_bytes())
    except json.JSONDecodeError as e:
        raise InvalidInput(f"{path} line {e.lineno}: not valid JSON ({e.msg})") from None
    except RecursionError:
        raise _too_deep(str(path)) from None
    except ValueError as e:  # not UTF-8 (or UTF-16/32) text
        raise InvalidInput(f"{path}: not JSON text ({e}) — save it as UTF-8") from None
    if not isinstance(rows, list):
        raise InvalidInput(f"{path}: a .json file must hold a list of objects or JSON Lines")
    if not rows:
        raise InvalidInput(f"{path} holds an empty list: no rows — nothing to pack")
    seen: dict[str, str] = {}
    for i, row in enumerate(rows):
        if (found := _check_record(f"{path} row {i}", row, seen, "rows")) is not None:
            raise found
        if _depth(row) > MAX_JSON_DEPTH:
            raise _too_deep(f"{path} row {i}")
    try:
        return pa.Table.from_pylist(rows)
    except (pa.ArrowException, OverflowError) as err:
        raise InvalidInput(
            f"{path}: inconsistent rows ({err}) — give a column one type in every row"
        ) from None


def read_json(path: Path) -> tuple[pa.Table, str]:
    """A JSON Lines file or one JSON array of objects, and how its rows are named.

    The unit is ``"line"`` for JSON Lines (errors name file lines) and
    ``"row"`` for an array (errors name the array index).
    """
    head = _first_byte(path)
    if not head:
        raise InvalidInput(f"{path} is empty: it holds no rows — nothing to pack")
    if head == b"[":
        return _read_json_array(path), "row"
    return read_jsonl(path), "line"


def _first_byte(path: Path) -> bytes:
    """The first byte that is not whitespace (nor a UTF-8 byte-order mark); b"" if none."""
    with path.open("rb") as f:
        head = f.read(3)
        if head != b"\xef\xbb\xbf":
            f.seek(0)
        while block := f.read(1 << 16):
            if text := block.lstrip():
                return text[:1]
    return b""


def read_jsonl(path: Path) -> pa.Table:
    """A JSON Lines file as an Arrow table (one row per line; blank lines skipped)."""
    _check_jsonl_shape(path)
    block = int(min(max(path.stat().st_size + 1, 1 << 20), 1 << 28))
    try:
        table = pajson.read_json(path, read_options=pajson.ReadOptions(block_size=block))
        table.validate(full=True)  # the reader can build invalid arrays (lists of nulls)
    except pa.ArrowException as err:
        raise _diagnose_jsonl(path, err) from None
    return table
