"""Arrow columns into :class:`~exactpack.io.documents.TokenChunk`: ids, supervision, text.

Every input becomes an Arrow table with one row per source document:

- ``input_ids`` (list of int): the encoded document, BOS/EOS as the tokenizer made them;
- ``text`` (string): instead of ``input_ids``, with a tokenizer (``--text-field``);
- ``prompt`` / ``completion`` or ``messages``: instead, SFT rows tokenized as TRL does;
- ``labels``, ``loss_mask``, ``completion_mask``, ``assistant_masks`` (optional): ANDed
  (:mod:`exactpack.core.supervision`); other columns that look like supervision are refused;
- ``id`` (string or int, optional): the source id; the row number when absent;
- ``partition`` (string, optional): every row must belong to the partition read.

Target ``j`` of a document predicts token ``j + 1``, so its loss flag is token
``j + 1``'s. Errors name the file, the line or row, and the fix.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exactpack.core.batch import IGNORE_INDEX
from exactpack.core.binding import INT32_MAX, Split
from exactpack.core.compact import value_range
from exactpack.core.errors import InvalidInput, SplitMismatch, foreign
from exactpack.core.supervision import (
    CHECKED,
    NOT_CONVERSATIONAL,
    SUPERVISION_COLUMNS,
    UNKNOWN,
    Objective,
    plain_violation,
    refusal,
    suspect,
    wrong_labels,
)
from exactpack.io.cells import column, first, flag_values, ints, lists, row_of, target_flags
from exactpack.io.documents import Origin, TokenChunk
from exactpack.io.sft import SFT_COLUMNS, TEMPLATE_COLUMNS, encode_sft, sft_columns
from exactpack.io.shards import byte_buffers
from exactpack.io.tokenizers import MAX_TEXT_CHARS, ByteTokenizer, Tokenizer, too_long

COLUMNS = ("input_ids", *SUPERVISION_COLUMNS, "id", "partition")


class ReadColumns(frozenset):
    """The columns a reader must read faithfully: the documented ones, the text field, the
    SFT columns, and any that may be supervision (so a JSON line mixing types in one is
    named, never read as nulls)."""

    def __new__(cls, text_field: str) -> ReadColumns:
        return super().__new__(cls, {*COLUMNS, text_field, *SFT_COLUMNS, *TEMPLATE_COLUMNS})

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (super().__contains__(name) or suspect(name))


def wanted_columns(present: Sequence[str], text_field: str) -> list[str]:
    """The ``present`` columns in :class:`ReadColumns`; all of them when there are neither
    ids nor text, so the error can list them."""
    read = ReadColumns(text_field)
    keep = [c for c in present if c in read]
    found = {"input_ids", text_field, *SFT_COLUMNS} & set(keep)
    return keep if found else list(present)


def _token_column(table: pa.Table, origin: Origin) -> tuple[np.ndarray, np.ndarray, int]:
    """Token ids (as Arrow holds them), offsets and the largest id, checked."""
    values, offsets, _ = lists(table, "input_ids", origin)
    values = ints(values, offsets, "input_ids", origin)
    smallest, largest = value_range(values) if values.size else (0, -1)
    if smallest < 0 or largest > INT32_MAX:
        pos = first((values < 0) | (values > INT32_MAX))
        row = row_of(offsets, pos)
        raise InvalidInput(
            f"{origin.locate(row)}: token id {int(values[pos])} at position"
            f" {pos - int(offsets[row])} is not a valid id (0 <= id <= {INT32_MAX}) — ids come"
            " from a tokenizer and are never negative; re-encode the row"
        )
    _check_lengths(offsets, origin, "input_ids has")
    return values, offsets, largest


def _ids(table: pa.Table, origin: Origin) -> pa.Array | None:
    """The ids as an Arrow string array, or None when there is no id column."""
    if "id" not in table.column_names:
        return None
    col = column(table, "id")
    if col.null_count:
        row = first(pc.is_null(col).to_numpy(zero_copy_only=False))
        raise InvalidInput(f"{origin.locate(row)}: id is missing — give every row an id or none")
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        if not pa.types.is_integer(col.type):
            raise origin.type_error(f"id has type {col.type}; use str or int", 0)
        col = pc.cast(col, pa.string())
    return col


def _check_lengths(offsets: np.ndarray, origin: Origin, subject: str) -> None:
    """Every document at least 2 tokens long (one input/target pair), or the row named."""
    counts = np.diff(offsets)
    if counts.size and int(counts.min()) < 2:
        row = first(counts < 2)
        raise InvalidInput(
            f"{origin.locate(row)}: {subject} {int(counts[row])} token(s); an example needs"
            " at least 2 to form one input/target pair — drop the row"
        )


def _texts(
    table: pa.Table, field: str, tokenizer: Tokenizer | None, origin: Origin
) -> tuple[np.ndarray, np.ndarray]:
    if tokenizer is None:
        raise InvalidInput(
            f"{origin.parts[0][0]}: rows hold {field!r} but no tokenizer was given"
            " — pass --tokenizer bytes or a local tokenizer folder"
        )
    col = column(table, field)
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        raise InvalidInput(
            f"{origin.parts[0][0]}: {field!r} has type {str(col.type)!r}, not text — pass"
            " --text-field with the column that holds the text"
        )
    if col.null_count:
        row = first(pc.is_null(col).to_numpy(zero_copy_only=False))
        raise InvalidInput(f"{origin.locate(row)}: {field} is missing — give every row text")
    if isinstance(tokenizer, ByteTokenizer):
        offsets, data = byte_buffers(col)
        return tokenizer.encode_utf8(data, offsets)
    chars = pc.utf8_length(col).to_numpy(zero_copy_only=False)
    if chars.size and int(chars.max()) > MAX_TEXT_CHARS:
        row = first(chars > MAX_TEXT_CHARS)
        raise too_long(f"{origin.locate(row)}: {field}", int(chars[row]))
    return tokenizer.encode_batch(col.to_pylist())


def check_split(table: pa.Table, origin: Origin, partition: Split, ids: Any = None) -> None:
    """Every row's ``partition`` value, when the column exists, must be ``partition``; an
    error names the row's id too when ``ids`` (one per row) are given."""
    col = column(table, "partition") if "partition" in table.column_names else pa.nulls(0)
    if pa.types.is_null(col.type):  # absent, or all null
        return
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        raise origin.type_error(f"partition has type {col.type}; use train, validation or test")
    names = [p.value for p in Split]
    fine = pc.fill_null(pc.equal(pc.utf8_lower(col), partition.value), True)
    fine = fine.to_numpy(zero_copy_only=False)
    if fine.all():
        return
    row = first(~fine)
    value = col[row].as_py()
    where = origin.locate(row)
    if value.lower() not in names:
        raise InvalidInput(f"{where}: partition {value!r} is not one of {', '.join(names)}")
    the_row = ": the row" if ids is None else f" (id {str(ids[row])!r})"
    raise SplitMismatch(
        f"{where}{the_row} belongs to partition {value!r} but {partition.value!r} is being"
        f" packed — a pack holds one partition only; pack those rows separately with"
        f" --split {value.lower()}"
    )


def check_columns(table: pa.Table, origin: Origin, read: Collection[str], tokens: bool) -> None:
    """Refuse a column that looks like supervision exactpack does not read (see the module);
    ``read``: the columns this table is read from; ``tokens``: whether they are
    ``input_ids`` (else text, which no per-token column can align with)."""
    where = origin.parts[0][0]
    names = table.column_names
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:  # Arrow allows it; which of the two is the data is anyone's guess
        raise InvalidInput(
            f"{where}: column {twice[0]!r} appears more than once — rename or drop the duplicates"
        )
    for name, kind in zip(names, table.schema.types, strict=True):
        if name in read or pa.types.is_null(kind):
            continue
        if name in SUPERVISION_COLUMNS:
            raise InvalidInput(
                f"{where}: column {name!r} aligns with input_ids, but the rows are read from"
                f" text ({', '.join(sorted(read))}) — tokenize them yourself and give input_ids"
                f" with {name}, or drop the column"
            )
        if name in CHECKED and tokens:
            _check_plain(table, name, origin)
            continue
        listed = pa.types.is_list(kind) or pa.types.is_large_list(kind)
        fix = UNKNOWN if name in CHECKED else refusal(name, listed)
        if fix is not None:
            raise InvalidInput(
                f"{where}: column {name!r} looks like supervision, which exactpack does not read"
                f" — {fix}"
            )


def _check_plain(table: pa.Table, name: str, origin: Origin) -> None:
    """``attention_mask`` all 1, ``token_type_ids`` all 0, ``position_ids`` 0..n-1 per row,
    each as long as ``input_ids``; anything else would change what is trained."""
    values, offsets, present = lists(table, name, origin, optional=True)
    values = ints(values, offsets, name, origin) if values.dtype != np.bool_ else values
    _, token_offsets, _ = lists(table, "input_ids", origin)
    short = present & (np.diff(offsets) != np.diff(token_offsets))
    if short.any():
        row = first(short)
        raise InvalidInput(
            f"{origin.locate(row)}: {name} has {int(np.diff(offsets)[row])} entries but"
            f" input_ids has {int(np.diff(token_offsets)[row])} — drop the column"
        )
    local = np.arange(values.shape[0]) - np.repeat(offsets[:-1], np.diff(offsets))
    bad, fix = plain_violation(name, values, local)
    if bad.any():
        pos = first(bad)
        row = row_of(offsets, pos)
        raise InvalidInput(
            f"{origin.locate(row)}: {name}[{pos - int(offsets[row])}] = {int(values[pos])} — {fix}"
        )


def supervised_targets(
    table: pa.Table,
    tokens: np.ndarray,
    offsets: np.ndarray,
    origin: Origin,
    objective: Objective | None = None,
) -> np.ndarray | None:
    """One flag per target (bool [T - k]), the AND of the supervision columns present that
    ``objective`` (default TRL's) applies, or None when every target is supervised."""
    names = [n for n in table.column_names if not pa.types.is_null(table.schema.field(n).type)]
    names = (objective or Objective()).applied(names, origin.parts[0][0])
    if "labels" in names and "loss_mask" in names:  # each row one of them (a stream's may differ)
        both = pc.and_(pc.is_valid(table["labels"]), pc.is_valid(table["loss_mask"]))
        if pc.any(both).as_py():
            row = first(both.to_numpy(zero_copy_only=False))
            where = origin.locate(row)
            raise InvalidInput(f"{where}: has both labels and loss_mask — keep one of them")
    counts = np.diff(offsets)
    flags = np.ones(tokens.shape[0] - counts.shape[0], dtype=bool)
    for name in names:
        part, present = _flags(table, name, tokens, counts, origin)
        flags[np.repeat(present, counts - 1)] &= part
    return None if flags.all() else flags


def _flags(
    table: pa.Table, name: str, tokens: np.ndarray, counts: np.ndarray, origin: Origin
) -> tuple[np.ndarray, np.ndarray]:
    """``labels`` (each the token itself or :data:`IGNORE_INDEX`), ``loss_mask`` (per token or
    per target) or a TRL mask (per token) as target flags; the rows that hold it."""
    labels, per_target = name == "labels", name == "loss_mask"
    how = "one per token or one per target" if per_target else "one 0/1 per input_ids token"
    values, offsets, present = lists(table, name, origin, optional=True)
    if labels:
        values = ints(values, offsets, name, origin)
    else:
        values = flag_values(values, offsets, name, origin, how)
    n = np.diff(offsets)
    aligned = present & (n == counts)
    bad = present & ~aligned & ((n != counts - 1) | (not per_target))
    if bad.any():
        row = first(bad)
        got, want = f"{origin.locate(row)}: {name} has {int(n[row])} entries", int(counts[row])
        if labels:
            raise InvalidInput(f"{got} but input_ids has {want} — labels align with input_ids")
        raise InvalidInput(f"{got} for {want} tokens — give {how}")
    if labels:
        wrong = wrong_labels(values, tokens[np.repeat(present, counts)])
        if wrong.any():
            pos = first(wrong)
            row = row_of(offsets, pos)
            raise InvalidInput(
                f"{origin.locate(row)}: labels[{pos - int(offsets[row])}] = {int(values[pos])}"
                f" differs from its input_ids token — a label must be the token itself"
                f" or {IGNORE_INDEX} (unshifted; exactpack forms the pairs)"
            )
        values = values != IGNORE_INDEX
    return target_flags(values, offsets[:-1][aligned]), present


def chunk_from_arrow(
    table: pa.Table,
    origin: Origin,
    *,
    tokenizer: Tokenizer | None = None,
    text_field: str = "text",
    partition: Split | str | None = None,
    objective: Objective | None = None,
) -> TokenChunk:
    """Check an Arrow table with the columns above and hold it as a :class:`TokenChunk`
    (token ids stay in Arrow's buffer when it holds integers without nulls). With
    ``partition``, a ``partition`` column must name it on every row; ``objective``
    (default TRL's) says which tokens SFT rows train."""
    objective = objective or Objective()
    # pyarrow's errors only (kinds=()): a column Arrow cannot convert as asked
    with foreign(f"{origin.parts[0][0]}: cannot convert the columns", kinds=()):
        if partition is not None:
            check_split(table, origin, Split.parse(partition))
        names = set(table.column_names)
        sft = sft_columns(table.column_names)
        if "input_ids" in names:  # as TRL: tokenized rows are read as they are, text left alone
            check_columns(table, origin, {*COLUMNS, *SFT_COLUMNS, *TEMPLATE_COLUMNS}, tokens=True)
            tokens, offsets, largest = _token_column(table, origin)
            flags = supervised_targets(table, tokens, offsets, origin, objective)
        elif sft is not None or text_field in names:
            read = {*(sft or ()), *(TEMPLATE_COLUMNS if sft else ()), "id", "partition", text_field}
            check_columns(table, origin, read, tokens=False)
            if sft is not None:
                tokens, offsets, supervised = encode_sft(table, origin, tokenizer, sft, objective)
            elif objective.assistant_only_loss:
                raise InvalidInput(f"{origin.parts[0][0]}: {NOT_CONVERSATIONAL}")
            else:
                tokens, offsets = _texts(table, text_field, tokenizer, origin)
            _check_lengths(offsets, origin, "the row encodes to")
            flags = None if sft is None else target_flags(supervised, offsets[:-1])
            flags = None if flags is None or flags.all() else flags
            largest = int(tokens.max()) if tokens.size else -1
        else:
            strings = {n for n in names if pa.types.is_string(table.schema.field(n).type)}
            texts = sorted(strings - {"id", "partition"}, key=lambda n: (n != "text", n))
            names_shown = [n if n.isidentifier() else repr(n) for n in texts[:1]]  # no raw newline
            hint = f" (e.g. --text-field {names_shown[0]})" if texts else ""
            raise InvalidInput(
                f"{origin.parts[0][0]}: no 'input_ids' or {text_field!r} column (found"
                f" {sorted(names)}) — pass --text-field NAME for the column that holds the"
                f" text{hint}, or give token ids as input_ids, or SFT rows (prompt/completion or"
                " messages) with --tokenizer"
            )
        ids = _ids(table, origin)
    return TokenChunk(tokens, offsets, flags, ids, origin, largest=largest)
