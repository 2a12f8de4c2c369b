"""Readers: JSON Lines, Parquet and Hugging Face ``datasets`` into Arrow, then documents.

``read_arrow`` turns any supported input into one Arrow table (one row per
source document) plus its :class:`~seqpack.io.documents.Origin`;
:func:`read_documents` converts the columns (:mod:`seqpack.io.columns`)
and :func:`load_examples` binds them into the
:class:`~seqpack.core.examples.ExampleTable` the packer consumes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from seqpack.core.binding import Partition
from seqpack.core.errors import InvalidInput
from seqpack.core.examples import ExampleTable
from seqpack.io.columns import COLUMNS, documents_from_arrow
from seqpack.io.documents import Documents, Origin, resolve_binding
from seqpack.io.jsonl import read_json
from seqpack.io.tokenizers import Tokenizer


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
