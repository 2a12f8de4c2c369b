"""The input policy: which files seqpack reads, and how much of them, for every reader.

Every reader (JSON Lines, Parquet, ``datasets`` folders, Ray blocks, and the
tokenizer, template and state loaders) opens files through this module:

- :func:`open_regular` opens a **regular file only** — a FIFO would block
  forever, a device such as ``/dev/zero`` never ends, a socket cannot be
  read — checked before opening (``stat``), at the open (``O_NONBLOCK``, so a
  FIFO cannot hang it) and after (``fstat``, so a file swapped in between is
  caught); with ``root`` it must lie **inside** that folder once every
  symlink is resolved, and with ``max_bytes`` it must not be larger;
- :func:`resolve_inside` turns a name read from a file (``state.json``'s
  ``filename``) into a path, refusing absolute names, ``..`` and symlinks
  leaving the folder;
- :func:`read_limited` reads a whole small file (a config, a template)
  refusing one over its bound before reading it (a sparse 1 TB file too);
- :func:`data_kind` names a file's format from its suffixes,
  case-insensitively (``B.PARQUET``, ``corpus.JSONL.GZ``);
  :func:`seqpack.io.sources.folder_files` lists a folder's data files of one
  format, refusing stray data files by name;
- :func:`open_stream` reads a file (or standard input, ``-``) through its
  decompressor (``.gz``, ``.zst``, ``.bz2``, ``.xz``) with the decompressed
  bytes bounded (:class:`ReadLimits`): a compression bomb is refused after
  a bounded amount of work, never buffered.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from seqpack.core.errors import InvalidInput

__all__ = [
    "CODECS",
    "DATA_SUFFIXES",
    "STDIN",
    "InputStream",
    "ReadLimits",
    "data_kind",
    "is_stdin",
    "iter_lines",
    "open_regular",
    "open_stream",
    "read_limited",
    "reopen",
    "resolve_inside",
]

_KINDS = {
    stat.S_IFIFO: "FIFO (named pipe)",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFSOCK: "socket",
    stat.S_IFDIR: "folder",
}
#: The name of standard input as an input (``seqpack pack -``); ``/dev/stdin`` too.
STDIN = "-"
#: Compression suffixes and the codec that reads them.
CODECS = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2",
          ".xz": "xz"}  # fmt: skip
#: Data suffixes seqpack reads and their kind (a compression suffix may follow JSON ones).
DATA_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
#: The most bytes a reader may peek at before the first record (then rewind).
_PEEK_BYTES = 64 << 20


@dataclass(frozen=True)
class ReadLimits:
    """How much reading one input may decode, fixed before anything is read.

    ``decoded_bytes``: the most bytes one unit read at a time may decode to (a
    Parquet row group's columns, a JSON array file, a decompressed stream per
    ``ratio`` test floor); ``ratio``: the most decompressed bytes per compressed
    byte of a whole compressed file (a gzip bomb is 1:1000 and more, text
    1:3-1:10); ``json_keys``: distinct keys across a JSON Lines file (a line
    each with a new key makes Arrow build a column per key: quadratic).
    """

    decoded_bytes: int = 4 << 30
    ratio: int = 200
    floor: int = 64 << 20
    json_keys: int = 1024

    def decompressed(self, compressed: int | None) -> int | None:
        """The most bytes a compressed file of ``compressed`` bytes may decompress to
        (None: standard input, unbounded in total; each read stays bounded)."""
        if compressed is None:
            return None
        return max(self.floor, compressed * self.ratio)


def is_stdin(path: str | Path) -> bool:
    return str(path) in (STDIN, "/dev/stdin")


def _refuse_kind(path: Path | str, kind: int) -> None:
    if kind != stat.S_IFREG:
        what = _KINDS.get(kind, "special file")
        raise InvalidInput(
            f"{path} is a {what}, not a regular file — seqpack reads regular files only (a pipe"
            " can block and a device never ends); write the data to a file first"
        )


def _check_root(path: Path, root: Path | str) -> None:
    real, top = os.path.realpath(path), os.path.realpath(root)
    if os.path.commonpath([real, top]) != top:
        raise InvalidInput(
            f"{path} resolves to {real}, outside the input {root} — seqpack reads only files"
            " inside the input it is given (no '..', absolute paths or symlinks leaving it)"
        )


def _refuse_size(path: Path | str, size: int, max_bytes: int | None) -> None:
    if max_bytes is not None and size > max_bytes:
        raise InvalidInput(
            f"{path} holds {size:,} bytes, more than the {max_bytes:,} seqpack reads of such a"
            " file — check the file (a sparse or runaway file?), or raise the bound"
            " (--max-metadata-bytes)"
        )


def open_regular(
    path: str | Path, *, root: str | Path | None = None, max_bytes: int | None = None
) -> BinaryIO:
    """``path`` opened for reading, refused unless a regular file (inside ``root``, at most
    ``max_bytes``), with one :class:`InvalidInput` line naming it.

    Checked before and after opening (``O_NONBLOCK``, then ``fstat`` against the
    file checked), so a FIFO never blocks the open and a file swapped in between is
    caught.
    """
    path = Path(path)
    try:
        before = os.stat(path)
        _refuse_kind(path, stat.S_IFMT(before.st_mode))
        if root is not None:
            _check_root(path, root)
        _refuse_size(path, before.st_size, max_bytes)
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags)
    except OSError as err:  # unreadable, a symlink loop, gone
        raise InvalidInput(f"{path}: cannot read it ({err.strerror or err})") from None
    try:
        after = os.fstat(fd)
        _refuse_kind(path, stat.S_IFMT(after.st_mode))
        if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
            raise InvalidInput(f"{path} was replaced while it was opened — run again")
        _refuse_size(path, after.st_size, max_bytes)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_limited(path: str | Path, max_bytes: int, *, root: str | Path | None = None) -> bytes:
    """The whole of a small file (a config, a template, ``state.json``): refused over
    ``max_bytes`` before a byte is read, and again if it grows while read."""
    with open_regular(path, root=root, max_bytes=max_bytes) as f:
        data = f.read(max_bytes + 1)
    _refuse_size(path, len(data), max_bytes)
    return data


def resolve_inside(root: str | Path, name: str, what: str = "a file") -> Path:
    """``root / name`` for a ``name`` read from a file in ``root``, refused unless it stays
    inside ``root``: no absolute name, no ``..``, no symlink leaving it."""
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if not name or name.startswith(("/", "\\")) or ".." in parts or ":" in name[:3]:
        raise InvalidInput(
            f"{root} names {what} {name!r} outside itself — seqpack reads only files inside the"
            " folder it is given; save the folder again (e.g. Dataset.save_to_disk)"
        )
    path = Path(root, *parts)
    if os.path.lexists(path):
        _check_root(path, root)
    return path


def data_kind(name: str | Path) -> tuple[str | None, str | None]:
    """``(kind, codec)`` of a file name, case-insensitively: ``("jsonl", "gzip")`` for
    ``A.JSONL.GZ``, ``("parquet", None)`` for ``b.PARQUET``; ``(None, None)`` when seqpack
    does not read it. A compressed Parquet file is no kind (Parquet compresses inside)."""
    suffixes = [s.lower() for s in Path(str(name)).suffixes]
    codec = CODECS.get(suffixes[-1]) if suffixes else None
    if codec is not None:
        suffixes = suffixes[:-1]
    kind = DATA_SUFFIXES.get(suffixes[-1]) if suffixes else None
    if kind == "parquet" and codec is not None:
        return None, None
    return kind, codec if kind else None


class InputStream:
    """A file read through its decompressor (or as it is), bounded and counted.

    ``read(n)`` returns at most ``n`` decompressed bytes; reading past
    ``limit`` decompressed bytes raises :class:`InvalidInput` (a compression
    bomb). ``position`` is the compressed bytes consumed so far (progress);
    ``seek(0)`` is allowed while no more than the first read block was used,
    so a reader may peek at the first bytes of standard input.
    """

    def __init__(self, name: str, raw: BinaryIO, codec: str | None, limit: int | None) -> None:
        self.name, self.raw, self.codec, self.limit = name, raw, codec, limit
        self.out = 0
        self._head: bytes | None = b""
        self._replay: int | None = None
        self._recording = True
        self._stream = _decoder(raw, codec)

    @property
    def position(self) -> int:
        try:
            return self.raw.tell()
        except (OSError, ValueError):
            return self.out

    def _read(self, n: int) -> bytes:
        try:
            data = self._stream.read(n)
        except (OSError, EOFError, ValueError) as err:  # a damaged compressed stream
            raise InvalidInput(
                f"{self.name}: cannot decompress it as {self.codec} ({err}) — the file is damaged"
                " or not what its suffix says"
            ) from None
        data = bytes(data)
        self.out += len(data)
        if self.limit is not None and self.out > self.limit:
            raise InvalidInput(
                f"{self.name} decompresses to more than {self.limit:,} bytes (over"
                f" {self.limit // max(1, self.raw_size):,}x its size: a compression bomb?) —"
                " decompress it yourself if it is genuine, and pack the plain file"
            )
        return data

    @property
    def raw_size(self) -> int:
        try:
            return os.fstat(self.raw.fileno()).st_size
        except (OSError, ValueError, AttributeError):
            return 0

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = 1 << 62
        head, at = self._head, self._replay
        if at is not None and head is not None and at < len(head):
            data = head[at : at + n]
            self._replay = at + len(data)
            if len(data) == n:
                return data
            n -= len(data)
        else:
            data = b""
        more = self._read(n)
        if self._recording and self._head is not None:
            self._head += more  # kept while a peek may still rewind
            self._replay = len(self._head)
            if len(self._head) > _PEEK_BYTES:
                raise InvalidInput(
                    f"{self.name} starts with more than {_PEEK_BYTES >> 20} MiB of blank space"
                    " — strip it"
                )
        elif self._head is not None and self._replay is not None:
            self._head, self._replay = None, None  # replayed once: gone
        return data + more

    def seek(self, offset: int, whence: int = 0) -> int:
        if offset != 0 or whence != 0 or not self._recording:
            raise InvalidInput(f"{self.name}: a stream can only be read once, in order")
        self._replay = 0
        return 0

    def settle(self) -> None:
        """No rewind after this: what was peeked is replayed once, then dropped."""
        self._recording = False
        if self._head is not None and (self._replay or 0) >= len(self._head):
            self._head, self._replay = None, None

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._stream.close()
        if self.raw is not sys.stdin.buffer:
            self.raw.close()

    def __enter__(self) -> InputStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _decoder(raw: BinaryIO, codec: str | None) -> BinaryIO:
    if codec is None:
        return raw
    if codec == "xz":
        import lzma

        return lzma.open(raw, "rb")  # type: ignore[return-value]
    import pyarrow as pa  # gzip, zstd and bz2 in C++, the GIL released while decoding

    return pa.CompressedInputStream(pa.PythonFile(raw, mode="r"), codec)  # type: ignore[return-value]


def open_stream(
    path: str | Path,
    *,
    root: str | Path | None = None,
    limits: ReadLimits | None = None,
) -> InputStream:
    """``path`` (``-`` or ``/dev/stdin``: standard input) for reading in order, decompressed
    by its suffix (:data:`CODECS`), through :func:`open_regular`'s checks; a compressed file
    may decompress to :meth:`ReadLimits.decompressed` bytes at most."""
    limits = limits or ReadLimits()
    if is_stdin(path):
        return InputStream("<stdin>", sys.stdin.buffer, None, None)
    _, codec = data_kind(path)
    raw = open_regular(path, root=root)
    limit = limits.decompressed(os.fstat(raw.fileno()).st_size) if codec else None
    return InputStream(str(path), raw, codec, limit)


def reopen(name: str | Path) -> InputStream | None:
    """A file named in an error again from its start (decompressed as when it was read),
    to find a line; None for standard input or a file that is gone (no second read)."""
    if str(name) == "<stdin>" or is_stdin(name):
        return None
    try:
        return open_stream(name)
    except InvalidInput:
        return None


def iter_lines(stream: InputStream, block: int = 1 << 20) -> Iterator[bytes]:
    """The lines of ``stream`` (each with its newline), read in blocks of ``block`` bytes."""
    carry = b""
    while data := stream.read(block):
        parts = (carry + data).split(b"\n")
        carry = parts.pop()
        for part in parts:
            yield part + b"\n"
    if carry:
        yield carry
