"""Atomic output folders: built hidden, published by one rename, recovered after kills.

A folder ``out`` is built beside itself as ``.NAME.seqpack-tmp-HOST-PID-RANDOM``
and renamed into place only when complete::

    .packed.seqpack-tmp-node1-4242-9f3c01aa/   shards, then manifest.json (fsynced)
    packed/                                    appears in one rename

Replacing an existing ``out`` (``--overwrite``) exchanges the two folders in
one step (Linux ``renameat2(RENAME_EXCHANGE)``), so ``out`` is at every
instant either the old complete folder or the new one; where that call is
missing the old folder is first renamed to ``.NAME.seqpack-old-RANDOM``. A
run killed part-way leaves only hidden folders. :func:`recover_output`, run
by the next ``seqpack pack`` at the same path, removes those whose writer is
dead (same host, process gone, only seqpack files inside) and restores an
old folder that an interrupted replacement had moved aside.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import re
import secrets
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

from seqpack.core.errors import InvalidInput

MANIFEST = "manifest.json"
#: A hidden folder of a seqpack run: ``.NAME.seqpack-tmp-…`` or ``.NAME.seqpack-old-…``.
HIDDEN = re.compile(r"^\..+\.seqpack-(tmp|old)-")
#: Files a writer puts in its temporary folder (shards, manifest, shard parts).
_OURS = re.compile(
    r"^(shard-\d{5,}\.parquet|manifest\.json|\.shard-\d{5,}\.parquet\.[0-9a-f]+\.part)$"
)


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def check_output(out: str | Path, overwrite: bool) -> Path:
    """Refuse an existing ``out`` unless ``overwrite`` and it is a seqpack output (or empty)."""
    path = Path(out)
    if HIDDEN.match(path.name):
        raise InvalidInput(f"{path}: names a temporary seqpack folder — choose another --out")
    if not path.exists():
        return path
    if not overwrite:
        raise InvalidInput(f"{path} already exists — pass --overwrite to replace it")
    if not path.is_dir() or (any(path.iterdir()) and not (path / MANIFEST).is_file()):
        raise InvalidInput(
            f"{path} exists and is not a seqpack output; refusing to replace it — choose"
            " another --out"
        )
    return path


def temp_output(out: Path) -> Path:
    """Create the hidden sibling ``.NAME.seqpack-tmp-HOST-PID-RANDOM`` to build ``out`` in."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(
            f".{out.name}.seqpack-tmp-{_host()}-{os.getpid()}-{secrets.token_hex(4)}"
        )
        tmp.mkdir()
    except OSError as err:
        raise InvalidInput(
            f"cannot create the output folder {out} ({err.strerror or err}) — choose a writable"
            " --out"
        ) from None
    return tmp


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


@functools.cache
def _renameat2() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is not None:
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        fn.restype = ctypes.c_int
    return fn


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step; False where the system cannot."""
    fn = _renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
        return False  # not supported by this kernel or file system
    raise OSError(code, os.strerror(code), str(b))


def publish(tmp: Path, out: Path) -> None:
    """Move the complete folder ``tmp`` to ``out``, replacing a previous ``out`` whole."""
    old: Path | None = None
    if not out.exists():
        os.rename(tmp, out)
    elif exchange(tmp, out):
        old = tmp  # after the swap, tmp's name holds the previous folder
    else:
        old = out.with_name(f".{out.name}.seqpack-old-{secrets.token_hex(4)}")
        os.rename(out, old)
        try:
            os.rename(tmp, out)
        except BaseException:
            os.rename(old, out)
            raise
    fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    return True


def _only_ours(path: Path) -> bool:
    return all(_OURS.match(p.name) and p.is_file() for p in path.iterdir())


def _stale_temp(path: Path, host: str) -> bool:
    """A temporary folder whose writer ran on this host and is gone, holding only our files."""
    match = re.search(r"\.seqpack-tmp-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{8}$", path.name)
    if match is None or match["host"] != host:
        return False
    pid = int(match["pid"])
    return pid != os.getpid() and not _alive(pid) and _only_ours(path)


def recover_output(out: str | Path) -> list[str]:
    """Clean up after killed runs at ``out``; return one note per action taken.

    - ``.NAME.seqpack-old-*`` with ``out`` missing: a replacement was
      interrupted between its two renames; the old folder is renamed back.
    - ``.NAME.seqpack-old-*`` with ``out`` present: the new folder was
      published; the old one is removed (when it holds only seqpack files).
    - ``.NAME.seqpack-tmp-HOST-PID-*`` of a dead process on this host, holding
      only shard, part and manifest files: removed. Anything else is left.
    """
    out = Path(out)
    if not out.parent.is_dir():
        return []
    notes, host = [], _host()
    prefix = f".{out.name}.seqpack-"
    for path in sorted(out.parent.iterdir()):
        if not path.name.startswith(prefix) or path.is_symlink() or not path.is_dir():
            continue
        kind = path.name[len(prefix) : len(prefix) + 4]
        if kind == "old-" and not os.path.lexists(out) and (path / MANIFEST).is_file():
            os.rename(path, out)
            notes.append(f"restored {out} from {path.name}, left by an interrupted --overwrite")
        elif kind == "old-" and out.exists() and _only_ours(path):
            shutil.rmtree(path, ignore_errors=True)
            notes.append(f"removed {path.name}, a replaced output left by an interrupted run")
        elif kind == "tmp-" and _stale_temp(path, host):
            shutil.rmtree(path, ignore_errors=True)
            notes.append(f"removed {path.name}, the temporary folder of a killed run")
    return notes
