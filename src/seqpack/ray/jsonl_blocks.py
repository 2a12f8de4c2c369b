"""JSON Lines inputs cut into blocks by line ranges: a driver-side scan, a task-side read.

The driver never parses JSON: :func:`scan_jsonl` counts each file's *records*
(non-blank lines) in chunks of :data:`SCAN_BYTES`, marking the byte offset and
line of every record that opens a block; a task reads only its bytes through
:func:`seqpack.io.jsonl.read_jsonl` (all its guards). Blocks of 2 records over
5 records and one blank line::

    line   1 {"text": "a"}     record 0   block 0: bytes [0, 28),  first line 1
           2 {"text": "b"}     record 1
           3                   (blank)
           4 {"text": "c"}     record 2   block 1: bytes [28, 56), first line 4
           5 {"text": "d"}     record 3
           6 {"text": "e"}     record 4   block 2: bytes [56, 70), first line 6

Errors name the original file and line, as locally.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from seqpack.core.errors import InvalidInput
from seqpack.io.files import open_regular
from seqpack.io.jsonl import line_blocks, read_jsonl

#: Bytes per read of the driver's line scan.
SCAN_BYTES = 1 << 24
#: What ``bytes.strip()`` removes: a line of only these is blank (the reader skips it).
_BLANK = np.zeros(256, dtype=bool)
_BLANK[list(b" \t\n\r\x0b\x0c")] = True
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class LineRange:
    """Bytes ``[lo, hi)`` (whole lines, the first numbered ``line``) of a file of
    ``file_bytes`` bytes."""

    lo: int
    hi: int
    line: int
    file_bytes: int


@dataclass(frozen=True)
class LineIndex:
    """One JSON Lines file as the driver's scan saw it: ``records`` (non-blank lines),
    ``size`` bytes, ``marks[r] = (byte, line)`` where each record ``r`` that opens a block
    starts (0-based byte, 1-based line), ``first_byte`` (the first non-blank byte)."""

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


class _Scan:
    """Running state of :func:`scan_jsonl` over a file's line-aligned chunks."""

    def __init__(self, every: int | None, first: int) -> None:
        self.every, self.first = every, first
        self.records = self.lines = 0
        self.marks: dict[int, tuple[int, int]] = {}
        self.first_byte = b""

    def chunk(self, pos: int, chunk: memoryview) -> None:
        data = np.frombuffer(chunk, dtype=np.uint8)
        if pos == 0 and bytes(chunk[:3]) == _BOM:
            data = np.concatenate([[32] * 3, data[3:]]).astype(np.uint8)  # read as no content
        solid = ~_BLANK[data]
        if not self.first_byte and solid.any():
            self.first_byte = bytes([data[int(np.argmax(solid))]])
        ends = np.flatnonzero(data == 10)
        lines = ends.shape[0] + int(data[-1] != 10)
        starts = np.concatenate(([0], ends + 1))[:lines]
        # a line (with its newline, which is blank) has content when any byte is not blank
        full = np.logical_or.reduceat(solid, starts)
        if self.every is not None:
            record = self.records + np.cumsum(full) - 1
            for k in np.flatnonzero(full & ((self.first + record) % self.every == 0)).tolist():
                self.marks[int(record[k])] = (pos + int(starts[k]), self.lines + k + 1)
        self.records += int(full.sum())
        self.lines += lines


def scan_jsonl(path: Path, every: int | None = None, first: int = 0) -> LineIndex:
    """Count the records of ``path``; mark each record ``r`` with ``(first + r) % every == 0``
    (``first``: the records of the files before it, so blocks cut across files)."""
    scan, size = _Scan(every, first), 0
    try:
        with open_regular(path) as f:  # a FIFO or /dev/zero is refused, never read
            for chunk in line_blocks(f, SCAN_BYTES, path):
                scan.chunk(size, chunk)
                size += len(chunk)
    except OSError as err:
        raise InvalidInput(f"{path}: cannot read it ({err.strerror or err})") from None
    return LineIndex(path, scan.records, size, scan.marks, scan.first_byte)


def _relabel(message: str, part: Path, path: Path, first_line: int) -> str:
    """A reader message about the copied range, told about the original file and lines."""

    def line(m: re.Match[str]) -> str:
        return f"{path} line {int(m.group(1)) + first_line - 1}"

    return re.sub(re.escape(str(part)) + r" line (\d+)", line, message).replace(
        str(part), str(path)
    )


def read_jsonl_range(path: str, lines: LineRange, records: int) -> pa.Table:
    """The ``records`` records in ``lines`` of a JSON Lines file as an Arrow table: a whole
    file read in place, a range copied to a private temporary file first (the reader takes
    a path), its messages relabelled with the original file and lines."""
    file = Path(path)
    try:
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
            with tempfile.TemporaryDirectory(prefix="seqpack-block-") as tmp:
                part = Path(tmp) / file.name
                part.write_bytes(data)
                try:
                    table = read_jsonl(part)
                except InvalidInput as err:
                    raise InvalidInput(_relabel(str(err), part, file, lines.line)) from None
    except OSError as err:
        raise InvalidInput(f"{file}: cannot read it ({err.strerror or err})") from None
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
