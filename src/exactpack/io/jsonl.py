"""JSON Lines (and JSON array) files as Arrow tables, chunk by chunk, with errors by line.

:func:`iter_jsonl` reads whole lines in blocks; :func:`scan_block` checks each (UTF-8,
one JSON object a line, at most :data:`MAX_JSON_DEPTH` deep) before Arrow's JSON reader,
unsafe on hostile bytes, sees it. Where Arrow refuses a block or a column has the wrong
type, :func:`first_bad_line` names the first bad line (the json module)::

    {"input_ids": [0, 5, 1]}            msgspec: one object, 2 brackets <= 64
    {"text": "[[[[ ... [[[["}           65+ brackets: the json module measures the depth
"""

from __future__ import annotations

import codecs
import contextlib
import json
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

from exactpack.core.errors import InvalidInput
from exactpack.io.files import InputStream, ReadLimits, open_stream, reopen

__all__ = [
    "JSON_ARRAY_LIMIT",
    "JSON_SPACE",
    "MAX_JSON_DEPTH",
    "MAX_LINE_BYTES",
    "first_bad_line",
    "iter_jsonl",
    "read_json_array",
    "read_jsonl",
]

#: The longest JSON line read (a document of this many bytes is refused, not buffered).
MAX_LINE_BYTES = 1 << 30
#: The largest ``.json`` array file read (it must be parsed whole; JSON Lines stream).
JSON_ARRAY_LIMIT = 1 << 26
#: Deepest JSON nesting a record may have (exactpack's columns need 2).
MAX_JSON_DEPTH = 64
#: The bytes JSON counts as whitespace (Arrow skips lines holding only these).
JSON_SPACE = b" \t\r\n"
#: Bytes decoded at a time when a block is checked to be UTF-8.
_UTF8_PIECE = 1 << 22
#: One line as one object, its values checked as JSON but not decoded.
_RECORD = msgspec.json.Decoder(dict[str, msgspec.Raw])


def depth(value: Any) -> int:
    """Nesting depth of a decoded JSON value (iterative: no recursion limit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, level)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)
    return deepest


def not_json(
    where: str, err: ValueError, fix: str = "write one JSON object per line, UTF-8 encoded"
) -> InvalidInput:
    if isinstance(err, json.JSONDecodeError):
        what = f"not valid JSON ({err.msg}, column {err.colno})"
    elif isinstance(err, UnicodeDecodeError):
        what = f"not UTF-8 text (byte {err.object[err.start]:#04x})"
    else:
        what = f"not JSON text ({err})"
    return InvalidInput(f"{where}: {what} — {fix}")


#: A decoded JSON value's kind, for messages.
_JSON_TYPES = {type(None): "a null", bool: "a boolean", int: "a number", float: "a number",
               str: "a string", list: "a list", dict: "an object"}  # fmt: skip


def not_object(where: str, value: Any) -> InvalidInput:
    return InvalidInput(
        f"{where}: is {_JSON_TYPES[type(value)]}, not a JSON object — write one JSON object per"
        " line"
    )


def too_deep(where: str) -> InvalidInput:
    return InvalidInput(
        f"{where}: JSON nested more than {MAX_JSON_DEPTH} levels deep — exactpack reads flat"
        " records (lists of token ids); flatten the data"
    )


def check_line(path: Path, line: bytes, number: int, hook: Any = None) -> dict[str, Any] | None:
    """One line exactly: None if blank, else the object (nested at most
    :data:`MAX_JSON_DEPTH` deep) or :class:`InvalidInput`; ``hook``: ``object_pairs_hook``."""
    where = f"{path} line {number}"
    text = line.strip(JSON_SPACE)
    if number == 1 and text.startswith(b"\xef\xbb\xbf"):
        text = text[3:].lstrip(JSON_SPACE)
    if not text:
        return None
    try:
        value = json.loads(text.decode("utf-8"), object_pairs_hook=hook)
    except RecursionError:
        raise too_deep(where) from None
    except DuplicateKey as err:
        raise InvalidInput(f"{where}: key {err.args[0]!r} appears twice — keep one") from None
    except ValueError as err:  # UnicodeDecodeError included; "Extra data": two values
        raise not_json(where, err) from None
    if not isinstance(value, dict):
        raise not_object(where, value)
    if depth(value) > MAX_JSON_DEPTH:
        raise too_deep(where)
    return value


def _check_utf8(path: Path, block: memoryview, data: np.ndarray, first_line: int) -> None:
    """Refuse bytes that are not UTF-8 (neither Arrow nor msgspec's raw values check)."""
    if not data.size or int(data.max()) < 0x80:
        return
    decoder = codecs.getincrementaldecoder("utf-8")()
    for lo in range(0, data.shape[0], _UTF8_PIECE):
        pending = len(decoder.getstate()[0])
        try:
            decoder.decode(block[lo : lo + _UTF8_PIECE], final=lo + _UTF8_PIECE >= data.shape[0])
        except UnicodeDecodeError as err:
            pos = max(lo - pending + err.start, 0)
            number = first_line + int(np.count_nonzero(data[:pos] == 10))
            raise not_json(f"{path} line {number}", err) from None


def scan_block(
    path: Path, block: memoryview, first_line: int, names: set[str], max_keys: int
) -> tuple[int, int, set[str]]:
    """Check every line of ``block`` (whole lines, from line ``first_line``): msgspec, or
    :func:`check_line` for a line it refuses or with over :data:`MAX_JSON_DEPTH` brackets.
    ``names`` (the file's keys so far) takes the block's; over ``max_keys`` is refused.
    Returns ``(records, newlines, keys)``: object lines, newlines, the block's keys.
    """
    data = np.frombuffer(block, dtype=np.uint8)
    _check_utf8(path, block, data, first_line)
    breaks = np.flatnonzero(data == 10)
    opened = np.searchsorted(breaks, np.flatnonzero((data == ord("[")) | (data == ord("{"))))
    deep = MAX_JSON_DEPTH  # ``opened`` is sorted: a line opening more repeats ``deep`` on
    crowded = set(np.unique(opened[deep:][opened[deep:] == opened[:-deep]]).tolist())
    records, keys, lines = 0, set(), bytes(block).split(b"\n")
    for i in np.flatnonzero(np.diff(breaks, prepend=-1, append=data.shape[0]) > 1).tolist():
        line, number = lines[i], first_line + i
        if not line.strip(JSON_SPACE):  # blank: no record (Arrow skips it too)
            continue
        try:
            record = check_line(path, line, number) if i in crowded else _RECORD.decode(line)
        except msgspec.DecodeError:  # not an object, BOM, NaN: the json module says
            record = check_line(path, line, number)
        if record is None:
            continue
        records, known = records + 1, len(keys)
        keys.update(record)
        if len(keys) > known and len(names) + len(keys - names) > max_keys:
            raise InvalidInput(
                f"{path} line {number}: more than {max_keys:,} distinct keys in one file (a"
                " column per key for every line) — keep the columns exactpack reads and drop the"
                " others, or move per-row data into one value"
            )
    names.update(keys)
    return records, int(breaks.shape[0]), keys


#: What each column's list items must be in a JSON line, and the fix, for error messages.
_JSON_ITEMS = {
    "input_ids": "integers (token ids below 2**31)",
    "labels": "integers (token ids, or -100 for no loss)",
    "loss_mask": "booleans or 0/1",
    "completion_mask": "booleans or 0/1",
    "assistant_masks": "booleans or 0/1",
}
_FIXES = {
    "input_ids": "write the ids your tokenizer made as JSON integers, or give text and --tokenizer",
    "labels": "write each label as the token itself or -100",
    "loss_mask": "give one true/false (or 1/0) per token or per target",
    "completion_mask": "give one 1/0 per token of input_ids (1 = completion)",
    "assistant_masks": "give one 1/0 per token of input_ids (1 = assistant)",
    "id": "use a string or an integer id",
}
_INT64 = 2**63
#: Columns of one flag per token (or target): booleans or 0/1.
FLAGS = ("loss_mask", "completion_mask", "assistant_masks")


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
    if key in FLAGS and value and all(isinstance(v, bool) for v in value):
        return "boolean"
    if all(isinstance(v, int) and not isinstance(v, bool) and -_INT64 <= v < _INT64 for v in value):
        if key in FLAGS and any(v not in (0, 1) for v in value):
            return "invalid"
        return "integer" if value else None
    return "invalid"


def check_record(
    where: str, obj: Any, seen: dict[str, str], unit: str = "lines"
) -> InvalidInput | None:
    """Shape and column types of one decoded record; ``seen`` holds earlier records' kinds."""
    if not isinstance(obj, dict):
        return not_object(where, obj)
    for key in (*_JSON_ITEMS, "id"):
        kind = _json_kind(obj.get(key), key)
        if kind is None:
            continue
        if kind == "invalid":
            value = obj[key]
            shape = _JSON_ITEMS.get(key, "a string or an integer")
            if key != "id" and not isinstance(value, list):
                shape = f"a list of {shape}"
            got = excerpt(value)
            return InvalidInput(f"{where}: {key} must be {shape}, got {got} — {_FIXES[key]}")
        if seen.setdefault(key, kind) != kind:
            return InvalidInput(
                f"{where}: {key} holds {kind} values but earlier {unit} hold {seen[key]}"
                f" — use one type in every {unit[:-1]}"
            )
    return None


def first_bad_line(path: Path) -> InvalidInput | None:
    """The first line the json module finds wrong, or None (also if it cannot be reread)."""
    stream = reopen(path)
    if stream is None:
        return None
    with stream:
        return first_bad_in(path, file_lines(stream, path), 1)


def first_bad_in(path: Path, lines: Iterable[bytes], first_line: int) -> InvalidInput | None:
    """The first of ``lines`` (numbered from ``first_line``) the json module finds wrong."""
    seen: dict[str, str] = {}
    for number, line in enumerate(lines, first_line):
        try:
            obj = check_line(path, line, number, unique_keys)
        except InvalidInput as err:
            return err
        if obj is None:
            continue
        where = f"{path} line {number}"
        if (found := check_record(where, obj, seen)) is not None:
            return found
        if (found := lone_surrogate(where, obj)) is not None:
            return found
    return None


def lone_surrogate(where: str, obj: dict[str, Any]) -> InvalidInput | None:
    """The refusal of the first field of ``obj`` holding an unpaired surrogate, or None."""
    for key, value in obj.items():
        text = json.dumps([key, value], ensure_ascii=False)
        if any("\ud800" <= ch <= "\udfff" for ch in text):
            return InvalidInput(
                f"{where}: {key!r} holds an unpaired surrogate escape (a lone \\ud800-\\udfff)"
                " — it is not a Unicode character, so the text cannot be read as UTF-8;"
                f" fix the writer (escape whole characters) or drop the {where.split()[-2]}"
            )
    return None


class DuplicateKey(Exception):
    pass


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        keys = [k for k, _ in pairs]
        raise DuplicateKey(next(k for k in keys if keys.count(k) > 1))
    return out


def excerpt(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def duplicate_row(data: bytes) -> str:
    """`` row N`` of the array where a key appears twice in one object (only on the error
    path: each row decoded alone)."""
    with contextlib.suppress(msgspec.DecodeError, RecursionError):
        rows = msgspec.json.decode(data.removeprefix(b"\xef\xbb\xbf"), type=list[msgspec.Raw])
        for i, row in enumerate(rows):
            try:
                json.loads(bytes(row), object_pairs_hook=unique_keys)
            except DuplicateKey:
                return f" row {i}"
    return ""


def line_blocks(f: BinaryIO | InputStream, size: int, path: Path) -> Iterator[memoryview]:
    """Whole lines of ``f`` in blocks of about ``size`` bytes (the last may lack a newline),
    linear in the file size; a line over :data:`MAX_LINE_BYTES` or a NUL byte is refused
    as soon as it is read."""
    carry, carried, line = [], 0, 1
    charge = getattr(f, "charge_lines", None)  # a compressed file counts its lines as read
    while True:
        block = f.read(size)
        if charge is not None:  # "\r" ends a text line too (universal newlines)
            charge(block.count(b"\n") + block.count(b"\r"))
        if not block:
            if carried:
                yield memoryview(b"".join(carry))
            return
        if (nul := block.find(b"\0")) >= 0:  # neither JSON nor text: refused as it is read
            line += block.count(b"\n", 0, nul)
            raise InvalidInput(
                f"{path} line {line}: holds a NUL byte — not a text"
                " or JSON file; pass the file's text, or its data in a Parquet file"
            )
        cut = block.rfind(b"\n") + 1
        if not cut:
            carry.append(block)
            carried += len(block)
            if carried > MAX_LINE_BYTES:
                raise InvalidInput(
                    f"{path} line {line}: longer than {MAX_LINE_BYTES:,} bytes without a newline"
                    " — one JSON object per line; split the file into lines"
                )
            continue
        head = memoryview(block)[:cut]
        whole = memoryview(b"".join([*carry, head])) if carry else head
        line += block.count(b"\n", 0, cut)  # the carried parts hold none
        yield whole
        carry = [block[cut:]] if cut < len(block) else []
        carried = len(block) - cut


def file_lines(f: BinaryIO | InputStream, path: Path) -> Iterator[bytes]:
    """The lines of ``f`` without their newlines (only on error paths: 1 MiB reads)."""
    for block in line_blocks(f, 1 << 20, path):
        lines = bytes(block).split(b"\n")
        yield from lines if lines[-1] else lines[:-1]


def _parse(path: Path, block: memoryview, used: Collection[str], first_line: int) -> pa.Table:
    """One scanned block as an Arrow table (types inferred from all its lines). A block
    Arrow refuses but the json module does not is read by :func:`_parse_lines`: a
    column not in ``used`` with mixed types is kept as nulls (its name still checked)."""
    try:
        table = pajson.read_json(
            pa.BufferReader(pa.py_buffer(block)),
            read_options=pajson.ReadOptions(block_size=len(block) + 1, use_threads=False),
        )
        table.validate(full=True)  # the reader can build invalid arrays (lists of nulls)
    except pa.ArrowException:
        found = first_bad_in(path, bytes(block).split(b"\n"), first_line)
        if found is not None:
            raise found from None
        return _parse_lines(path, block, used, first_line)
    return table


def _mixed(path: Path, key: str, values: list[tuple[int, Any]]) -> InvalidInput:
    """The line where ``key`` stops having one Arrow type: a value that is no Arrow array
    alone (``[1, true]``), else the first whose JSON type differs from the first line's."""
    for n, value in values:
        try:
            pa.array([value])
        except (pa.ArrowException, OverflowError):
            return InvalidInput(
                f"{path} line {n}: {key} mixes types inside one value ({excerpt(value)})"
                f" — give {key} one type in every line"
            )
    kinds = [(n, _JSON_TYPES.get(type(v), "a value")) for n, v in values if v is not None]
    n, kind = next(((n, k) for n, k in kinds if k != kinds[0][1]), kinds[-1])
    return InvalidInput(
        f"{path} line {n}: {key} holds {kind} where line {kinds[0][0]} holds"
        f" {kinds[0][1]} — give {key} one type in every line"
    )


def _parse_lines(path: Path, block: memoryview, used: Collection[str], first_line: int) -> pa.Table:
    """``block`` through the json module, one Arrow array per key (see :func:`_parse`)."""
    lines = enumerate(bytes(block).split(b"\n"), first_line)
    numbered = [(n, obj) for n, line in lines if (obj := check_line(path, line, n)) is not None]
    rows = [row for _, row in numbered]
    keys = list(dict.fromkeys(k for row in rows for k in row))
    columns = {}
    for key in keys:
        try:
            columns[key] = pa.array([row.get(key) for row in rows])
        except (pa.ArrowException, OverflowError):
            if key in used:
                raise _mixed(path, key, [(n, r[key]) for n, r in numbered if key in r]) from None
            columns[key] = pa.nulls(len(rows))  # never read: kept by name only
    if not columns:  # every line is {}: keep the row count with no column
        return pa.table({"_": pa.nulls(len(rows))}).drop(["_"])
    return pa.table(columns)


def _check_kinds(path: Path, table: pa.Table, seen: dict[str, str]) -> None:
    """``id`` and the flag columns keep one Arrow type between blocks (the json module
    names the line where they do not)."""
    for name in {"id", *FLAGS} & set(table.column_names):
        kind = _arrow_kind(table.schema.field(name).type)
        if kind is not None and seen.setdefault(name, kind) != kind:
            raise first_bad_line(path) or InvalidInput(
                f"{path}: {name} holds {kind} values but earlier lines hold {seen[name]}"
                " — use one type in every line"
            )


def _arrow_kind(kind: pa.DataType) -> str | None:
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        kind = kind.value_type
    if pa.types.is_integer(kind):
        return "integer"
    return {"bool": "boolean", "string": "string", "large_string": "string"}.get(str(kind))


def iter_jsonl(
    f: BinaryIO | InputStream,
    path: Path,
    chunk_bytes: int,
    used: Collection[str] = (),
    limits: ReadLimits | None = None,
) -> Iterator[tuple[pa.Table, int]]:
    """The JSON Lines file ``f`` (named ``path``) as ``(table, bytes consumed)`` of about
    ``chunk_bytes`` each, one row per non-blank line (blank blocks: an empty table).
    ``used``: the columns read (mixed types there are an error; elsewhere, nulls).
    :class:`InvalidInput` names the first bad line; a block is refused before Arrow
    parses it past ``limits.json_keys`` keys or 4 null cells a byte."""
    limits = limits or ReadLimits()
    line = 1
    kinds: dict[str, str] = {}
    names: set[str] = set()
    for block in line_blocks(f, chunk_bytes, path):
        records, newlines, keys = scan_block(path, block, line, names, limits.json_keys)
        if not records:
            yield pa.table({}), len(block)
        elif (cells := len(keys) * records) > 4 * len(block) + (1 << 20):
            raise InvalidInput(
                f"{path} lines {line}..{line + newlines}: {len(keys):,} keys over"
                f" {records:,} lines would make {cells:,} mostly empty cells — give every line"
                " the same keys (drop the others), or read the file in smaller chunks"
                " (--chunk-bytes)"
            )
        else:
            table = _parse(path, block, used, line)
            _check_kinds(path, table, kinds)
            yield table, len(block)
        line += newlines


def read_json_array(f: BinaryIO | InputStream, path: Path) -> pa.Table:
    """A ``.json`` file holding one array of objects (at most :data:`JSON_ARRAY_LIMIT` bytes)."""
    data = f.read(JSON_ARRAY_LIMIT + 1)
    if len(data) > JSON_ARRAY_LIMIT:
        raise InvalidInput(
            f"{path}: a JSON array over {JSON_ARRAY_LIMIT >> 20} MiB must be parsed whole — write"
            " it as JSON Lines (one object per line), which exactpack reads in bounded chunks"
        )
    try:
        rows = json.loads(data, object_pairs_hook=unique_keys)
    except DuplicateKey as err:
        at = duplicate_row(data)
        raise InvalidInput(
            f"{path}{at}: key {err.args[0]!r} appears twice in one object — keep one"
        ) from None
    except RecursionError:
        raise too_deep(str(path)) from None
    except ValueError as err:  # not JSON, or not UTF-8 (or UTF-16/32) text
        line = f" line {err.lineno}" if isinstance(err, json.JSONDecodeError) else ""
        raise not_json(f"{path}{line}", err) from None
    if not isinstance(rows, list):
        raise InvalidInput(f"{path}: a .json file must hold a list of objects or JSON Lines")
    if not rows:
        raise InvalidInput(f"{path} holds an empty list: no rows — nothing to pack")
    seen: dict[str, str] = {}
    for i, row in enumerate(rows):
        if (found := check_record(f"{path} row {i}", row, seen, "rows")) is not None:
            raise found
        if depth(row) > MAX_JSON_DEPTH:
            raise too_deep(f"{path} row {i}")
    try:
        return pa.Table.from_struct_array(pa.array(rows))  # every row's keys (not the first's)
    except UnicodeEncodeError:
        found = (lone_surrogate(f"{path} row {i}", row) for i, row in enumerate(rows))
        raise next(filter(None, found)) from None
    except (pa.ArrowException, OverflowError) as err:
        raise InvalidInput(
            f"{path}: inconsistent rows ({err}) — give a column one type in every row"
        ) from None


def read_jsonl(path: str | Path, chunk_bytes: int = 1 << 25) -> pa.Table:
    """A whole JSON Lines file as one Arrow table, through every guard of :func:`iter_jsonl`."""
    path = Path(path)
    with open_stream(path) as f:
        tables = [table for table, _ in iter_jsonl(f, path, chunk_bytes) if table.num_rows]
    if not tables:
        return pa.table({})
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise first_bad_line(path) or InvalidInput(
            f"{path}: blocks of lines disagree on their columns ({err})"
        ) from None
