"""Readers: JSONL, Parquet and Hugging Face ``datasets`` into an :class:`ExampleTable`.

Every input becomes an Arrow table with one row per source document:

- ``input_ids`` (list of int): the encoded document, BOS/EOS as the tokenizer made them;
- ``text`` (string): instead of ``input_ids``, with a tokenizer (``--text-field``);
- ``labels`` (list of int, optional): HF convention, aligned with ``input_ids``:
  ``-100`` = not supervised, otherwise equal to the token (unshifted);
- ``loss_mask`` (list of bool or 0/1, optional): per token (aligned with
  ``input_ids``, first entry unused) or per target (one shorter);
- ``id`` (string or int, optional): the source id; the row number when absent.

Target ``j`` of a document predicts token ``j + 1``, so its loss flag is
``labels[j + 1] != -100``. Columns are converted with Arrow and NumPy, no
Python loop per token; errors name the file, the line or row, and the fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from .compact import IGNORE_INDEX
from .errors import InvalidInput
from .examples import INT32_MAX, Binding, ExampleTable, Partition, split_digest
from .tokenizers import ByteTokenizer, Tokenizer

COLUMNS = ("input_ids", "labels", "loss_mask", "id")


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
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        raise InvalidInput(
            f"{origin.parts[0][0]}: column {name!r} has type {arr.type}; it must hold one list"
            " per row"
        )
    present = ~pc.is_null(arr).to_numpy(zero_copy_only=False)
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


def _ints(values: np.ndarray, name: str, origin: Origin) -> np.ndarray:
    if values.size and (not np.issubdtype(values.dtype, np.integer) or values.dtype == np.bool_):
        raise InvalidInput(
            f"{origin.parts[0][0]}: {name} holds {values.dtype} values; token ids must be"
            " integers — tokenize the text first or pass --tokenizer"
        )
    return values


def _token_column(table: pa.Table, origin: Origin) -> tuple[np.ndarray, np.ndarray]:
    values, offsets, _ = _lists(table, "input_ids", origin)
    values = _ints(values, "input_ids", origin)
    if values.size and (int(values.min()) < 0 or int(values.max()) > INT32_MAX):
        pos = _first((values < 0) | (values > INT32_MAX))
        row = int(np.searchsorted(offsets, pos, "right") - 1)
        raise InvalidInput(
            f"{origin.locate(row)}: token id {int(values[pos])} at position"
            f" {pos - int(offsets[row])} is not a valid id (0 <= id <= {INT32_MAX})"
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
        labels = _ints(labels, "labels", origin)
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
            if not np.issubdtype(mask.dtype, np.integer) or not np.isin(mask, (0, 1)).all():
                raise InvalidInput(f"{origin.parts[0][0]}: loss_mask must hold booleans or 0/1")
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
            raise InvalidInput(f"{origin.parts[0][0]}: id has type {col.type}; use str or int")
        col = pc.cast(col, pa.string())
    return col.to_numpy(zero_copy_only=False).astype(object)


def _texts(
    table: pa.Table, field: str, tokenizer: Tokenizer, origin: Origin
) -> tuple[np.ndarray, np.ndarray]:
    col = _column(table, field)
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        raise InvalidInput(f"{origin.parts[0][0]}: {field!r} has type {col.type}, not text")
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


def documents_from_arrow(
    table: pa.Table,
    origin: Origin,
    *,
    tokenizer: Tokenizer | None = None,
    text_field: str = "text",
) -> Documents:
    """Convert an Arrow table with the columns above into :class:`Documents`."""
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
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return "integer" if value else None
    return "invalid"


def _diagnose_jsonl(path: Path, err: Exception) -> InvalidInput:
    """Find the first bad line with the json module (only after Arrow failed)."""
    seen: dict[str, str] = {}
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path} line {number}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                return InvalidInput(
                    f"{where}: not valid JSON ({e.msg}, column {e.colno}) — write one JSON"
                    " object per line"
                )
            if not isinstance(obj, dict):
                return InvalidInput(f"{where}: is a {type(obj).__name__}, not a JSON object")
            for key in ("input_ids", "labels", "loss_mask", "id"):
                kind = _json_kind(obj.get(key), key)
                if kind is None:
                    continue
                if kind == "invalid":
                    what = "a string or integer" if key == "id" else "a list of integers"
                    return InvalidInput(f"{where}: {key} must be {what}")
                if seen.setdefault(key, kind) != kind:
                    return InvalidInput(
                        f"{where}: {key} holds {kind} values but earlier lines hold"
                        f" {seen[key]} — use one type in every line"
                    )
    return InvalidInput(f"{path}: cannot read as JSON Lines ({err})")


def _read_jsonl(path: Path) -> pa.Table:
    with path.open("rb") as f:
        head = f.read(4096).lstrip()
    if head.startswith(b"["):
        try:
            rows = json.loads(path.read_bytes())
        except json.JSONDecodeError as e:
            raise InvalidInput(f"{path} line {e.lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise InvalidInput(f"{path}: a .json file must hold a list of objects or JSON Lines")
        try:
            return pa.Table.from_pylist(rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            raise InvalidInput(f"{path}: inconsistent rows ({err})") from None
    block = int(min(max(path.stat().st_size + 1, 1 << 20), 1 << 28))
    try:
        return pajson.read_json(path, read_options=pajson.ReadOptions(block_size=block))
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise _diagnose_jsonl(path, err) from None


def _read_parquet(path: Path) -> pa.Table:
    try:
        present = set(pq.read_schema(path).names)
        return pq.read_table(path, columns=[c for c in present if c in _wanted(present)])
    except (pa.ArrowInvalid, OSError) as err:
        raise InvalidInput(f"{path}: cannot read as Parquet ({err})") from None


def _wanted(present: set[str]) -> set[str]:
    """Columns worth reading: the documented ones, plus text when there are no ids."""
    keep = set(COLUMNS) & present
    return keep if "input_ids" in present else present


def _concat(tables: list[pa.Table], files: list[Path], unit: str) -> tuple[pa.Table, Origin]:
    parts, first = [], 0
    for table, file in zip(tables, files, strict=True):
        parts.append((str(file), first, unit))
        first += table.num_rows
    try:
        table = pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise InvalidInput(f"{files[0].parent}: shards disagree on their columns ({err})") from None
    return table, Origin(tuple(parts))


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
        raise InvalidInput(f"input {str(path)!r} does not exist")
    if path.is_dir():
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            import datasets

            return _dataset_table(datasets.load_from_disk(str(path)), part, str(path))
        for pattern, reader, unit in (
            ("*.parquet", _read_parquet, "row"),
            ("*.jsonl", _read_jsonl, "line"),
        ):
            files = sorted(path.glob(pattern))
            if files:
                return _concat([reader(f) for f in files], files, unit)
        raise InvalidInput(
            f"{path} holds no *.parquet or *.jsonl shards and is not a datasets save_to_disk folder"
        )
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return _read_jsonl(path), Origin(((str(path), 0, "line"),))
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
    return documents_from_arrow(table, origin, tokenizer=tokenizer, text_field=text_field)


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
        raise InvalidInput(
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
