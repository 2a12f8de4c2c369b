"""The spill: token chunks written once to a temporary Arrow IPC file, read back memory-mapped.

Packing a corpus larger than memory reads and tokenizes it chunk by chunk;
each :class:`~seqpack.io.documents.TokenChunk` is appended to the spill as
one record batch and dropped, so only the lengths stay in memory. When the
corpus is read, :meth:`Spill.open` maps the file and gives every chunk back
as views of the map (no copy; pages are read when an output shard gathers
its windows, and :meth:`Spill.release` hands them back after each shard).

The file never has a name where the system allows it (Linux ``O_TMPFILE``):
it lives exactly as long as this process holds it open, so it is gone after
success, failure, SIGTERM or SIGKILL alike (the kernel frees an unnamed file
when its last descriptor closes). Elsewhere it is created as
``.seqpack-spill-HOST-PID-RANDOM.arrow`` and unlinked at once (or, where an
open file cannot be unlinked, when the spill closes); a spill left by a
killed writer is removed by the next run's :func:`recover_spills`.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import socket
from pathlib import Path

import numpy as np
import pyarrow as pa

from seqpack.core.errors import InvalidInput
from seqpack.io.documents import Origin, TokenChunk
from seqpack.io.lock import pid_alive
from seqpack.io.mapped import MappedFile

SCHEMA = pa.schema(
    [
        ("tokens", pa.large_list(pa.int32())),
        ("flags", pa.large_list(pa.uint8())),
        ("id", pa.string()),
    ]
)


def _values(array: np.ndarray, kind: pa.DataType) -> pa.Array:
    array = np.ascontiguousarray(array, dtype=kind.to_pandas_dtype())
    return pa.Array.from_buffers(kind, array.shape[0], [None, pa.py_buffer(array)])


_NAME = re.compile(r"^\.seqpack-spill-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{8}\.arrow$")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def _create(folder: Path) -> tuple[int, Path | None]:
    """A file for reading and writing in ``folder``: unnamed where the system can, else
    named for :func:`recover_spills` and unlinked at once; (descriptor, name still held)."""
    flag = getattr(os, "O_TMPFILE", 0)
    if flag:
        try:
            return os.open(folder, flag | os.O_RDWR, 0o600), None
        except OSError:  # the file system has no unnamed files
            pass
    path = folder / f".seqpack-spill-{_host()}-{os.getpid()}-{secrets.token_hex(4)}.arrow"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.unlink(path)
        return fd, None
    except OSError:  # an open file cannot be unlinked here: removed on close
        return fd, path


def recover_spills(folder: str | Path) -> list[str]:
    """Remove the named spills in ``folder`` of writers that ran on this host and are gone;
    one note per file removed."""
    folder = Path(folder)
    notes: list[str] = []
    if not folder.is_dir():
        return notes
    for path in sorted(folder.iterdir()):
        match = _NAME.match(path.name)
        if match is None or match["host"] != _host() or not path.is_file():
            continue
        pid = int(match["pid"])
        if pid == os.getpid() or pid_alive(pid):
            continue
        path.unlink(missing_ok=True)
        notes.append(f"removed {path.name}, the token spill of a killed run")
    return notes


class Spill:
    """An append-only, unnamed Arrow IPC file of token chunks in ``folder``."""

    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, self.path = _create(folder)
        except OSError as err:
            raise InvalidInput(
                f"cannot create the spill file in {folder} ({err.strerror or err}) — pass a"
                " writable --spill-dir with room for the corpus's tokens"
            ) from None
        self._file = os.fdopen(fd, "w+b", buffering=0)  # Arrow writes whole buffers
        self._writer: pa.ipc.RecordBatchFileWriter | None = pa.ipc.new_file(self._file, SCHEMA)
        self._mapped: MappedFile | None = None
        self.bytes = 0

    def append(self, chunk: TokenChunk) -> None:
        """Write ``chunk``'s tokens (as int32), flags and ids as one record batch."""
        assert self._writer is not None, "the spill was opened for reading"
        k = len(chunk)
        offsets = _values(chunk.offsets, pa.int64())
        tokens = pa.LargeListArray.from_arrays(offsets, _values(chunk.tokens, pa.int32()))
        if chunk.flags is None:
            flags = pa.nulls(k, SCHEMA.field("flags").type)
        else:
            targets = chunk.offsets - np.arange(k + 1, dtype=np.int64)
            values = _values(chunk.flags.view(np.uint8), pa.uint8())
            flags = pa.LargeListArray.from_arrays(_values(targets, pa.int64()), values)
        ids = pa.nulls(k, pa.string()) if chunk.ids is None else chunk.ids.cast(pa.string())
        batch = pa.record_batch([tokens, flags, ids], schema=SCHEMA)
        self._writer.write_batch(batch)
        self.bytes += batch.nbytes

    def open(self, origins: list[Origin], first_rows: list[int]) -> list[TokenChunk]:
        """Finish writing and map the file: every chunk, in order, as views of the map."""
        assert self._writer is not None, "the spill is already open"
        self._writer.close()
        self._writer = None
        self._file.flush()
        self._mapped = MappedFile(Path(self.path or "spill"), self._file)
        reader = pa.ipc.open_file(pa.BufferReader(self._mapped.buffer))
        chunks = []
        for i, (origin, first) in enumerate(zip(origins, first_rows, strict=True)):
            batch = reader.get_batch(i)
            tokens, flags, ids = batch.columns
            chunks.append(
                TokenChunk(
                    tokens=tokens.values.to_numpy(),
                    offsets=tokens.offsets.to_numpy(),
                    flags=None if flags.null_count else flags.values.to_numpy().view(bool),
                    ids=None if ids.null_count else ids,
                    origin=origin,
                    first_row=first,
                )
            )
        return chunks

    def release(self) -> None:
        """Drop the pages read so far from this process (they stay on disk)."""
        if self._mapped is not None:
            self._mapped.release()

    @property
    def mapped(self) -> list[MappedFile]:
        """The spill's map, once :meth:`open` made it."""
        return [] if self._mapped is None else [self._mapped]

    def close(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(pa.ArrowException):
                self._writer.close()
            self._writer = None
        if self._mapped is not None:
            self._mapped.close()
            self._mapped = None
        else:
            self._file.close()
        if self.path is not None:
            self.path.unlink(missing_ok=True)
