"""Memory-mapped files whose pages can be handed back: reading a corpus in bounded memory.

A page of a memory-mapped file counts in the process's resident memory
once it is touched, until the mapping goes. Gathering an output shard from
a corpus mapped whole touches pages everywhere; :meth:`MappedFile.release`
(``madvise(MADV_DONTNEED)``) drops them from this process after each
shard (they stay in the page cache and on disk, and are read again when
touched), so resident memory is bounded by what one shard touches, not by
the corpus.
"""

from __future__ import annotations

import contextlib
import mmap
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa


class MappedFile:
    """``file`` (opened for reading) mapped read-only; ``buffer`` is a zero-copy Arrow view."""

    def __init__(self, path: Path, file: BinaryIO) -> None:
        self.path = path
        self._file = file
        size = file.seek(0, 2)
        file.seek(0)
        self._map: mmap.mmap | None = (
            mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ) if size else None
        )
        self.buffer = pa.py_buffer(self._map) if self._map is not None else pa.py_buffer(b"")

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
