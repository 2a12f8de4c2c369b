"""Blocks: consecutive runs of input rows, the unit a Ray task reads, tokenizes and plans.

A block is a list of :class:`InputSlice` (rows ``[start, stop)`` of one input): one whole
input shard by default, or ``block_examples`` rows cut across shards (or a materialised
``ray.data.Dataset``'s tables) by global row. The driver lays blocks out from Parquet
footers, a JSON Lines line scan or Dataset row counts; the planning task reads the rows.

A JSON Lines block is a line range: :func:`scan_jsonl` counts each file's *records*
(non-blank lines), marking the byte and line of each record that opens a block; a task
reads only its bytes through :func:`exactpack.io.jsonl.read_jsonl` (all its guards).
Blocks of 2 records over 5 records and one blank line::

    line   1 {"text": "a"}     record 0   block 0: bytes [0, 28),  first line 1
           2 {"text": "b"}     record 1
           3                   (blank)
           4 {"text": "c"}     record 2   block 1: bytes [28, 56), first line 4
           5 {"text": "d"}     record 3
           6 {"text": "e"}     record 4   block 2: bytes [56, 70), first line 6

Errors name the original file and line, as locally.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from exactpack.core.errors import InvalidInput, foreign
from exactpack.io.columns import wanted_columns
from exactpack.io.documents import Origin
from exactpack.io.files import ReadLimits, data_kind, is_stdin, open_regular, resolve_files
from exactpack.io.jsonl import line_blocks, read_jsonl
from exactpack.io.parquet_guard import check_row_groups
from exactpack.io.readers import open_input
from exactpack.pipeline.budget import read_limits
from exactpack.pipeline.options import PackOptions
from exactpack.pipeline.pack_tree import split_receipt, whole_groups

if TYPE_CHECKING:
    import ray.data

SCAN_BYTES = 1 << 24  # per read of the driver's line scan
#: What ``bytes.strip()`` removes: a line of only these is blank (the reader skips it).
_BLANK = np.zeros(256, dtype=bool)
_BLANK[list(b" \t\n\r\x0b\x0c")] = True
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class LineRange:
    """Bytes ``[lo, hi)`` (whole lines, the first numbered ``line``) of a ``file_bytes`` file."""

    lo: int
    hi: int
    line: int
    file_bytes: int


@dataclass(frozen=True)
class LineIndex:
    """A JSON Lines file as scanned: ``records`` (non-blank lines), ``size`` bytes,
    ``marks[r] = (byte, line)`` where each block-opening record ``r`` starts (0-based byte,
    1-based line), ``first_byte`` (the first non-blank byte)."""

    path: Path
    records: int
    size: int
    marks: dict[int, tuple[int, int]]
    first_byte: bytes

    def range(self, start: int, stop: int) -> LineRange:
        """The bytes of records ``[start, stop)``, each end a marked record or the file's end."""
        lo, line = (0, 1) if start == 0 else self.marks[start]
        hi = self.size if stop == self.records else self.marks[stop][0]
        return LineRange(lo, hi, line, self.size)


def scan_jsonl(path: Path, every: int | None = None, first: int = 0) -> LineIndex:
    """Count the records of ``path``; mark each record ``r`` with ``(first + r) % every == 0``
    (``first``: the records of the files before it, so blocks cut across files)."""
    records = lines = size = 0
    marks: dict[int, tuple[int, int]] = {}
    first_byte = b""
    with foreign(f"{path}: cannot read it"), open_regular(path) as f:  # a FIFO is never read
        for chunk in line_blocks(f, SCAN_BYTES, path):  # whole lines
            data = np.frombuffer(chunk, dtype=np.uint8)
            if size == 0 and bytes(chunk[:3]) == _BOM:  # the reader reads it as no content
                data = np.concatenate([[32] * 3, data[3:]]).astype(np.uint8)
            solid = ~_BLANK[data]
            if not first_byte and solid.any():
                first_byte = bytes([data[int(np.argmax(solid))]])
            ends = np.flatnonzero(data == 10)
            count = ends.shape[0] + int(data[-1] != 10)
            starts = np.concatenate(([0], ends + 1))[:count]
            # a line (with its newline, which is blank) has content when any byte is not
            full = np.logical_or.reduceat(solid, starts)
            if every is not None:
                record = records + np.cumsum(full) - 1
                for k in np.flatnonzero(full & ((first + record) % every == 0)).tolist():
                    marks[int(record[k])] = (size + int(starts[k]), lines + k + 1)
            records, lines, size = records + int(full.sum()), lines + count, size + len(chunk)
    return LineIndex(path, records, size, marks, first_byte)


def _relabel(message: str, part: Path, path: Path, first_line: int) -> str:
    """A reader message about the copied range, told about the original file and lines."""
    pattern = re.escape(str(part)) + r" line (\d+)"
    lined = re.sub(pattern, lambda m: f"{path} line {int(m.group(1)) + first_line - 1}", message)
    return lined.replace(str(part), str(path))


def read_jsonl_range(path: str, lines: LineRange, records: int) -> pa.Table:
    """The ``records`` records in ``lines`` of a JSON Lines file as an Arrow table (a range is
    read from a private temporary copy, its messages naming the original file and lines)."""
    file = Path(path)
    with foreign(f"{file}: cannot read it"):
        size = file.stat().st_size
        if size != lines.file_bytes:
            raise _changed(
                file, f"holds {size:,} bytes where the driver scanned {lines.file_bytes:,}"
            )
        if lines.lo == 0 and lines.hi == size:
            table = read_jsonl(file)
        else:
            with open_regular(file) as f:
                f.seek(lines.lo)
                data = f.read(lines.hi - lines.lo)
            with tempfile.TemporaryDirectory(prefix="exactpack-block-") as tmp:
                part = Path(tmp) / file.name
                part.write_bytes(data)
                try:
                    table = read_jsonl(part)
                except InvalidInput as err:
                    raise InvalidInput(_relabel(str(err), part, file, lines.line)) from None
    if table.num_rows != records:
        raise _changed(
            file,
            f"lines {lines.line}..: {table.num_rows:,} records where the driver counted"
            f" {records:,}",
        )
    return table


def _changed(file: Path, what: str) -> InvalidInput:
    return InvalidInput(
        f"{file} {what} — the file changed during the run; run again once it is complete"
    )


@dataclass(frozen=True)
class InputSlice:
    """Rows ``[start, stop)`` of one input (file or task table); errors call its first row
    ``label_start`` of ``name``. ``lines`` (JSON Lines only): where those records lie."""

    name: str
    start: int
    stop: int
    label_start: int
    lines: LineRange | None = None


@dataclass(frozen=True)
class Block:
    """Examples ``first .. first + sum(piece rows) - 1`` of the input, in order; ``origin``
    names its rows where the driver read them (``--tree``: :func:`group_blocks`)."""

    index: int
    first: int
    pieces: tuple[InputSlice, ...]
    from_files: bool
    origin: Origin | None = None


def _unwrap(col: pa.ChunkedArray, name: str) -> pa.ChunkedArray:
    """A Ray tensor column (numpy batch format) as plain lists, one list per row."""
    kind = col.type
    ndim = getattr(kind, "ndim", None) or len(getattr(kind, "shape", ()))
    if ndim != 1:
        raise InvalidInput(
            f"column {name!r} holds {ndim}-D tensors ({kind}); exactpack reads one list of ids"
            " per row — flatten it"
        )
    chunks = [
        c.storage.field("data") if pa.types.is_struct(c.storage.type) else c.storage
        for c in col.chunks
    ]
    return pa.chunked_array(chunks, type=chunks[0].type if chunks else pa.list_(pa.int64()))


def plain_columns(table: pa.Table, text_field: str = "text") -> pa.Table:
    """The columns exactpack reads, Ray's tensor extension columns as plain lists (the
    ``map_batches`` step of a ``ray.data.Dataset``)."""
    table = table.select(wanted_columns(table.column_names, text_field))
    for i, field in enumerate(table.schema):
        if isinstance(field.type, pa.ExtensionType):
            table = table.set_column(i, field.name, _unwrap(table.column(i), field.name))
    return table


def read_slice(piece: InputSlice, text_field: str, limits: ReadLimits | None = None) -> pa.Table:
    """The piece's rows, reading only their row groups (or bytes), through the input policy;
    Ray's tensor types are registered first, so numpy-batch files are unwrapped."""
    if piece.lines is not None:
        table = read_jsonl_range(piece.name, piece.lines, piece.stop - piece.start)
        return plain_columns(table, text_field)
    with contextlib.suppress(ImportError):
        import ray.data  # noqa: F401
    with open_regular(piece.name) as f, foreign(f"{piece.name}: cannot read as Parquet"):
        pf = pq.ParquetFile(f)
        columns = wanted_columns(pf.schema_arrow.names, text_field)
        check_row_groups(f, piece.name, pf.metadata, columns, limits or ReadLimits())
        sizes = np.array(
            [pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)],
            dtype=np.int64,
        )
        ends = np.cumsum(sizes)
        begins = ends - sizes
        groups = np.flatnonzero((begins < piece.stop) & (ends > piece.start)).tolist()
        table = pf.read_row_groups(groups, columns=columns)
    first = int(begins[groups[0]]) if groups else 0
    return plain_columns(table.slice(piece.start - first, piece.stop - piece.start), text_field)


def block_table(
    block: Block, text_field: str, tables: Sequence[pa.Table], limits: ReadLimits | None = None
) -> tuple[pa.Table, Origin]:
    """The block's rows as one table (an ``id`` column, the global row, where absent) and
    its :class:`Origin`."""
    if block.from_files:
        parts = [read_slice(p, text_field, limits) for p in block.pieces]
    else:  # already through plain_columns (dataset_blocks)
        parts = [
            t.slice(p.start, p.stop - p.start) for p, t in zip(block.pieces, tables, strict=True)
        ]
    names = ", ".join(p.name for p in block.pieces)
    with foreign(f"{names}: shards disagree on their columns"):
        table = pa.concat_tables(parts, promote_options="permissive")
    if "id" not in table.column_names:
        ids = np.arange(block.first, block.first + table.num_rows, dtype=np.int64)
        table = table.append_column("id", pa.array(ids))
    return table, block_origin(block)


def block_origin(block: Block) -> Origin:
    """Names row ``i`` of the block by its file (or dataset) row; needs no reading."""
    if block.origin is not None:
        return block.origin
    origin, offset = [], 0
    for p in block.pieces:
        origin.append((p.name, offset - p.label_start, "row" if p.lines is None else "line"))
        offset += p.stop - p.start
    return Origin(tuple(origin))


def input_files(source: Path | Sequence[str | Path]) -> tuple[list[Path], str]:
    """The shards of ``source`` and their kind (``parquet`` or ``jsonl``), by the local input
    policy; compressed files and stdin are refused (blocks are byte ranges)."""
    sources = list(source) if isinstance(source, (list, tuple)) else [source]
    kind, files, roots = resolve_files(sources)
    if kind == "text":
        raise InvalidInput(
            f"{files[0]}: the ray engine reads JSON Lines and Parquet — pack a text file with"
            " --engine local, or convert it to JSON Lines"
        )
    for file, root in zip(files, roots, strict=True):
        if is_stdin(file) or data_kind(file)[1] is not None:
            raise InvalidInput(
                f"{file}: the ray engine cuts uncompressed files into blocks by byte range —"
                " decompress it first, or pack it with --engine local"
            )
        open_regular(file, root=root).close()
    return list(files), kind


def file_blocks(source: Path | Sequence[str | Path], block_examples: int | None) -> list[Block]:
    """Blocks over a file or a folder of shards, from Parquet footers or a JSON Lines scan."""
    files, kind = input_files(source)
    if kind == "jsonl":
        return _number_blocks(jsonl_pieces(files, block_examples), from_files=True)
    counts = []
    for file in files:
        with foreign(f"{file}: cannot read as Parquet"), open_regular(file) as f:
            counts.append(pq.ParquetFile(f).metadata.num_rows)
    return _number_blocks(
        cut_pieces([str(f) for f in files], counts, block_examples), from_files=True
    )


def jsonl_pieces(files: Sequence[Path], block_examples: int | None) -> list[tuple[InputSlice, ...]]:
    """Pieces over JSON Lines files (one per file, or ``block_examples`` records), with their
    byte ranges."""
    indexes: dict[str, LineIndex] = {}
    total = 0
    for file in files:
        index = scan_jsonl(file, block_examples, total)
        if index.first_byte == b"[":
            raise InvalidInput(
                f"{file} holds one JSON array, which is parsed whole — the ray engine reads JSON"
                " Lines (one object per line); convert it, or pack it with --engine local"
            )
        if not index.records:
            raise InvalidInput(f"{file} is empty: it holds no rows — nothing to pack")
        indexes[str(file)] = index
        total += index.records
    runs = cut_pieces(list(indexes), [ix.records for ix in indexes.values()], block_examples)
    return [
        tuple(dataclasses.replace(p, lines=indexes[p.name].range(p.start, p.stop)) for p in run)
        for run in runs
    ]


def cut_pieces(
    names: Sequence[str], counts: Sequence[int], size: int | None, local_labels: bool = True
) -> list[tuple[InputSlice, ...]]:
    """Consecutive runs of ``size`` rows across inputs of ``counts`` rows (the last shorter;
    ``size`` None: one run per non-empty input), labelled by the input's row
    (``local_labels``) or the global row."""
    if size is None:
        return [(InputSlice(n, 0, c, 0),) for n, c in zip(names, counts, strict=True) if c]
    starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    total = int(starts[-1])
    out = []
    for lo in range(0, total, size):
        hi = min(lo + size, total)
        run = []
        for k in np.flatnonzero((starts[:-1] < hi) & (starts[1:] > lo)).tolist():
            a, b = max(lo, starts[k]) - starts[k], min(hi, starts[k + 1]) - starts[k]
            label = int(a) if local_labels else int(starts[k] + a)
            run.append(InputSlice(names[k], int(a), int(b), label))
        out.append(tuple(run))
    return out


def _number_blocks(pieces: list[tuple[InputSlice, ...]], from_files: bool) -> list[Block]:
    sizes = [sum(p.stop - p.start for p in run) for run in pieces]
    firsts = np.cumsum([0, *sizes]).tolist()
    return [Block(k, firsts[k], run, from_files) for k, run in enumerate(pieces)]


def dataset_blocks(
    ray: Any,
    dataset: ray.data.Dataset,
    block_examples: int,
    text_field: str,
    show: bool,
    timeout: float,
) -> tuple[list[Block], list[list[Any]]]:
    """Blocks over a Dataset, normalised (:func:`plain_columns`), materialised in order."""
    ds = dataset.map_batches(
        plain_columns, batch_format="pyarrow", fn_kwargs={"text_field": text_field}
    )
    ds.context.execution_options.preserve_order = True
    ds.context.enable_progress_bars = show
    refs = ds.to_arrow_refs()
    rows = ray.remote(lambda table: table.num_rows)
    counts = ray.get([rows.remote(r) for r in refs], timeout=timeout)
    names = [str(k) for k in range(len(refs))]
    pieces = cut_pieces(names, counts, block_examples, local_labels=False)
    inputs = [[refs[int(p.name)] for p in run] for run in pieces]
    runs = [tuple(InputSlice("dataset", p.start, p.stop, p.label_start) for p in r) for r in pieces]
    return _number_blocks(runs, from_files=False), inputs


def group_blocks(
    ray: Any, source: Any, opts: PackOptions, block_examples: int | None
) -> tuple[Iterator[tuple[Block, list[Any]]], str, Any]:
    """``--tree`` blocks streamed from the local reader
    (:func:`~exactpack.pipeline.pack_tree.whole_groups`: about ``chunk_bytes``, or at least
    ``block_examples`` rows, a group never split), each put in Ray's object store as it is
    read; with the input's name and the split receipt's hasher (the local engine's, whole
    once every block is read)."""
    if isinstance(source, ray.data.Dataset):
        raise InvalidInput(
            "--tree on Ray reads files or an in-memory table, not a ray.data.Dataset (its"
            " blocks would split groups) — write it out (ds.write_parquet(folder)) and pack that"
        )
    source_input = open_input(source, opts.split, read_limits(opts))
    hasher, digest = split_receipt(opts)

    def blocks() -> Iterator[tuple[Block, list[Any]]]:
        first = 0
        tables = whole_groups(source_input, opts, None, digest, block_examples)
        for k, (table, origin) in enumerate(tables):
            piece = InputSlice(source_input.name, 0, table.num_rows, 0)
            yield Block(k, first, (piece,), from_files=False, origin=origin), [ray.put(table)]
            first += table.num_rows
        if not first:
            raise InvalidInput(f"{source_input.name}: holds no rows — nothing to pack")

    return blocks(), source_input.name, hasher
