"""Arrow columns into :class:`~seqpack.io.documents.Documents`: ids, labels, masks, text.

Every input becomes an Arrow table with one row per source document:

- ``input_ids`` (list of int): the encoded document, BOS/EOS as the tokenizer made them;
- ``text`` (string): instead of ``input_ids``, with a tokenizer (``--text-field``);
- ``labels`` (list of int, optional): HF convention, aligned with ``input_ids``:
  ``-100`` = not supervised, otherwise equal to the token (unshifted);
- ``loss_mask`` (list of bool or 0/1, optional): per token (aligned with
  ``input_ids``, first entry unused) or per target (one shorter);
- ``completion_mask`` / ``assistant_masks`` (list of 0/1, optional): TRL's
  masks, per token; a token is supervised iff every supervision column
  present says so (:mod:`seqpack.io.supervision_columns`, which also refuses columns
  that look like supervision but are none of these);
- ``prompt`` / ``completion`` or ``messages``: instead of ``input_ids``, SFT
  rows tokenized as TRL does (:mod:`seqpack.io.sft`);
- ``id`` (string or int, optional): the source id; the row number when absent;
- ``partition`` (string, optional): train / validation / test; when present every
  row must belong to the partition being read (a validation row never enters a
  training pack).

Target ``j`` of a document predicts token ``j + 1``, so its loss flag is
token ``j + 1``'s (``labels[j + 1] != -100``). Columns are converted with Arrow and NumPy, no
Python loop per token, and token ids are left in the buffers Arrow read them
into (no copy; :class:`~seqpack.io.documents.TokenChunk`); errors name the
file, the line or row, and the fix.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seqpack.core.binding import INT32_MAX, Partition
from seqpack.core.compact import value_range
from seqpack.core.errors import InvalidInput, PartitionMismatch
from seqpack.core.supervision import NOT_CONVERSATIONAL, SUPERVISION_COLUMNS, Objective, suspect
from seqpack.io.cells import column, first, ints, lists, row_of, target_flags
from seqpack.io.documents import Documents, Origin, TokenChunk
from seqpack.io.sft import SFT_COLUMNS, TEMPLATE_COLUMNS, encode_sft, sft_columns
from seqpack.io.supervision_columns import check_columns, supervised_targets
from seqpack.io.tokenizers import ByteTokenizer, Tokenizer

COLUMNS = ("input_ids", *SUPERVISION_COLUMNS, "id", "partition")


class ReadColumns(Collection[str]):
    """The columns a reader must read faithfully, as a container: the documented ones, the
    text field, the SFT columns, and any column that may be supervision (so a JSON line
    mixing types in one is named, never read as nulls)."""

    def __init__(self, text_field: str) -> None:
        self.known = frozenset({*COLUMNS, text_field, *SFT_COLUMNS, *TEMPLATE_COLUMNS})

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self.known or suspect(name))

    def __iter__(self) -> Iterator[str]:
        return iter(self.known)

    def __len__(self) -> int:
        return len(self.known)


def wanted_columns(present: Sequence[str], text_field: str) -> list[str]:
    """Columns a reader reads: the documented ones, the text field, the SFT text columns and
    any that may be supervision (so it is refused, not dropped); all of them when there are
    neither ids nor text, so the error can list them."""
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
            f"{origin.parts[0][0]}: {field!r} has type {col.type}, not text — pass"
            " --text-field with the column that holds the text"
        )
    if col.null_count:
        row = first(pc.is_null(col).to_numpy(zero_copy_only=False))
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
    col = column(table, "partition")
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
    row = first(~fine)
    value = col[row].as_py()
    where = origin.locate(row)
    if value.lower() not in names:
        raise InvalidInput(f"{where}: partition {value!r} is not one of {', '.join(names)}")
    raise PartitionMismatch(
        f"{where}: the row belongs to partition {value!r} but {partition.value!r} is being"
        f" packed — a pack holds one partition only; pack those rows separately with"
        f" --partition {value.lower()}"
    )


def chunk_from_arrow(
    table: pa.Table,
    origin: Origin,
    *,
    tokenizer: Tokenizer | None = None,
    text_field: str = "text",
    partition: Partition | str | None = None,
    objective: Objective | None = None,
) -> TokenChunk:
    """Check an Arrow table with the columns above and hold it as a :class:`TokenChunk`.

    Token ids stay in Arrow's buffer when it holds integers without nulls.
    With ``partition``, a ``partition`` column must name it on every row
    (:class:`~seqpack.core.errors.PartitionMismatch` otherwise). ``objective``
    (default TRL's) says which tokens SFT rows train
    (:class:`~seqpack.core.supervision.Objective`).
    """
    try:
        return _chunk(table, origin, tokenizer, text_field, partition, objective or Objective())
    except pa.ArrowException as err:  # a column Arrow cannot convert as asked
        raise InvalidInput(f"{origin.parts[0][0]}: cannot convert the columns ({err})") from None


def documents_from_arrow(
    table: pa.Table,
    origin: Origin,
    *,
    tokenizer: Tokenizer | None = None,
    text_field: str = "text",
    partition: Partition | str | None = None,
    objective: Objective | None = None,
) -> Documents:
    """Convert an Arrow table with the columns above into :class:`Documents` (in memory)."""
    chunk = chunk_from_arrow(
        table,
        origin,
        tokenizer=tokenizer,
        text_field=text_field,
        partition=partition,
        objective=objective,
    )
    return Documents.from_chunks([chunk], origin)


def _chunk(
    table: pa.Table,
    origin: Origin,
    tokenizer: Tokenizer | None,
    text_field: str,
    partition: Partition | str | None,
    objective: Objective,
) -> TokenChunk:
    if partition is not None:
        _check_partition(table, origin, Partition.parse(partition))
    names = set(table.column_names)
    sft = sft_columns(table.column_names)
    if "input_ids" in names:  # as TRL: tokenized rows are read as they are, text left alone
        check_columns(table, origin, {*COLUMNS, *SFT_COLUMNS, *TEMPLATE_COLUMNS}, tokens=True)
        tokens, offsets, largest = _token_column(table, origin)
        flags = supervised_targets(table, tokens, offsets, origin, objective)
    elif sft is not None or text_field in names:
        read = set(sft or (text_field,)) | ({*TEMPLATE_COLUMNS} if sft else set())
        check_columns(table, origin, read | {"id", "partition", text_field}, tokens=False)
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
        texts = [
            n
            for n in sorted(names, key=lambda n: (n != "text", n))
            if pa.types.is_string(table.schema.field(n).type) and n not in ("id", "partition")
        ]
        hint = f" (e.g. --text-field {texts[0]})" if texts else ""
        raise InvalidInput(
            f"{origin.parts[0][0]}: no 'input_ids' or {text_field!r} column (found"
            f" {sorted(names)}) — pass --text-field NAME for the column that holds the"
            f" text{hint}, or give token ids as input_ids, or SFT rows (prompt/completion or"
            " messages) with --tokenizer"
        )
    return TokenChunk(tokens, offsets, flags, _ids(table, origin), origin, largest=largest)
