"""Readers: JSON Lines, text, Parquet and ``datasets`` as bounded Arrow chunks.

:func:`open_input` says what a source is (:class:`Input`); :meth:`Input.chunks` reads it
in chunks of about ``chunk_bytes`` of input, each with the :class:`Origin` naming its rows.
:func:`read_documents` and :func:`load_examples` read a whole input into memory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, BinaryIO

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from exactpack.core.binding import Split
from exactpack.core.errors import InvalidInput, foreign
from exactpack.core.examples import ExampleTable
from exactpack.core.supervision import Objective
from exactpack.io.columns import ReadColumns, chunk_from_arrow, wanted_columns
from exactpack.io.documents import Documents, Origin, make_binding
from exactpack.io.files import (
    InputStream,
    ReadLimits,
    is_datasets_folder,
    is_stdin,
    open_regular,
    open_stream,
    read_limited,
    resolve_files,
    resolve_inside,
)
from exactpack.io.integrity import refuse_packed
from exactpack.io.jsonl import iter_jsonl, line_blocks, not_json, read_json_array
from exactpack.io.parquet_guard import check_row_groups
from exactpack.io.spill import MappedFile
from exactpack.io.tokenizers import Tokenizer

#: Input bytes read, parsed and tokenized at a time (``PackOptions.chunk_bytes``).
DEFAULT_CHUNK_BYTES = 1 << 25
#: The most bytes of ``state.json`` / ``dataset_dict.json`` / ``dataset_info.json`` read.
MAX_METADATA_FILE = 16 << 20

Chunks = Iterator[tuple[pa.Table, Origin, int]]


@dataclass
class Input:
    """One input source, read in chunks: ``kind`` (jsonl, parquet, datasets, table), its
    ``files`` (each inside its ``roots`` entry unless None: a file named by the user),
    total input ``bytes`` (0 when unknown), ``rows`` when known before reading, and
    whether its chunks' buffers stay valid after reading (``persistent``: in-memory or
    memory-mapped Arrow, no spill)."""

    name: str
    kind: str
    files: tuple[Path, ...] = ()
    bytes: int = 0
    rows: int | None = None
    persistent: bool = False
    fingerprint: str | None = None
    table: pa.Table | None = None
    mapped: list[MappedFile] = field(default_factory=list)
    roots: tuple[Path | None, ...] = ()
    limits: ReadLimits = field(default_factory=ReadLimits)

    def chunks(self, chunk_bytes: int, text_field: str = "text") -> Chunks:
        """``(table, origin, input bytes)`` per chunk, in input order; ``origin`` names the
        chunk's rows from 0. Chunks may be empty (a block of blank lines)."""
        if self.table is not None:
            yield from _table_chunks(self.table, self.name, chunk_bytes)
            return
        first = 0
        for path, root in zip(self.files, self.roots, strict=True):
            if self.kind == "datasets":
                mapped = MappedFile(path, open_regular(path, root=root))
                self.mapped.append(mapped)
                what = f"{path}: cannot read this datasets Arrow file"
                with foreign(what, "save the dataset again with save_to_disk"):
                    table = pa.ipc.open_stream(pa.BufferReader(mapped.buffer)).read_all()
                yield from _table_chunks(table, self.name, chunk_bytes, first)
                first += table.num_rows
            else:
                yield from _file_chunks(path, root, self.kind, chunk_bytes, text_field,
                                        self.limits)  # fmt: skip

    def release(self) -> None:
        """Drop the memory-mapped pages read so far from this process (kept on disk)."""
        for mapped in self.mapped:
            mapped.release()

    def close(self) -> None:
        for mapped in self.mapped:
            mapped.close()
        self.mapped.clear()


def _table_chunks(table: pa.Table, name: str, chunk_bytes: int, first: int = 0) -> Chunks:
    """Zero-copy record batches of about ``chunk_bytes``, named rows ``first ...`` of ``name``."""
    rows = max(1, chunk_bytes // max(1, table.nbytes // max(1, table.num_rows)))
    for batch in table.to_batches(max_chunksize=rows):
        yield pa.Table.from_batches([batch]), Origin(((name, -first, "row"),)), batch.nbytes
        first += batch.num_rows


def _file_chunks(path: Path, root: Path | None, kind: str, chunk_bytes: int, text_field: str,
                 limits: ReadLimits) -> Chunks:  # fmt: skip
    if kind == "parquet":
        with open_regular(path, root=root) as f:
            yield from _named(_parquet_chunks(f, path, chunk_bytes, text_field, limits),
                              str(path), "row")  # fmt: skip
        return
    with open_stream(path, root=root, limits=limits) as stream:
        name = Path(stream.name)
        if kind == "text":
            parts, unit = _text_tables(stream, name, chunk_bytes, text_field), "text line"
        elif (head := stream.first_byte()) == b"[":
            parts, unit = iter([(read_json_array(stream, name), 0)]), "row"
        elif not head:
            raise InvalidInput(f"{name} is empty: it holds no rows — nothing to pack")
        else:
            parts = iter_jsonl(stream, name, chunk_bytes, ReadColumns(text_field), limits)
            unit = "line"
        yield from _named(parts, stream.name, unit, stream)


def _text_tables(
    stream: InputStream, path: Path, chunk_bytes: int, text_field: str
) -> Iterator[tuple[pa.Table, int]]:
    """A text file as tables of one ``text_field`` column, one row per line, as the
    ``datasets`` "text" builder reads it: UTF-8, universal newlines (``\\r\\n`` and ``\\r``
    end a line too), line breaks dropped, empty lines kept as empty documents."""
    rows = 0
    for block in line_blocks(stream, chunk_bytes, path):
        try:
            text = str(block, "utf-8")
        except UnicodeDecodeError as err:
            line = rows + 1 + bytes(block[: err.start]).count(b"\n")
            raise not_json(f"{path} line {line}", err, "save the file as UTF-8") from None
        lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        if lines[-1] == "":
            lines.pop()  # the newline ends the last line; it starts none
        rows += len(lines)
        yield pa.table({text_field: pa.array(lines, pa.string())}), len(block)
    if not rows:
        raise InvalidInput(f"{path} is empty: it holds no lines — nothing to pack")


def _named(
    parts: Iterator[tuple[pa.Table, int]], name: str, unit: str, stream: InputStream | None = None
) -> Chunks:
    """``parts`` with the origin of their rows; with ``stream``, each size is the input bytes
    (compressed) consumed for it."""
    first = done = 0
    for table, size in parts:
        if stream is not None:
            size, done = stream.position - done, stream.position
        yield table, Origin(((name, -first, unit),)), size
        first += table.num_rows


def _parquet_chunks(
    f: BinaryIO, path: Path, chunk_bytes: int, text_field: str, limits: ReadLimits
) -> Iterator[tuple[pa.Table, int]]:
    fix = "the file is damaged or not Parquet; write it again"
    with foreign(f"{path}: cannot read as Parquet", fix):
        pf = pq.ParquetFile(f)
        meta = pf.metadata
        columns = wanted_columns(pf.schema_arrow.names, text_field)
        check_row_groups(f, path, meta, columns, limits)
        size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        per_row = max(1, size // max(1, meta.num_rows))
        share = os.fstat(f.fileno()).st_size / max(1, meta.num_rows)
        for batch in pf.iter_batches(batch_size=max(1, chunk_bytes // per_row), columns=columns):
            yield pa.Table.from_batches([batch]), int(batch.num_rows * share)


# -- datasets save_to_disk folders, checked before datasets reads them (docs/design-notes.md)


class _DataFile(msgspec.Struct):
    filename: str


class _State(msgspec.Struct):
    """``state.json``: a split's Arrow files (datasets' other keys are not read)."""

    names: Annotated[list[_DataFile], msgspec.Meta(min_length=1)] = msgspec.field(
        name="_data_files"
    )


class _Splits(msgspec.Struct):
    """``dataset_dict.json``: the split folders."""

    names: Annotated[list[str], msgspec.Meta(min_length=1)] = msgspec.field(name="splits")


def _listed(path: Path, root: Path, schema: type[_State | _Splits]) -> list[Any]:
    """The names ``path``'s JSON lists (``schema``), decoded as the json module would (a key
    twice: the last), or one line naming the file."""
    what = f"{path.parent}: cannot load as a datasets save_to_disk folder: {path.name}"
    with foreign(what, "save it again with Dataset.save_to_disk"):
        data = read_limited(path, MAX_METADATA_FILE, root=root)
        return msgspec.json.decode(data, type=schema).names


def _check_split(folder: Path, root: Path) -> list[Path]:
    names = _listed(folder / "state.json", root, _State)
    files = [resolve_inside(folder, name.filename, "a data file") for name in names]
    for file in files:
        open_regular(file, root=root).close()
    if os.path.lexists(info := folder / "dataset_info.json"):
        open_regular(info, root=root, max_bytes=MAX_METADATA_FILE).close()
    return files


def check_folder(path: Path) -> list[Path]:
    """Every data file ``path`` names (all splits), each checked by the input policy."""
    if not os.path.lexists(path / "dataset_dict.json"):
        return _check_split(path, path)
    splits = _listed(path / "dataset_dict.json", path, _Splits)
    folders = [resolve_inside(path, split, "a split folder") for split in splits]
    return [file for folder in folders for file in _check_split(folder, path)]


def load_folder(path: Path) -> Any:
    """``datasets.load_from_disk(path)`` after :func:`check_folder`; its mapped files
    checked to lie inside ``path``."""
    import datasets

    check_folder(path)
    what = f"{path}: cannot load as a datasets save_to_disk folder"  # datasets raises many kinds
    with foreign(what, "save it again with Dataset.save_to_disk", (Exception,)):
        loaded = datasets.load_from_disk(str(path))
    for part in loaded.values() if isinstance(loaded, datasets.DatasetDict) else [loaded]:
        for cache in part.cache_files:
            open_regular(cache["filename"], root=path).close()
    return loaded


def pick_split(dataset: Any, part: Split, name: str) -> Any:
    """The ``part`` split of a ``DatasetDict`` (a ``Dataset`` as it is), checked."""
    import datasets

    if isinstance(dataset, datasets.DatasetDict):
        if part.value not in dataset:
            raise InvalidInput(
                f"{name} has splits {sorted(dataset)}, not {part.value!r} — pass"
                " --split with one of them"
            )
        dataset = dataset[part.value]
    if not isinstance(dataset, datasets.Dataset):
        stream = isinstance(dataset, (datasets.IterableDataset, datasets.IterableDatasetDict))
        hint = (
            " — a stream is packed by exactpack.hf.pack_dataset (it returns an IterableDataset);"
            " to write a packed folder, materialise it first (datasets.Dataset.from_generator)"
            if stream or hasattr(dataset, "__next__")
            else ""
        )
        raise InvalidInput(f"{name} is a {type(dataset).__name__}, not a datasets.Dataset{hint}")
    return dataset


def dataset_input(dataset: Any, part: Split, name: str = "dataset") -> Input:
    """An in-memory (or memory-mapped) ``datasets.Dataset`` / ``DatasetDict`` as an input."""
    dataset = pick_split(dataset, part, name)
    table = dataset.with_format("arrow")[0 : len(dataset)]  # zero-copy unless rows were selected
    return Input(name, "table", rows=table.num_rows, bytes=table.nbytes, persistent=True,
                 fingerprint=getattr(dataset, "_fingerprint", None), table=table)  # fmt: skip


def _datasets_folder(path: Path, part: Split, limits: ReadLimits) -> Input:
    dataset = pick_split(load_folder(path), part, str(path))
    files = tuple(Path(c["filename"]) for c in dataset.cache_files)
    if getattr(dataset, "_indices", None) is not None or not files:
        return dataset_input(dataset, part, str(path))
    return Input(str(path), "datasets", files, bytes=sum(f.stat().st_size for f in files),
                 rows=len(dataset), persistent=True, limits=limits, roots=(path,) * len(files),
                 fingerprint=getattr(dataset, "_fingerprint", None))  # fmt: skip


def open_input(
    source: str | Path | Sequence[str | Path] | Any,
    partition: Split | str = "train",
    limits: ReadLimits | None = None,
) -> Input:
    """What ``source`` is and how to read it (nothing is read yet).

    ``source``: a ``.jsonl``/``.json``/``.ndjson`` or ``.txt`` file (one document per
    line; either may be compressed: ``.gz``, ``.zst``, ``.bz2``, ``.xz``), ``-`` for
    standard input, a ``.parquet`` file, a folder of shards (sorted by name), a glob, a
    list of these (one format, in order), a ``datasets`` ``save_to_disk`` folder (a
    ``DatasetDict`` picks ``partition``), or an in-memory ``datasets.Dataset`` /
    ``DatasetDict`` / ``pyarrow.Table``. ``limits`` bound what reading may decode.
    """
    part = Split.parse(partition)
    limits = limits or ReadLimits()
    if isinstance(source, pa.Table):
        return Input("table", "table", rows=source.num_rows, persistent=True, table=source)
    many = isinstance(source, (list, tuple)) and all(isinstance(s, (str, Path)) for s in source)
    if not isinstance(source, (str, Path)) and not many:
        return dataset_input(source, part)
    sources = list(source) if many else [source]
    if not sources:
        raise InvalidInput("no input given — name a file, a folder or - for standard input")
    for named in sources:
        if not is_stdin(named) and os.path.exists(named):
            refuse_packed(Path(named))  # a exactpack output is packed already
    if len(sources) == 1 and not is_stdin(sources[0]):
        path = Path(sources[0])
        if path.is_dir() and is_datasets_folder(path):
            return _datasets_folder(path, part, limits)
    kind, files, roots = resolve_files(sources)
    for file, root in zip(files, roots, strict=True):
        if not is_stdin(file):
            open_regular(file, root=root).close()
    size = sum(f.stat().st_size for f in files if not is_stdin(f))
    name = str(sources[0]) if len(sources) == 1 else f"{sources[0]} (+{len(sources) - 1} more)"
    return Input(name, kind, files, bytes=size, roots=roots, limits=limits)


def read_documents(
    source: str | Path | Any,
    *,
    tokenizer: Tokenizer | None = None,
    text_field: str = "text",
    partition: Split | str = "train",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    objective: Objective | None = None,
) -> Documents:
    """Read ``source`` (see :func:`open_input`) chunk by chunk into one :class:`Documents`
    (``objective``: what SFT rows train, default TRL's)."""
    source = open_input(source, partition)
    chunks, parts, first = [], [], 0
    try:
        for table, origin, _ in source.chunks(chunk_bytes, text_field):
            if not table.num_rows:
                continue
            name, shift, unit = origin.parts[0]
            if not parts or parts[-1][0] != name:
                parts.append((name, first + shift, unit))
            chunk = chunk_from_arrow(table, origin, tokenizer=tokenizer, text_field=text_field,
                                     partition=partition, objective=objective)  # fmt: skip
            chunks.append(chunk.rebased(first))
            first += table.num_rows
    finally:
        source.close()
    return Documents.from_chunks(chunks, Origin(tuple(parts) or ((source.name, 0, "row"),)))


def load_examples(
    source: str | Path | Any,
    *,
    vocab_size: int | None = None,
    tokenizer: Tokenizer | None = None,
    partition: Split | str = "train",
    text_field: str = "text",
    tokenizer_id: str | None = None,
    split_id: str | None = None,
) -> ExampleTable:
    """Read ``source`` and bind it: the :class:`ExampleTable` the packer consumes."""
    docs = read_documents(source, tokenizer=tokenizer, text_field=text_field, partition=partition)
    binding = make_binding(
        lambda: docs.digest(partition), vocab_size=vocab_size, tokenizer=tokenizer,
        tokenizer_id=tokenizer_id, split_id=split_id
    )  # fmt: skip
    return docs.to_table(binding, partition)
