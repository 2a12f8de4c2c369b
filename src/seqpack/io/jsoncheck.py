"""One JSON record checked the way the json module reads it: shape, column types, keys.

The Arrow JSON reader accepts a duplicate key (keeping the last value) and
converts a whole column to one type, so when Arrow refuses a block, or a
column has the wrong type, :func:`first_bad_line` (a file read again,
decompressed) and :func:`first_bad_in` (lines in memory) find the first line
the json module finds wrong and name it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from seqpack.core.errors import InvalidInput
from seqpack.io.files import iter_lines, reopen
from seqpack.io.jsonscan import JSON_SPACE, not_json, not_object, too_deep

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
            if key == "id":
                shape = "a string or an integer"
            elif isinstance(value, list):
                shape = _JSON_ITEMS[key]
            else:
                shape = f"a list of {_JSON_ITEMS[key]}"
            got = excerpt(value)
            return InvalidInput(f"{where}: {key} must be {shape}, got {got} — {_FIXES[key]}")
        if seen.setdefault(key, kind) != kind:
            return InvalidInput(
                f"{where}: {key} holds {kind} values but earlier {unit} hold {seen[key]}"
                f" — use one type in every {unit[:-1]}"
            )
    return None


def first_bad_line(path: Path) -> InvalidInput | None:
    """The first line of a JSON Lines file the json module finds wrong, or None (also when
    the file cannot be read again: standard input)."""
    stream = reopen(path)
    if stream is None:
        return None
    with stream:
        return first_bad_in(path, iter_lines(stream), 1)


def first_bad_in(path: Path, lines: Iterable[bytes], first_line: int) -> InvalidInput | None:
    """The first of ``lines`` (numbered from ``first_line``) the json module finds wrong."""
    seen: dict[str, str] = {}
    for number, line in enumerate(lines, first_line):
        if not line.strip(JSON_SPACE):
            continue
        where = f"{path} line {number}"
        if number == 1 and line.startswith(b"\xef\xbb\xbf"):
            line = line[3:]
        try:
            obj = json.loads(line.decode("utf-8"), object_pairs_hook=unique_keys)
        except RecursionError:
            return too_deep(where)
        except DuplicateKey as err:
            return InvalidInput(f"{where}: key {err.args[0]!r} appears twice — keep one")
        except ValueError as err:
            return not_json(where, err)
        if (found := check_record(where, obj, seen)) is not None:
            return found
        if (key := lone_surrogate(obj)) is not None:
            return InvalidInput(
                f"{where}: {key} holds an unpaired surrogate escape (a lone \\ud800-\\udfff)"
                " — it is not a Unicode character, so the text cannot be read as UTF-8;"
                " fix the writer (escape whole characters) or drop the line"
            )
    return None


def lone_surrogate(obj: dict[str, Any]) -> str | None:
    """The first field whose decoded strings hold a surrogate code point, or None (a valid
    escaped pair decodes to one character, so any surrogate left is unpaired)."""
    for key, value in obj.items():
        text = json.dumps([key, value], ensure_ascii=False)
        if any("\ud800" <= ch <= "\udfff" for ch in text):
            return repr(key)
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


def duplicate_row(data: bytes, key: str) -> str:
    """`` row N`` of the array where ``key`` appears twice (only on the error path)."""
    try:
        rows = json.loads(data, object_pairs_hook=lambda pairs: pairs)
    except ValueError:
        return ""
    for i, row in enumerate(rows if isinstance(rows, list) else []):
        stack = [row]
        while stack:
            item = stack.pop()
            if isinstance(item, list) and all(isinstance(p, tuple) for p in item):
                names = [k for k, _ in item]
                if names.count(key) > 1:
                    return f" row {i}"
                stack.extend(v for _, v in item)
            elif isinstance(item, list):
                stack.extend(item)
    return ""
