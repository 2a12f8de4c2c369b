"""Opening input files safely: regular files only, checked without ever blocking.

A FIFO opened for reading blocks until a writer appears (forever, for a
stray pipe), a device such as ``/dev/zero`` never ends, a socket cannot be
read as a file: :func:`open_regular` refuses them all with one line, before
and after opening (``O_NONBLOCK``, then ``fstat``), so a file swapped for a
pipe in between is caught too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from seqpack.core.errors import InvalidInput

_KINDS = {
    stat.S_IFIFO: "FIFO (named pipe)",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFSOCK: "socket",
    stat.S_IFDIR: "folder",
}


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading, refused unless it is a regular file.

    Checked before and after opening (``O_NONBLOCK``, then ``fstat``), so a
    FIFO never blocks the open and a file swapped for one in between is caught.
    """
    try:
        kind = stat.S_IFMT(os.stat(path).st_mode)
        _require_regular(path, kind)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:  # unreadable, a symlink loop, gone
        raise InvalidInput(f"{path}: cannot read it ({err.strerror or err})") from None
    try:
        _require_regular(path, stat.S_IFMT(os.fstat(fd).st_mode))
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _require_regular(path: Path, kind: int) -> None:
    if kind != stat.S_IFREG:
        what = _KINDS.get(kind, "special file")
        raise InvalidInput(
            f"{path} is a {what}, not a regular file — seqpack reads regular files only (a pipe"
            " can block and a device never ends); write the data to a file first"
        )
