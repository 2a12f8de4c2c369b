"""JSON Lines inputs cut into blocks by line ranges: a driver-side scan, a task-side read.

The driver never parses JSON. :func:`scan_jsonl` reads each file once in
chunks of :data:`SCAN_BYTES` and counts its *records* (non-blank lines, as
the local reader skips blank ones), remembering the byte offset and line
number of every record where a block will start. A task then reads only
its bytes ``[first byte, end byte)`` and hands them to the public JSON Lines
reader (:func:`seqpack.io.jsonl.read_jsonl`, with all its guards), so a
block of a 10 GB file costs its own bytes, not the file's. With blocks of 2
records over a file of 5 records and one blank line::

    line   1 {"text": "a"}     record 0   block 0: bytes [0, 28),  first line 1
           2 {"text": "b"}     record 1
           3                   (blank)
           4 {"text": "c"}     record 2   block 1: bytes [28, 56), first line 4
           5 {"text": "d"}     record 3
           6 {"text": "e"}     record 4   block 2: bytes [56, 70), first line 6

Errors name the original file and line, as locally (``part-00.jsonl line 6:
not valid JSON …``).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from seqpack.core.errors import InvalidInput
from seqpack.io.jsonl import read_jsonl

#: Bytes per read of the driver's line scan.
SCAN_BYTES = 1 << 24
#: What ``bytes.strip()`` removes: a line of only these is blank (the reader skips it).
_BLANK = np.zeros(256, dtype=bool)
_BLANK[list(b" \t\n\r\x0b\x0c")] = True
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class LineRange:
    """Bytes ``[lo, hi)`` of a JSON Lines file of ``file_bytes`` bytes: whole lines, the first
    numbered ``line``."""

    lo: int
    hi: int
    line: int
    file_bytes: int


@dataclass(frozen=True)
class LineIndex:
    """One JSON Lines file as the driver's scan saw it.

    ``records``: non-blank lines; ``size``: bytes; ``marks[r] = (byte, line)``:
    where record ``r`` starts (its 0-based byte offset and 1-based line) for
    every record that opens a block; ``first_byte``: the first non-blank byte.
    """

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
    """Running state of :func:`scan_jsonl` across chunks (a line may span two)."""

    def __init__(self, every: int | None, first: int) -> None:
        self.every, self.first = every, first
        self.records = self.lines = self.pos = 0
        self.start = 0  # byte offset of the line being read
        self.solid = False  # whether that line holds a non-blank byte yet
        self.marks: dict[int, tuple[int, int]] = {}
        self.first_byte = b""

    def chunk(self, chunk: bytes) -> None:
        data = np.frombuffer(chunk, dtype=np.uint8)
        solid_byte = ~_BLANK[data]
        if self.pos == 0 and chunk.startswith(_BOM):
            solid_byte[:3] = False  # the reader takes a byte-order mark as no content
        if not self.first_byte and solid_byte.any():
            at = int(np.argmax(solid_byte))
            self.first_byte = chunk[at : at + 1]
        solid = np.concatenate(([0], np.cumsum(solid_byte, dtype=np.int64)))
        ends = np.flatnonzero(data == 10)
        begins = np.concatenate(([0], ends[:-1] + 1)) if ends.size else ends
        full = solid[ends] - solid[begins] > 0  # complete lines of this chunk with content
        if ends.size:
            full[0] |= self.solid
            starts = np.concatenate(([self.start], self.pos + ends[:-1] + 1))
            self._mark(full, starts, self.lines + 1 + np.arange(ends.size))
            self.records += int(full.sum())
            self.lines += int(ends.size)
            self.start = self.pos + int(ends[-1]) + 1
            self.solid = bool(solid[-1] - solid[int(ends[-1]) + 1] > 0)
        else:
            self.solid = self.solid or bool(solid[-1] > 0)
        self.pos += len(chunk)

    def finish(self) -> None:
        """The last line, when the file does not end with a newline."""
        if self.solid:
            full = np.ones(1, dtype=bool)
            self._mark(full, np.array([self.start]), np.array([self.lines + 1]))
            self.records += 1

    def _mark(self, full: np.ndarray, starts: np.ndarray, lines: np.ndarray) -> None:
        if self.every is None:
            return
        record = self.records + np.cumsum(full) - 1
        hit = np.flatnonzero(full & ((self.first + record) % self.every == 0))
        for k in hit.tolist():
            self.marks[int(record[k])] = (int(starts[k]), int(lines[k]))


def scan_jsonl(path: Path, every: int | None = None, first: int = 0) -> LineIndex:
    """Count the records of ``path``; mark each record ``r`` with ``(first + r) % every == 0``.

    ``first`` is the global number of the file's first record (the records
    of the files before it), so blocks of ``every`` examples cut across
    files. Vectorised per chunk of :data:`SCAN_BYTES`: no Python loop per line.
    """
    scan = _Scan(every, first)
    try:
        with path.open("rb") as f:
            while chunk := f.read(SCAN_BYTES):
                scan.chunk(chunk)
    except OSError as err:
        raise InvalidInput(f"{path}: cannot read it ({err.strerror or err})") from None
    scan.finish()
    return LineIndex(path, scan.records, scan.pos, scan.marks, scan.first_byte)


def _relabel(message: str, part: Path, path: Path, first_line: int) -> str:
    """A reader message about the copied range, told about the original file and lines."""
    named = re.escape(str(part))
    shifted = re.sub(
        named + r" line (\d+)",
        lambda m: f"{path} line {int(m.group(1)) + first_line - 1}",
        message,
    )
    return shifted.replace(str(part), str(path))


def read_jsonl_range(path: str, lines: LineRange, records: int) -> pa.Table:
    """The ``records`` records in ``lines`` of a JSON Lines file as an Arrow table, read by
    :func:`seqpack.io.jsonl.read_jsonl`.

    A whole file is read in place; a range is copied to a private temporary
    file first (the reader takes a path), and its messages are relabelled
    with the original file and line numbers.
    """
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
            with file.open("rb") as f:
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
