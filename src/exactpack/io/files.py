"""The input policy every reader opens files through: regular files only
(:func:`open_regular`), inside the input (:func:`resolve_inside`), of bounded size
(:func:`read_limited`), decompressed with a bound (:func:`open_stream`,
:class:`ReadLimits`); :func:`resolve_files` lists an input's files. Every refusal is
one :class:`InvalidInput` line naming the path.
"""

from __future__ import annotations

import contextlib
import glob
import os
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from exactpack.core.errors import InvalidInput, foreign

_KINDS = {stat.S_IFIFO: "FIFO (named pipe)", stat.S_IFCHR: "character device", stat.S_IFDIR:
          "folder", stat.S_IFBLK: "block device", stat.S_IFSOCK: "socket"}  # fmt: skip
#: The name of standard input as an input (``exactpack pack -``); ``/dev/stdin`` too.
STDIN = "-"
#: Compression suffixes and the codec that reads them.
CODECS = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2",
          ".xz": "xz"}  # fmt: skip
#: Data suffixes exactpack reads and their kind (a compression suffix may follow all but
#: Parquet's); ``text``: one document per line, as the ``datasets`` "text" builder reads it.
DATA_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet",
                 ".txt": "text"}  # fmt: skip
#: What a kind is called in messages.
KIND_NAMES = {"parquet": "parquet", "jsonl": "JSON Lines", "text": "text"}
#: The most bytes a reader may peek at before the first record (then rewind).
_PEEK_BYTES = 64 << 20
#: What a line of a compressed file costs toward its decompression limit beside its bytes:
#: the document it becomes (offsets, an id, tokens, table rows) takes more (about 480
#: bytes for an empty line packed with --tokenizer bytes), short real lines far less.
LINE_BYTES = 256
BOM = b"\xef\xbb\xbf"
#: Files a data folder may hold beside its shards (metadata no reader needs).
SIDE_FILES = ("dataset_info.json", "state.json", "dataset_dict.json", "_success", "_metadata",
              "_common_metadata", "license", "license.txt", "readme.txt")  # fmt: skip
SIDE_SUFFIXES = (".md", ".crc", ".lock", ".sha256", ".yaml", ".yml", ".toml")


@dataclass(frozen=True)
class ReadLimits:
    """How much reading one input may decode, fixed before anything is read.

    ``decoded_bytes``: the most one unit read at a time may decode to (a Parquet
    row group's columns, a JSON array file); ``ratio``: the most decompressed bytes
    per compressed byte of a compressed file, above ``floor``; ``json_keys``:
    distinct keys across a JSON Lines file (Arrow builds a column per key).
    """

    decoded_bytes: int = 4 << 30
    ratio: int = 200
    floor: int = 64 << 20
    json_keys: int = 1024

    def decompressed(self, compressed: int | None) -> int | None:
        """The most bytes ``compressed`` bytes may decompress to (None: standard input)."""
        return None if compressed is None else max(self.floor, compressed * self.ratio)


def is_stdin(path: str | Path) -> bool:
    return str(path) in (STDIN, "/dev/stdin")


def _refuse_kind(path: Path | str, kind: int) -> None:
    if kind != stat.S_IFREG:
        raise InvalidInput(
            f"{path} is a {_KINDS.get(kind, 'special file')}, not a regular file — exactpack reads"
            " regular files only (a pipe can block and a device never ends); write the data to"
            " a file first"
        )


def _check_root(path: Path, root: Path | str) -> None:
    real, top = os.path.realpath(path), os.path.realpath(root)
    if os.path.commonpath([real, top]) != top:
        raise InvalidInput(
            f"{path} resolves to {real}, outside the input {root} — exactpack reads only files"
            " inside the input it is given (no '..', absolute paths or symlinks leaving it)"
        )


def _refuse_size(path: Path | str, size: int, max_bytes: int | None) -> None:
    if max_bytes is not None and size > max_bytes:
        raise InvalidInput(
            f"{path} holds {size:,} bytes, more than the {max_bytes:,} exactpack reads of such a"
            " file — check the file (a sparse or runaway file?), or raise the bound"
            " (--max-metadata-bytes)"
        )


def open_regular(
    path: str | Path, *, root: str | Path | None = None, max_bytes: int | None = None
) -> BinaryIO:
    """``path`` opened for reading, refused unless a regular file (inside ``root``, at most
    ``max_bytes``); checked before and after the open, so a FIFO never blocks it and a
    file swapped in between is caught."""
    path = Path(path)
    with foreign(f"{path}: cannot read it"):  # unreadable, a symlink loop, gone
        before = os.stat(path)
        _refuse_kind(path, stat.S_IFMT(before.st_mode))
        if root is not None:
            _check_root(path, root)
        _refuse_size(path, before.st_size, max_bytes)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
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
    """The whole of a small file, refused over ``max_bytes`` before a byte is read, and
    again if it grows while read."""
    with open_regular(path, root=root, max_bytes=max_bytes) as f:
        data = f.read(max_bytes + 1)
    _refuse_size(path, len(data), max_bytes)
    return data


def resolve_inside(root: str | Path, name: str, what: str = "a file") -> Path:
    """``root / name`` for a ``name`` read from a file in ``root``, refused unless it stays
    inside ``root``: no absolute name, no ``..``, no drive, no symlink leaving it."""
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if not name or name.startswith(("/", "\\")) or ".." in parts or ":" in name[:3]:
        raise InvalidInput(
            f"{root} names {what} {name!r} outside itself — exactpack reads only files inside the"
            " folder it is given; save the folder again (e.g. Dataset.save_to_disk)"
        )
    path = Path(root, *parts)
    if os.path.lexists(path):
        _check_root(path, root)
    return path


def data_kind(name: str | Path) -> tuple[str | None, str | None]:
    """``(kind, codec)`` of a file name, case-insensitively: ``("jsonl", "gzip")`` for
    ``A.JSONL.GZ``, ``("parquet", None)`` for ``b.PARQUET``, ``(None, None)`` for what
    exactpack does not read (a compressed Parquet file too: Parquet compresses inside)."""
    *rest, last = ["", *(s.lower() for s in Path(str(name)).suffixes)]
    codec = CODECS.get(last)
    kind = DATA_SUFFIXES.get(rest[-1] if codec else last)
    return (None, None) if kind is None or (kind == "parquet" and codec) else (kind, codec)


def is_datasets_folder(path: Path) -> bool:
    return os.path.lexists(path / "state.json") or os.path.lexists(path / "dataset_dict.json")


def folder_files(folder: Path) -> tuple[str, tuple[Path, ...]]:
    """The data files of ``folder`` (sorted by name) and their kind. Refused, naming the
    files: two formats, a subfolder or a file of a format exactpack does not read beside
    the shards (it would be left out silently), no data file, a packed folder.
    Metadata beside shards (``dataset_info.json``, ``*.md``, hidden files) is ignored."""
    found: dict[str, list[Path]] = {}
    stray: list[str] = []
    with foreign(f"{folder}: cannot list it"):
        entries = sorted(folder.iterdir(), key=lambda p: p.name)
    if os.path.lexists(folder / "manifest.json") and any(
        data_kind(e.name)[0] == "parquet" for e in entries
    ):
        raise InvalidInput(
            f"{folder} holds manifest.json beside Parquet shards: a exactpack packed folder, not"
            " raw data — pack its source instead, or read it with exactpack.io.load_packed"
        )
    for entry in entries:
        low = entry.name.lower()
        if low.startswith((".", "_")) or low in SIDE_FILES or low.endswith(SIDE_SUFFIXES):
            continue
        kind, _ = data_kind(entry.name)
        if entry.is_dir() or kind is None:
            stray.append(entry.name + ("/" if entry.is_dir() else ""))
        else:
            found.setdefault(kind, []).append(entry)
    if len(found) > 1:
        counts = " and ".join(f"{len(files)} {KIND_NAMES[k]}" for k, files in found.items())
        raise InvalidInput(
            f"{folder} mixes formats ({counts} files) — keep one format per folder; exactpack would"
            " otherwise read only some of the rows"
        )
    if not found:
        raise InvalidInput(
            f"{folder} holds no *.parquet or *.jsonl shards (nor *.txt files) and is not a"
            " datasets save_to_disk folder"
        )
    if stray:
        shown = ", ".join(stray[:5]) + (f" and {len(stray) - 5} more" if len(stray) > 5 else "")
        raise InvalidInput(
            f"{folder} holds {shown} beside its shards, which exactpack does not read — move them"
            " out (or convert them) so that no rows are left out silently"
        )
    kind, files = next(iter(found.items()))
    return kind, tuple(files)


def resolve_files(
    sources: Sequence[str | Path],
) -> tuple[str, tuple[Path, ...], tuple[Path | None, ...]]:
    """The files of one or more paths (a file, a folder of shards, a glob, ``-``), in order:
    ``(kind, files, roots)`` with each file's folder (None: named by the user). All must be
    of one kind; ``datasets`` folders are :func:`exactpack.io.readers.open_input`'s."""
    found: list[tuple[str, Path, Path | None]] = []  # (kind, file, root) in order
    for source in sources:
        text = str(source)
        if is_stdin(text):
            found.append(("jsonl", Path("-"), None))
            continue
        matches = [Path(text)]
        if not os.path.lexists(text) and glob.has_magic(text):
            matches = [Path(m) for m in sorted(glob.glob(text))]
            if not matches:
                raise InvalidInput(f"input {text!r} matches no file — check the pattern")
        for match in matches:
            if not match.exists():  # a dangling link too
                raise InvalidInput(f"input {str(match)!r} does not exist — check the path")
            if match.is_dir():
                if is_datasets_folder(match):
                    raise InvalidInput(
                        f"{match} is a datasets save_to_disk folder: give it as the only input"
                    )
                kind, shards = folder_files(match)
                found += [(kind, shard, match) for shard in shards]
            elif (kind := data_kind(match)[0]) is None:
                suffix = "".join(match.suffixes[-2:]).lower() or match.name
                raise InvalidInput(
                    f"{match}: unknown input type {suffix!r} — use .jsonl, .json, .parquet, .txt"
                    " (one document per line; JSON Lines and text may be compressed: .gz, .zst,"
                    " .bz2, .xz), a folder of such shards, a datasets save_to_disk folder, or -"
                    " for standard input"
                )
            else:
                found.append((kind, match, None))
    kinds = {kind for kind, _, _ in found}
    if len(kinds) > 1:
        names = " and ".join(KIND_NAMES[k] for k in KIND_NAMES if k in kinds)
        names = names.replace("parquet", "Parquet")
        raise InvalidInput(
            f"the inputs mix {names} files — pack one format at a time, or convert one of them"
        )
    return kinds.pop(), tuple(f for _, f, _ in found), tuple(r for _, _, r in found)


class InputStream:
    """A file read through its decompressor (or as it is), bounded and counted.

    ``read(n)`` returns at most ``n`` decompressed bytes; past ``limit`` it raises
    :class:`InvalidInput` (a compression bomb). ``position`` is the compressed bytes
    consumed (progress); :meth:`first_byte` peeks at the start, even of standard input.
    """

    def __init__(self, name: str, raw: BinaryIO, codec: str | None, limit: int | None) -> None:
        self.name, self.raw, self.codec, self.limit = name, raw, codec, limit
        self.out, self.lines, self._head = 0, 0, b""
        self._stream = _decoder(raw, codec)

    @property
    def position(self) -> int:
        try:
            return self.raw.tell()
        except (OSError, ValueError):
            return self.out

    def _read(self, n: int) -> bytes:
        what = f"{self.name}: cannot decompress it as {self.codec}"
        with foreign(what, "the file is damaged or not what its suffix says"):
            data = bytes(self._stream.read(n))
        self.out += len(data)
        self._check()
        return data

    def charge_lines(self, lines: int) -> None:
        """Count ``lines`` read toward the limit, :data:`LINE_BYTES` each: every line becomes
        a document, empty or not, so a file of newlines must trip the limit long before
        its documents fill memory (1 MB of gzip holds a billion empty lines)."""
        self.lines += lines
        self._check()

    def _check(self) -> None:
        if self.limit is None or self.out + self.lines * LINE_BYTES <= self.limit:
            return
        raw_size = os.fstat(self.raw.fileno()).st_size  # a limit is set on files only
        by_lines = self.lines * LINE_BYTES > self.out  # its lines tripped it: say so
        lines = (
            f" counting {LINE_BYTES} bytes for each of its {self.lines:,}+ lines"
            if by_lines
            else ""
        )
        raise InvalidInput(
            f"{self.name} decompresses to more than {self.limit:,} bytes{lines} (over"
            f" {self.limit // max(1, raw_size):,}x its size: a compression bomb?) —"
            " decompress it yourself if it is genuine, and pack the plain file"
        )

    def read(self, n: int = -1) -> bytes:
        n = 1 << 62 if n is None or n < 0 else n
        head, self._head = self._head[:n], self._head[n:]  # what first_byte read, once
        return head + self._read(n - len(head)) if len(head) < n else head

    def first_byte(self) -> bytes:
        """The first byte that is not JSON whitespace (nor a UTF-8 byte-order mark), b"" if
        none; what was read to find it is read again by :meth:`read`."""
        parts: list[bytes] = []
        found = b""
        while not found and (block := self._read(1 << 16)):
            parts.append(block)
            if len(parts) << 16 > _PEEK_BYTES:
                raise InvalidInput(
                    f"{self.name} starts with more than {_PEEK_BYTES >> 20} MiB of blank space"
                    " — strip it"
                )
            found = block.removeprefix(BOM if len(parts) == 1 else b"").lstrip(b" \t\r\n")[:1]
        self._head = b"".join(parts) + self._head
        return found

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
    path: str | Path, *, root: str | Path | None = None, limits: ReadLimits | None = None
) -> InputStream:
    """``path`` (``-`` or ``/dev/stdin``: standard input) for reading in order, decompressed
    by its suffix through :func:`open_regular`'s checks, bounded by ``limits``."""
    if is_stdin(path):
        return InputStream("<stdin>", sys.stdin.buffer, None, None)
    _, codec = data_kind(path)
    raw = open_regular(path, root=root)
    limit = (limits or ReadLimits()).decompressed(os.fstat(raw.fileno()).st_size)
    return InputStream(str(path), raw, codec, limit if codec else None)


def reopen(name: str | Path) -> InputStream | None:
    """A file named in an error again from its start (to find a line); None for standard
    input or a file that is gone (no second read)."""
    if str(name) != "<stdin>" and not is_stdin(name):
        with contextlib.suppress(InvalidInput):
            return open_stream(name)
    return None
