"""The spill: token chunks written once to a temporary Arrow IPC file, read back memory-mapped.

Each :class:`~exactpack.io.documents.TokenChunk` is one record batch; :meth:`Spill.open` maps
the file and gives the chunks back as views of the map. The file is an unnamed
:func:`tempfile.TemporaryFile`, gone after success, failure or any kill; folders made for
it are removed on close. :meth:`MappedFile.release` drops the pages read so far.
"""

from __future__ import annotations

import contextlib
import mmap
import tempfile
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa

from exactpack.core.errors import InvalidInput, naming
from exactpack.io.atomic import make_folders, remove_folders
from exactpack.io.documents import Origin, TokenChunk
from exactpack.io.shards import numpy_array


class MappedFile:
    """``file`` (opened for reading) mapped read-only; ``buffer`` is a zero-copy Arrow view."""

    def __init__(self, path: Path, file: BinaryIO) -> None:
        self.path, self._file = path, file
        size = file.seek(0, 2)
        file.seek(0)
        self._map = mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ) if size else None
        self.buffer = pa.py_buffer(self._map if self._map is not None else b"")

    def release(self) -> None:
        """Drop this file's resident pages from the process (the data stays readable)."""
        if self._map is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def release_span(self, address: int, nbytes: int) -> None:
        """Drop the pages holding ``nbytes`` at ``address`` (a view of this map; other
        addresses are ignored). A page shared with other data is only read again."""
        if self._map is None or not hasattr(mmap, "MADV_DONTNEED") or nbytes <= 0:
            return
        start = address - self.buffer.address
        size = len(self._map)
        if not 0 <= start < size:
            return
        low = start - start % mmap.PAGESIZE
        self._map.madvise(mmap.MADV_DONTNEED, low, min(size, start + nbytes) - low)

    def close(self) -> None:
        """Unmap when no Arrow or NumPy view is left (else the views keep it alive)."""
        self.buffer = pa.py_buffer(b"")
        if self._map is not None:
            with contextlib.suppress(BufferError):  # views still exported: they keep the map
                self._map.close()
            self._map = None
        self._file.close()


SCHEMA = pa.schema(
    {"tokens": pa.large_list(pa.int32()), "flags": pa.large_list(pa.uint8()), "id": pa.string()}
)


class Spill:
    """An append-only, unnamed Arrow IPC file of token chunks in ``folder``."""

    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        self._made: list[Path] = []
        try:
            self._made = make_folders(folder)
            # unbuffered: Arrow writes whole buffers
            self._file = tempfile.TemporaryFile(  # noqa: SIM115 - closed by close()
                dir=folder, prefix=".exactpack-spill-", buffering=0
            )
        except OSError as err:
            remove_folders(self._made)
            raise InvalidInput(
                f"cannot create the spill file in {folder} ({err.strerror or err}) — pass a"
                " writable --spill-dir with room for the corpus's tokens"
            ) from None
        self.path = folder
        with naming(f"{self.path} (--spill-dir)"):
            self._writer: pa.ipc.RecordBatchFileWriter | None = pa.ipc.new_file(self._file, SCHEMA)
        self._mapped: MappedFile | None = None

    def append(self, chunk: TokenChunk) -> None:
        """Write ``chunk``'s tokens (as int32), flags and ids as one record batch."""
        assert self._writer is not None, "the spill was opened for reading"
        k = len(chunk)
        offsets = numpy_array(chunk.offsets, pa.int64())
        tokens = pa.LargeListArray.from_arrays(offsets, numpy_array(chunk.tokens, pa.int32()))
        if chunk.flags is None:
            flags = pa.nulls(k, SCHEMA.field("flags").type)
        else:
            targets = chunk.offsets - np.arange(k + 1, dtype=np.int64)
            values = numpy_array(chunk.flags.view(np.uint8), pa.uint8())
            flags = pa.LargeListArray.from_arrays(numpy_array(targets, pa.int64()), values)
        ids = pa.nulls(k, pa.string()) if chunk.ids is None else chunk.ids.cast(pa.string())
        batch = pa.record_batch([tokens, flags, ids], schema=SCHEMA)
        with naming(f"{self.path} (--spill-dir)"):
            self._writer.write_batch(batch)

    def open(self, origins: list[Origin], first_rows: list[int]) -> list[TokenChunk]:
        """Finish writing and map the file: every chunk, in order, as views of the map."""
        assert self._writer is not None, "the spill is already open"
        with naming(f"{self.path} (--spill-dir)"):
            self._writer.close()
            self._writer = None
            self._file.flush()
        self._mapped = MappedFile(self.path, self._file)
        reader = pa.ipc.open_file(pa.BufferReader(self._mapped.buffer))
        chunks = []
        for i, (origin, first) in enumerate(zip(origins, first_rows, strict=True)):
            tokens, flags, ids = reader.get_batch(i).columns
            flags = None if flags.null_count else flags.values.to_numpy().view(bool)
            ids = None if ids.null_count else ids
            offsets = tokens.offsets.to_numpy()
            chunks.append(TokenChunk(tokens.values.to_numpy(), offsets, flags, ids, origin, first))
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
        if self._writer is not None:  # discarded: a full disk must not hide the first error
            with contextlib.suppress(pa.ArrowException, OSError):
                self._writer.close()
            self._writer = None
        if self._mapped is not None:
            self._mapped.close()
            self._mapped = None
        else:
            self._file.close()
        remove_folders(self._made)
