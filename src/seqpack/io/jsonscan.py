"""The guard in front of Arrow's JSON reader: one JSON object per line, not too deep.

:func:`scan_block` checks a block of whole lines, vectorised with NumPy, the
way a JSON parser sees it: a quote not escaped by an odd run of backslashes
opens or closes a string, and brackets inside strings do not count. A line
passes the fast path when it starts with ``{``, ends with ``}`` (before an
optional ``\\r``), its structural depth stays between 1 and
:data:`MAX_JSON_DEPTH` until its last bracket and returns to 0 exactly
there: one object, nothing beside it. Every other line (a string full of
``]``, a second value, ``null``, leading spaces) is parsed exactly with the
json module, so no line can hide a deep array from the guard::

    {"input_ids": [0, 5, 1]}            fast path: depth 1, 2, 1, 0
    {"text": "]]]]"} [[[[[[[[ ... ]]]]  depth returns to 0 before the end: exact check
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Any

import numpy as np

from seqpack.core.errors import InvalidInput

#: Deepest JSON nesting a record may have (seqpack's columns need 2).
MAX_JSON_DEPTH = 64
#: The bytes JSON counts as whitespace (Arrow skips lines holding only these).
JSON_SPACE = b" \t\r\n"
#: Bytes decoded at a time when a block is checked to be UTF-8.
_UTF8_PIECE = 1 << 22

_QUOTE, _OPEN, _CLOSE = 1, 2, 3
_CODE = np.zeros(256, dtype=np.uint8)
_CODE[ord('"')] = _QUOTE
_CODE[[ord("["), ord("{")]] = _OPEN
_CODE[[ord("]"), ord("}")]] = _CLOSE


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


def not_json(where: str, err: ValueError) -> InvalidInput:
    if isinstance(err, json.JSONDecodeError):
        what = f"not valid JSON ({err.msg}, column {err.colno})"
    elif isinstance(err, UnicodeDecodeError):
        what = f"not UTF-8 text (byte {err.object[err.start]:#04x})"
    else:
        what = f"not JSON text ({err})"
    return InvalidInput(f"{where}: {what} — write one JSON object per line, UTF-8 encoded")


def not_object(where: str, value: Any) -> InvalidInput:
    kinds = {type(None): "null", bool: "boolean", int: "number", float: "number", str: "string"}
    return InvalidInput(
        f"{where}: is a {kinds.get(type(value), 'list')}, not a JSON object — write one JSON"
        " object per line"
    )


def too_deep(where: str) -> InvalidInput:
    return InvalidInput(
        f"{where}: JSON nested more than {MAX_JSON_DEPTH} levels deep — seqpack reads flat"
        " records (lists of token ids); flatten the data"
    )


def check_line(path: Path, line: bytes, number: int) -> bool:
    """Exact check of one line: blank (False), or one object nested at most
    :data:`MAX_JSON_DEPTH` deep (True); anything else raises :class:`InvalidInput`."""
    where = f"{path} line {number}"
    text = line.strip(JSON_SPACE)
    if number == 1 and text.startswith(b"\xef\xbb\xbf"):
        text = text[3:].lstrip(JSON_SPACE)
    if not text:
        return False
    try:
        value = json.loads(text.decode("utf-8"))
    except RecursionError:
        raise too_deep(where) from None
    except ValueError as err:  # UnicodeDecodeError included; "Extra data": two values
        raise not_json(where, err) from None
    if not isinstance(value, dict):
        raise not_object(where, value)
    if depth(value) > MAX_JSON_DEPTH:
        raise too_deep(where)
    return True


def _check_utf8(path: Path, block: memoryview, data: np.ndarray, first_line: int) -> None:
    """Refuse bytes that are not UTF-8 (Arrow takes them into column names)."""
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


def _escaped_quotes(data: np.ndarray) -> np.ndarray:
    """Positions of quotes escaped by an odd run of backslashes (they open no string)."""
    slashes = np.flatnonzero(data == 92)
    if not slashes.size:
        return slashes
    cuts = np.flatnonzero(np.diff(slashes) != 1)
    first = slashes[np.concatenate(([0], cuts + 1))]
    last = slashes[np.append(cuts, slashes.shape[0] - 1)]
    after = last[((last - first) % 2) == 0] + 1  # odd run: the next byte is escaped
    after = after[after < data.shape[0]]
    return after[data[after] == ord('"')]


def _suspicious(
    data: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lines (``[starts[i], ends[i])``, newline excluded) that miss the fast path, the
    lines that are not empty (bool each), and where each top-level key's opening quote
    is (int64 [k], see :func:`_key_quotes`)."""
    n = data.shape[0]
    ends = ends - ((ends > starts) & (data[np.maximum(ends - 1, 0)] == 13))  # one \r
    nonempty = ends > starts
    bad = nonempty & (
        (data[np.minimum(starts, max(n - 1, 0))] != ord("{"))
        | (data[np.maximum(ends - 1, 0)] != ord("}"))
    )
    codes = _CODE[data]
    codes[_escaped_quotes(data)] = 0
    events = np.flatnonzero(codes)
    if not events.size:
        return bad, nonempty, np.zeros((2, 0), np.int64)
    kind = codes[events]
    line = np.searchsorted(starts, events, "right") - 1
    first = np.searchsorted(line, line, "left")  # first event of each event's line
    quotes = np.cumsum(kind == _QUOTE) - (kind == _QUOTE)  # quotes before each event
    inside = ((quotes - quotes[first]) % 2).astype(bool)
    keep = (kind != _QUOTE) & ~inside
    pos, line = events[keep], line[keep]
    step = np.where(kind[keep] == _OPEN, 1, -1)
    level = np.cumsum(step)
    head = np.searchsorted(line, line, "left")
    level -= level[head] - step[head]  # depth after each bracket, within its line
    last = np.append(line[1:] != line[:-1], True)
    wrong = (
        (level > MAX_JSON_DEPTH)
        | (level < 0)
        | ((level == 0) != last)  # closes before its last bracket, or never
        | (last & (pos != ends[line] - 1))
        | ((head == np.arange(line.shape[0])) & (pos != starts[line]))
    )
    bad[line[wrong]] = True
    keys = _key_quotes(data, events, kind, inside, keep, first)
    return bad & nonempty, nonempty, keys


def _key_quotes(
    data: np.ndarray,
    events: np.ndarray,
    kind: np.ndarray,
    inside: np.ndarray,
    bracket: np.ndarray,
    first: np.ndarray,
) -> np.ndarray:
    """Positions of the opening quotes of top-level keys: strings at bracket depth 1 (within
    their line) whose closing quote is followed, after JSON whitespace, by ``:``."""
    step = np.where(bracket, np.where(kind == _OPEN, 1, -1), 0)
    level = np.cumsum(step)
    level -= level[first] - step[first]  # depth after each event, within its line
    quote = np.flatnonzero(kind == _QUOTE)
    opening = quote[~inside[quote] & (level[quote] == 1)]
    closing = np.searchsorted(quote, opening) + 1
    keep = closing < quote.shape[0]
    opening, closes = opening[keep], events[quote[closing[keep]]]
    n = data.shape[0]
    nxt = np.minimum(closes + 1, n - 1)
    for _ in range(8):  # whitespace between a key and its colon (rarely any)
        spaced = (data[nxt] == 32) | (data[nxt] == 9) | (data[nxt] == 13)
        if not spaced.any():
            break
        nxt = np.where(spaced, np.minimum(nxt + 1, n - 1), nxt)
    keyed = data[nxt] == ord(":")
    return np.stack([events[opening[keyed]] + 1, closes[keyed]])


def distinct_keys(block: memoryview, keys: np.ndarray) -> tuple[list[bytes], np.ndarray]:
    """The distinct keys among ``keys`` (int64 [2, k] byte ranges of ``block``: raw bytes
    between the quotes, so a key spelt with escapes counts apart, which only tightens a
    bound), and where each first appears (int64). Hashed by Arrow, not per key in Python."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lo, hi = keys
    lengths = hi - lo
    offsets = np.zeros(lengths.shape[0] + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    gather = np.arange(int(offsets[-1]), dtype=np.int64) + np.repeat(lo - offsets[:-1], lengths)
    data = np.frombuffer(block, dtype=np.uint8)[gather]
    names = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), lengths.shape[0], [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
    encoded = pc.dictionary_encode(names)
    codes = encoded.indices.to_numpy()
    _, first = np.unique(codes, return_index=True)
    return encoded.dictionary.to_pylist(), lo[first]


def scan_block(path: Path, block: memoryview, first_line: int) -> tuple[int, int, np.ndarray]:
    """Check every line of ``block`` (whole lines) starting at line ``first_line``.

    Returns ``(records, newlines, keys)``: the lines that hold an object, the
    newlines in the block, and the top-level keys' names (int64 [2, k]: each
    one's bytes ``[lo, hi)``). Raises :class:`InvalidInput` naming the first
    bad line.
    """
    data = np.frombuffer(block, dtype=np.uint8)
    _check_utf8(path, block, data, first_line)
    breaks = np.flatnonzero(data == 10)
    starts = np.concatenate(([0], breaks + 1))
    ends = np.append(breaks, data.shape[0])
    bad, nonempty, keys = _suspicious(data, starts, ends)
    records = int(np.count_nonzero(nonempty & ~bad))
    for i in np.flatnonzero(bad).tolist():
        records += check_line(path, bytes(block[starts[i] : ends[i]]), first_line + i)
    return records, int(breaks.shape[0]), keys
