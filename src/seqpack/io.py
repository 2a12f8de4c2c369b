"""Readers: JSONL, Parquet and Hugging Face ``datasets`` into an :class:`ExampleTable`.

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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .compact import IGNORE_INDEX
from .errors import BindingMismatch, InvalidInput, PartitionMismatch
from .examples import INT32_MAX, Binding, ExampleTable, Partition, split_digest
from .jsonl import first_bad_line, read_json
from .tokenizers import ByteTokenizer, Tokenizer

COLUMNS = ("input_ids", "labels", "loss_mask", "id", "partition")


@dataclass(frozen=True)
class Origin:
    """Where rows came from, to name them in errors: ``parts`` = (file, first row, unit)."""

    parts: tuple[tuple[str, int, str], ...]

    def locate(self, row: int) -> str:
        name, first, unit = self.parts[0]
        for part in self.parts:
            if part[1] > row:
                break
            name, first, unit = part
        local = row - first
        if unit == "line":
            return f"{name} line {_line_of(Path(name), local)}"
        return f"{name} row {local}"

    def type_error(self, message: str, row: int | None = None) -> InvalidInput:
        """A wrong-type error at the line the json module finds first, else at ``row``.

        Arrow converts a whole JSON column to one type (a float anywhere makes
        every id a float), so for JSON Lines the offending line is found by
        re-reading with the json module (only on this error path).
        """
        for name, _, unit in self.parts:
            if unit == "line" and (found := first_bad_line(Path(name))) is not None:
                return found
        where = self.parts[0][0] if row is None else self.locate(row)
        return InvalidInput(f"{where}: {message}")


def _line_of(path: Path, record: int) -> int:
    """1-based line of the ``record``-th non-blank line (only on the error path)."""
    seen = -1
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                seen += 1
                if seen == record:
                    return number
    return record + 1


@dataclass(frozen=True, eq=False)
class Documents:
    """Source documents as flat arrays, before a binding is attached.

    ``tokens`` int32 [Σn], ``offsets`` int64 [k+1], ``loss_mask`` bool
    [Σ(n-1)] (one flag per target), ``ids`` str [k].
    """

    tokens: np.ndarray
    offsets: np.ndarray
    loss_mask: np.ndarray
    ids: np.ndarray
    origin: Origin

    def __len__(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def lengths(self) -> np.ndarray:
        """Prediction pairs per document, int64 [k]."""
        return np.diff(self.offsets) - 1

    def digest(self, partition: Partition | str) -> str:
        """Split-receipt identity of exactly these tokens, flags and partition."""
        part = Partition.parse(partition).value
        return split_digest(
            "seqpack-split",
            part,
            *(np.ascontiguousarray(a).data for a in (self.tokens, self.offsets, self.loss_mask)),
        )

    def to_table(self, binding: Binding, partition: Partition | str) -> ExampleTable:
        """Attach ``binding`` after checking every id is below its vocabulary size."""
        if self.tokens.size and int(self.tokens.max()) >= binding.vocab_size:
            pos = int(np.argmax(self.tokens >= binding.vocab_size))
            row = int(np.searchsorted(self.offsets, pos, "right") - 1)
            raise InvalidInput(
                f"{self.origin.locate(row)} (id {self.ids[row]!r}): token id"
                f" {int(self.tokens[pos])} at position {pos - int(self.offsets[row])} is not below"
                f" the vocabulary size {binding.vocab_size} — pass the right --vocab-size"
                " or --tokenizer"
            )
        counts = np.diff(self.offsets)
        return ExampleTable(
            windows=self.tokens,
            offsets=self.offsets,
            loss_mask=self.loss_mask,
            source_ids=self.ids,
            example_ids=self.ids,
            range_starts=np.zeros(counts.shape[0], dtype=np.int64),
            range_ends=counts,
            partition=Partition.parse(partition),
            binding=binding,
        )


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
    (:class:`~seqpack.errors.PartitionMismatch` otherwise).
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


def _read_parquet(path: Path) -> pa.Table:
    try:
        present = set(pq.read_schema(path).names)
        return pq.read_table(path, columns=[c for c in present if c in _wanted(present)])
    except (pa.ArrowException, OSError, UnicodeDecodeError) as err:  # damaged metadata too
        raise InvalidInput(
            f"{path}: cannot read as Parquet ({err}) — the file is damaged or not Parquet;"
            " write it again"
        ) from None


def _parquet_rows(path: Path) -> tuple[pa.Table, str]:
    return _read_parquet(path), "row"


def _wanted(present: set[str]) -> set[str]:
    """Columns worth reading: the documented ones, plus text when there are no ids."""
    keep = set(COLUMNS) & present
    return keep if "input_ids" in present else present


def _concat(read: list[tuple[pa.Table, str]], files: list[Path]) -> tuple[pa.Table, Origin]:
    parts, first, tables = [], 0, []
    for (table, unit), file in zip(read, files, strict=True):
        parts.append((str(file), first, unit))
        first += table.num_rows
        tables.append(table)
    try:
        table = pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise InvalidInput(f"{files[0].parent}: shards disagree on their columns ({err})") from None
    return table, Origin(tuple(parts))


def _load_from_disk(path: Path) -> Any:
    import datasets

    try:
        return datasets.load_from_disk(str(path))
    except Exception as err:  # datasets raises many kinds on a damaged folder
        raise InvalidInput(
            f"{path}: cannot load as a datasets save_to_disk folder ({type(err).__name__}:"
            f" {err}) — save it again with Dataset.save_to_disk"
        ) from None


def _dataset_table(dataset: Any, partition: Partition, name: str) -> tuple[pa.Table, Origin]:
    import datasets

    if isinstance(dataset, datasets.DatasetDict):
        if partition.value not in dataset:
            raise InvalidInput(
                f"{name} has splits {sorted(dataset)}, not {partition.value!r} — pass"
                " --partition with one of them"
            )
        dataset = dataset[partition.value]
    if not isinstance(dataset, datasets.Dataset):
        raise InvalidInput(f"{name} is a {type(dataset).__name__}, not a datasets.Dataset")
    table = dataset.with_format("arrow")[0 : len(dataset)]
    return table, Origin(((name, 0, "row"),))


def read_arrow(
    source: str | Path | Any, partition: Partition | str = "train"
) -> tuple[pa.Table, Origin]:
    """Any supported input as one Arrow table plus its :class:`Origin`.

    ``source``: a ``.jsonl``/``.json`` file, a ``.parquet`` file, a folder of
    Parquet (or JSONL) shards read in sorted name order, a ``datasets``
    ``save_to_disk`` folder (a ``DatasetDict`` picks ``partition``), or an
    in-memory ``datasets.Dataset`` / ``DatasetDict`` / ``pyarrow.Table``.
    """
    part = Partition.parse(partition)
    if isinstance(source, pa.Table):
        return source, Origin((("table", 0, "row"),))
    if not isinstance(source, (str, Path)):
        return _dataset_table(source, part, "dataset")
    path = Path(source)
    if not path.exists():
        raise InvalidInput(f"input {str(path)!r} does not exist — check the path")
    try:
        return _read_path(path, part)
    except OSError as err:  # unreadable (permissions, a folder named *.jsonl, I/O error)
        raise InvalidInput(f"{path}: cannot read it ({err.strerror or err})") from None


def _read_path(path: Path, part: Partition) -> tuple[pa.Table, Origin]:
    if path.is_dir():
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            return _dataset_table(_load_from_disk(path), part, str(path))
        for pattern, reader in (("*.parquet", _parquet_rows), ("*.jsonl", read_json)):
            files = sorted(path.glob(pattern))
            if files:
                return _concat([reader(f) for f in files], files)
        raise InvalidInput(
            f"{path} holds no *.parquet or *.jsonl shards and is not a datasets save_to_disk folder"
        )
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        table, unit = read_json(path)
        return table, Origin(((str(path), 0, unit),))
    if suffix == ".parquet":
        return _read_parquet(path), Origin(((str(path), 0, "row"),))
    raise InvalidInput(
        f"{path}: unknown input type {suffix!r} — use .jsonl, .json, .parquet, a folder of"
        " Parquet shards or a datasets save_to_disk folder"
    )


def read_documents(
    source: str | Path | Any,
    *,
    tokenizer: Tokenizer | None = None,
    text_field: str = "text",
    partition: Partition | str = "train",
) -> Documents:
    """Read ``source`` (see :func:`read_arrow`) into :class:`Documents`."""
    table, origin = read_arrow(source, partition)
    return documents_from_arrow(
        table, origin, tokenizer=tokenizer, text_field=text_field, partition=partition
    )


def resolve_binding(
    docs: Documents,
    partition: Partition | str,
    *,
    vocab_size: int | None = None,
    tokenizer: Tokenizer | None = None,
    tokenizer_id: str | None = None,
    split_id: str | None = None,
) -> Binding:
    """The binding for ``docs``: vocabulary from ``vocab_size`` or the tokenizer.

    ``vocab_size`` may exceed the tokenizer's (a model's padded embedding)
    but not fall below it. ``split_id`` defaults to :meth:`Documents.digest`.
    """
    if vocab_size is None and tokenizer is None:
        raise InvalidInput(
            "pre-tokenized input needs --vocab-size V (the model's vocabulary size) or a"
            " --tokenizer that defines it"
        )
    if vocab_size is not None and tokenizer is not None and vocab_size < tokenizer.vocab_size:
        raise BindingMismatch(
            f"--vocab-size {vocab_size} is below the tokenizer's {tokenizer.vocab_size}"
            " — drop --vocab-size or raise it"
        )
    size = vocab_size if vocab_size is not None else tokenizer.vocab_size  # type: ignore[union-attr]
    name = tokenizer_id or (tokenizer.identity if tokenizer is not None else "pretokenized")
    return Binding(size, name, split_id or docs.digest(partition))


def load_examples(
    source: str | Path | Any,
    *,
    vocab_size: int | None = None,
    tokenizer: Tokenizer | None = None,
    partition: Partition | str = "train",
    text_field: str = "text",
    tokenizer_id: str | None = None,
    split_id: str | None = None,
) -> ExampleTable:
    """Read ``source`` and bind it: the :class:`ExampleTable` the packer consumes."""
    docs = read_documents(source, tokenizer=tokenizer, text_field=text_field, partition=partition)
    binding = resolve_binding(
        docs,
        partition,
        vocab_size=vocab_size,
        tokenizer=tokenizer,
        tokenizer_id=tokenizer_id,
        split_id=split_id,
    )
    return docs.to_table(binding, partition)
