"""Arrow columns into :class:`~seqpack.io.documents.Documents`: ids, labels, masks, text.

Every input becomes an Arrow table with one row per source document:

- ``input_ids`` (list of int): the encoded document, BOS/EOS as the tokenizer made them;
- ``text`` (string): instead of ``input_ids``, with a tokenizer (``--text-field``);
- ``labels`` (list of int, optional): HF convention, aligned with ``input_ids``:
  ``-100`` = not supervised, otherwise equal to the token (unshifted);
- ``loss_mask`` (list of bool or 0/1, optional): per token (aligned with
  ``input_ids``, first entry unused) or per target (one shorter);
- ``id`` (string or int, optional): the source id; the row number when absent;
- ``partition`` (string, optional): train / validation / test; when present every
  row must belong to the partition being read (a validation row never enters a
  training pack).

Target ``j`` of a document predicts token ``j + 1``, so its loss flag is
``labels[j + 1] != -100``. Columns are converted with Arrow and NumPy, no
Python loop per token; errors name the file, the line or row, and the fix.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seqpack.core.batch import IGNORE_INDEX
from seqpack.core.binding import INT32_MAX, Partition
from seqpack.core.errors import InvalidInput, PartitionMismatch
from seqpack.io.documents import Documents, Origin
from seqpack.io.tokenizers import ByteTokenizer, Tokenizer

COLUMNS = ("input_ids", "labels", "loss_mask", "id", "partition")


def _column(table: pa.Table, name: str) -> pa.Array:
    col = table.column(name)
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _first(mask: pa.Array | np.ndarray) -> int:
    return int(np.argmax(np.asarray(mask)))


def _lists(
    table: pa.Table, name: str, origin: Origin, optional: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A list column as (values [Σn], offsets int64 [k+1], present bool [k]).

    A missing (null) list is an error unless ``optional``; then it has no
    values and ``present`` is False for its row.
    """
    arr = _column(table, name)
    present = ~pc.is_null(arr).to_numpy(zero_copy_only=False)
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        raise origin.type_error(
            f"column {name!r} has type {arr.type}; it must hold one list per row",
            _first(present) if present.any() else None,
        )
    if not optional and not present.all():
        row = _first(~present)
        raise InvalidInput(f"{origin.locate(row)}: {name} is missing — give every row {name}")
    counts = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
    offsets = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    values = arr.flatten()
    if values.null_count:
        pos = _first(pc.is_null(values).to_numpy(zero_copy_only=False))
        row = int(np.searchsorted(offsets, pos, "right") - 1)
        raise InvalidInput(f"{origin.locate(row)}: {name} holds a null — use integers only")
    return values.to_numpy(zero_copy_only=False), offsets, present


def _show(value: Any) -> str:
    """A short repr of one cell for an error message (nested lists included)."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _ints(values: np.ndarray, offsets: np.ndarray, name: str, origin: Origin) -> np.ndarray:
    if values.size and (not np.issubdtype(values.dtype, np.integer) or values.dtype == np.bool_):
        pos = 0
        if np.issubdtype(values.dtype, np.floating):  # NaN, inf or a fraction first, if any
            pos = _first(~np.isfinite(values) | (values != np.round(values)))
        row = int(np.searchsorted(offsets, pos, "right") - 1)
        raise origin.type_error(
            f"{name} holds {values.dtype} values (e.g. {_show(values[pos])} at position"
            f" {pos - int(offsets[row])}); token ids must be integers — tokenize the text"
            " first or pass --tokenizer",
            row,
        )
    return values


def _token_column(table: pa.Table, origin: Origin) -> tuple[np.ndarray, np.ndarray]:
    values, offsets, _ = _lists(table, "input_ids", origin)
    values = _ints(values, offsets, "input_ids", origin)
    if values.size and (int(values.min()) < 0 or int(values.max()) > INT32_MAX):
        pos = _first((values < 0) | (values > INT32_MAX))
        row = int(np.searchsorted(offsets, pos, "right") - 1)
        raise InvalidInput(
            f"{origin.locate(row)}: token id {int(values[pos])} at position"
            f" {pos - int(offsets[row])} is not a valid id (0 <= id <= {INT32_MAX}) — ids come"
            " from a tokenizer and are never negative; re-encode the row"
        )
    counts = np.diff(offsets)
    if counts.size and int(counts.min()) < 2:
        row = _first(counts < 2)
        raise InvalidInput(
            f"{origin.locate(row)}: input_ids has {int(counts[row])} token(s); an example needs"
            " at least 2 to form one input/target pair — drop the row"
        )
    return values.astype(np.int32, copy=False), offsets


def _target_flags(per_token: np.ndarray, firsts: np.ndarray) -> np.ndarray:
    """Drop the flags at ``firsts`` (a document's first token is no pair's target)."""
    keep = np.ones(per_token.shape[0], dtype=bool)
    keep[firsts] = False
    return per_token[keep]


def _loss_flags(
    table: pa.Table, tokens: np.ndarray, offsets: np.ndarray, origin: Origin
) -> np.ndarray:
    """One flag per target; rows without labels / loss_mask are fully supervised."""
    names = {n for n in table.column_names if not pa.types.is_null(table.schema.field(n).type)}
    counts = np.diff(offsets)
    flags = np.ones(tokens.shape[0] - counts.shape[0], dtype=bool)
    if "labels" in names and "loss_mask" in names:
        raise InvalidInput(
            f"{origin.parts[0][0]}: has both labels and loss_mask — keep one of them"
        )
    if "labels" in names:
        labels, loffsets, present = _lists(table, "labels", origin, optional=True)
        labels = _ints(labels, loffsets, "labels", origin)
        bad = present & (np.diff(loffsets) != counts)
        if bad.any():
            row = _first(bad)
            raise InvalidInput(
                f"{origin.locate(row)}: labels has {int(np.diff(loffsets)[row])} entries but"
                f" input_ids has {int(counts[row])} — labels align with input_ids"
            )
        supervised = labels != IGNORE_INDEX
        wrong = supervised & (labels != tokens[np.repeat(present, counts)])
        if wrong.any():
            pos = _first(wrong)
            row = int(np.searchsorted(loffsets, pos, "right") - 1)
            raise InvalidInput(
                f"{origin.locate(row)}: labels[{pos - int(loffsets[row])}] = {int(labels[pos])}"
                f" differs from its input_ids token — a label must be the token itself"
                f" or {IGNORE_INDEX} (unshifted; seqpack forms the pairs)"
            )
        flags[np.repeat(present, counts - 1)] = _target_flags(supervised, loffsets[:-1][present])
    elif "loss_mask" in names:
        mask, moffsets, present = _lists(table, "loss_mask", origin, optional=True)
        if mask.dtype != np.bool_:
            numeric = np.issubdtype(mask.dtype, np.integer) or np.issubdtype(
                mask.dtype, np.floating
            )
            bad = ~np.isin(mask, (0, 1)) if numeric else np.ones(mask.shape[0], dtype=bool)
            if mask.size and (bad.any() or not np.issubdtype(mask.dtype, np.integer)):
                pos = _first(bad) if bad.any() else 0
                row = int(np.searchsorted(moffsets, pos, "right") - 1)
                raise origin.type_error(
                    f"loss_mask holds {_show(mask[pos])} at position {pos - int(moffsets[row])};"
                    " it must hold booleans or 0/1 — one flag per token or per target",
                    row,
                )
            mask = mask.astype(bool)
        mcounts = np.diff(moffsets)
        aligned = present & (mcounts == counts)
        bad = present & ~aligned & (mcounts != counts - 1)
        if bad.any():
            row = _first(bad)
            raise InvalidInput(
                f"{origin.locate(row)}: loss_mask has {int(mcounts[row])} entries for"
                f" {int(counts[row])} tokens — give one per token or one per target"
            )
        flags[np.repeat(present, counts - 1)] = _target_flags(mask, moffsets[:-1][aligned])
    return flags


def _ids(table: pa.Table, origin: Origin, n: int) -> np.ndarray:
    if "id" not in table.column_names:
        return np.arange(n).astype(str).astype(object)
    col = _column(table, "id")
    if col.null_count:
        row = _first(pc.is_null(col).to_numpy(zero_copy_only=False))
        raise InvalidInput(f"{origin.locate(row)}: id is missing — give every row an id or none")
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        if not pa.types.is_integer(col.type):
            raise origin.type_error(f"id has type {col.type}; use str or int", 0)
        col = pc.cast(col, pa.string())
    return col.to_numpy(zero_copy_only=False).astype(object)


def _texts(
    table: pa.Table, field: str, tokenizer: Tokenizer, origin: Origin
) -> tuple[np.ndarray, np.ndarray]:
    col = _column(table, field)
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        raise InvalidInput(
            f"{origin.parts[0][0]}: {field!r} has type {col.type}, not text — pass"
            " --text-field with the column that holds the text"
        )
    if col.null_count:
        row = _first(pc.is_null(col).to_numpy(zero_copy_only=False))
        raise InvalidInput(f"{origin.locate(row)}: {field} is missing — give every row text")
    if isinstance(tokenizer, ByteTokenizer):
        _, obuf, dbuf = col.buffers()
        width = np.int64 if pa.types.is_large_string(col.type) else np.int32
        offs = np.frombuffer(obuf, dtype=width)[col.offset : col.offset + len(col) + 1]
        data = np.frombuffer(dbuf, dtype=np.uint8) if dbuf is not None else np.zeros(0, np.uint8)
        return tokenizer.encode_utf8(data, offs.astype(np.int64))
    return tokenizer.encode_batch(col.to_pylist())


def _check_partition(table: pa.Table, origin: Origin, partition: Partition) -> None:
    """Every row's ``partition`` value, when the column exists, must be ``partition``."""
    if "partition" not in table.column_names:
        return
    col = _column(table, "partition")
    if pa.types.is_null(col.type):
        return
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        raise origin.type_error(f"partition has type {col.type}; use train, validation or test")
    names = [p.value for p in Partition]
    same = [v for v in pc.unique(col).to_pylist() if v is not None and v.lower() == partition.value]
    fine = pc.or_(pc.is_in(col, value_set=pa.array(same, col.type)), pc.is_null(col))
    fine = fine.to_numpy(zero_copy_only=False)
    if fine.all():
        return
    row = _first(~fine)
    value = col[row].as_py()
    where = origin.locate(row)
    if value.lower() not in names:
        raise InvalidInput(f"{where}: partition {value!r} is not one of {', '.join(names)}")
    raise PartitionMismatch(
        f"{where}: the row belongs to partition {value!r} but {partition.value!r} is being"
        f" packed — a pack holds one partition only; pack those rows separately with"
        f" --partition {value.lower()}"
    )


def documents_from_arrow(
    table: pa.Table,
    origin: Origin,
    *,
    tokenizer: Tokenizer | None = None,
    text_field: str = "text",
    partition: Partition | str | None = None,
) -> Documents:
    """Convert an Arrow table with the columns above into :class:`Documents`.

    With ``partition``, a ``partition`` column must name it on every row
    (:class:`~seqpack.core.errors.PartitionMismatch` otherwise).
    """
    try:
        return _documents(table, origin, tokenizer, text_field, partition)
    except pa.ArrowException as err:  # a column Arrow cannot convert as asked
        raise InvalidInput(f"{origin.parts[0][0]}: cannot convert the columns ({err})") from None


def _documents(
    table: pa.Table,
    origin: Origin,
    tokenizer: Tokenizer | None,
    text_field: str,
    partition: Partition | str | None,
) -> Documents:
    if partition is not None:
        _check_partition(table, origin, Partition.parse(partition))
    names = set(table.column_names)
    if "input_ids" in names:
        tokens, offsets = _token_column(table, origin)
        mask = _loss_flags(table, tokens, offsets, origin)
    elif text_field in names:
        if tokenizer is None:
            raise InvalidInput(
                f"{origin.parts[0][0]}: rows hold {text_field!r} but no tokenizer was given"
                " — pass --tokenizer bytes or a local tokenizer folder"
            )
        tokens, offsets = _texts(table, text_field, tokenizer, origin)
        counts = np.diff(offsets)
        if counts.size and int(counts.min()) < 2:
            row = _first(counts < 2)
            raise InvalidInput(
                f"{origin.locate(row)}: the text encodes to {int(counts[row])} token(s);"
                " an example needs at least 2 — drop the row"
            )
        mask = np.ones(tokens.shape[0] - counts.shape[0], dtype=bool)
    else:
        raise InvalidInput(
            f"{origin.parts[0][0]}: no 'input_ids' or {text_field!r} column (found"
            f" {sorted(names)}) — give token ids as input_ids or text with --tokenizer"
        )
    return Documents(tokens, offsets, mask, _ids(table, origin, len(offsets) - 1), origin)
