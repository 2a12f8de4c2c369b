"""Atomic output folders: one writer, built hidden, published by one rename, recovered.

A writer first *claims* the output path (:func:`seqpack.io.claim.claim_output`):
it takes the lock ``.NAME.seqpack-lock`` (:mod:`seqpack.io.lock`; a second
writer is refused naming the first), cleans up after killed runs
(:func:`recover_output`) and checks the path. The folder is then built
beside itself as ``.NAME.seqpack-tmp-HOST-PID-RANDOM`` and renamed into
place only when complete::

    .packed.seqpack-lock                       who is writing (removed at the end)
    .packed.seqpack-tmp-node1-4242-9f3c01aa/   shards, then manifest.json (fsynced)
    packed/                                    appears in one rename

Replacing an existing ``out`` (``--overwrite``) exchanges the two folders in
one step (Linux ``renameat2(RENAME_EXCHANGE)``), so ``out`` is at every
instant either the old complete folder or the new one; where that call is
missing the old folder is first renamed to ``.NAME.seqpack-old-RANDOM``.
Publication never deletes or moves a file seqpack did not write: an output
folder holding anything else is not replaced (checked before packing and
again after the exchange, which is undone if a file appeared meanwhile), and
only seqpack's own files are removed from the replaced folder.

``--out`` is taken literally: ``""``, ``.``, ``..`` and ``/`` are refused (an
output is a new folder with a name), and a symbolic link is followed to the
folder it names, which is then replaced (the link is left as it is).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import re
import secrets
import shutil
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from seqpack.core.errors import InvalidInput, SeqpackError
from seqpack.io.lock import LOCK_SUFFIX, remove_stale_lock
from seqpack.io.verify import verify_folder

MANIFEST = "manifest.json"
#: A hidden folder of a seqpack run: ``.NAME.seqpack-tmp-…`` or ``.NAME.seqpack-old-…``.
HIDDEN = re.compile(r"^\..+\.seqpack-(tmp|old)-")
#: Files a writer puts in its folder (shards, manifest, shard parts).
_OURS = re.compile(
    r"^(shard-\d{5,}\.parquet|manifest\.json|\.shard-\d{5,}\.parquet\.[0-9a-f]+\.part)$"
)


#: Longest file name most file systems take (ext4, xfs, btrfs, tmpfs: 255 bytes).
_NAME_MAX = 255


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def output_path(out: str | os.PathLike[str]) -> Path:
    """``out`` as the path of a new folder: refused when it cannot name one, a symbolic
    link followed to the folder it names."""
    text = os.fspath(out)
    if not text.strip():
        raise InvalidInput("--out is empty — name the output folder, e.g. --out packed")
    if "\0" in text:
        raise InvalidInput(f"--out {text!r} holds a NUL byte, which no path can — rename it")
    path = Path(text)
    if path.name in ("", ".", ".."):
        raise InvalidInput(
            f"--out {text!r} names an existing folder by '.', '..' or '/', not a new output"
            f" folder — name one inside it, e.g. --out {os.path.join(text, 'packed')}"
        )
    if HIDDEN.match(path.name) or path.name.endswith(LOCK_SUFFIX):
        raise InvalidInput(f"{path}: names a temporary seqpack file — choose another --out")
    # the hidden sibling adds about 60 bytes: ".NAME.seqpack-tmp-HOST-PID-RANDOM"
    if len(os.fsencode(path.name)) + 60 + len(_host()) > _NAME_MAX:
        raise InvalidInput(
            f"--out name {path.name[:40]!r}... is too long for its temporary sibling"
            f" (at most {_NAME_MAX - 60 - len(_host())} bytes here) — choose a shorter name"
        )
    try:
        linked = path.is_symlink()
    except OSError as err:
        raise InvalidInput(f"cannot use --out {text!r} ({err.strerror or err})") from None
    if linked:
        target = Path(os.path.realpath(path))
        if target.is_symlink() or target.name in ("", ".", ".."):
            raise InvalidInput(f"--out {text!r} is a symbolic link that names no folder")
        return output_path(target)
    return path


def _listed(folder: Path) -> set[str]:
    """Shard files the manifest of ``folder`` lists (none when it is unreadable)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_bytes())
        return {str(shard["file"]) for shard in manifest["shards"]}
    except (OSError, ValueError, RecursionError, KeyError, TypeError):
        return set()


def foreign_entries(folder: Path) -> list[str]:
    """Names in ``folder`` that seqpack did not write (not its manifest, listed shards or
    parts, or not plain files)."""
    listed = _listed(folder)
    return sorted(
        p.name
        for p in folder.iterdir()
        if p.is_symlink()
        or not p.is_file()
        or not (p.name in listed or _OURS.match(p.name) or p.name == MANIFEST)
    )


def check_output(out: str | Path, overwrite: bool) -> Path:
    """Refuse an existing ``out`` unless ``overwrite`` and it is a seqpack output holding
    only seqpack's files (or an empty folder)."""
    path = output_path(out)
    if not os.path.lexists(path):
        return path
    # What --overwrite would refuse is refused first, so no message suggests a flag that
    # then refuses too.
    if not path.is_dir() or (any(path.iterdir()) and not (path / MANIFEST).is_file()):
        raise InvalidInput(
            f"{path} exists and is not a seqpack output; refusing to replace it (even with"
            " --overwrite, seqpack replaces only its own outputs) — choose another --out"
        )
    foreign = foreign_entries(path)
    if foreign:
        raise InvalidInput(
            f"{path} holds {foreign[0]!r}, which seqpack did not write; refusing to replace the"
            " folder — move it out of the folder, or choose another --out"
        )
    if not overwrite:
        raise InvalidInput(f"{path} already exists — pass --overwrite to replace it")
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


_RENAME_NOREPLACE = 1
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


def _rename2(a: Path, b: Path, flags: int) -> bool:
    """``renameat2(a, b, flags)``; False where the system cannot (OSError on failure)."""
    fn = _renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
        return False  # not supported by this kernel or file system
    raise OSError(code, os.strerror(code), str(b))


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step; False where the system cannot."""
    return _rename2(a, b, _RENAME_EXCHANGE)


def rename_new(src: Path, dst: Path) -> bool:
    """Rename ``src`` to ``dst`` only if ``dst`` does not exist; False if it does."""
    try:
        if _rename2(src, dst, _RENAME_NOREPLACE):
            return True
    except FileExistsError:
        return False
    if os.path.lexists(dst):
        return False
    os.rename(src, dst)  # without renameat2: a folder made in between could be replaced
    return True


def _remove_ours(folder: Path) -> list[str]:
    """Remove seqpack's files from ``folder`` and the folder; a note if anything else stays."""
    foreign = set(foreign_entries(folder))
    for path in folder.iterdir():
        if path.name not in foreign:
            path.unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:
        left = foreign_entries(folder) if folder.is_dir() else []
        return [f"left {folder.name}: it holds {', '.join(map(repr, left))}, not seqpack's"]
    return []


def publish(tmp: Path, out: Path, overwrite: bool = True) -> list[str]:
    """Move the complete folder ``tmp`` to ``out``, replacing a previous ``out`` whole
    (only with ``overwrite``); notes on what was left in place."""
    if rename_new(tmp, out):
        fsync_dir(out.parent)
        return []
    if not overwrite:
        raise InvalidInput(
            f"{out} appeared while packing — pass --overwrite to replace it, or choose another"
            " --out"
        )
    check_output(out, overwrite=True)
    if exchange(tmp, out):
        old = tmp  # after the swap, tmp's name holds the previous folder
    else:
        old = out.with_name(f".{out.name}.seqpack-old-{secrets.token_hex(4)}")
        os.rename(out, old)
        try:
            os.rename(tmp, out)
        except BaseException:
            os.rename(old, out)
            raise
    foreign = ["(a symbolic link)"] if old.is_symlink() else foreign_entries(old)
    if foreign:  # it appeared since the check: put everything back as it was
        if old == tmp:
            exchange(tmp, out)
        else:
            os.rename(out, tmp)
            os.rename(old, out)
        raise InvalidInput(
            f"{out / foreign[0]} appeared while packing; seqpack replaces only folders holding"
            " its own files — move it out and pack again"
        )
    fsync_dir(out.parent)
    return _remove_ours(old)


def _stale_temp(path: Path, host: str) -> bool:
    """A temporary folder whose writer ran on this host and is gone, holding only our files."""
    match = re.search(r"\.seqpack-tmp-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{8}$", path.name)
    if match is None or match["host"] != host:
        return False
    pid = int(match["pid"])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return not foreign_entries(path)
    except PermissionError:
        pass  # it exists, under another user
    return False


def _restore(path: Path, out: Path, verify: Callable[[Path], Any]) -> str:
    """Move the old output ``path`` back to ``out`` if it verifies; the note either way."""
    foreign = foreign_entries(path)
    why = f"it holds {foreign[0]!r}, not seqpack's" if foreign else ""
    if not why:
        try:
            verify(path)
        except (SeqpackError, OSError) as err:
            why = f"it does not verify ({' '.join(str(err).split())})"
    if why or not rename_new(path, out):
        return (
            f"left {path.name} where it is: {why or f'{out} appeared'} — inspect it; seqpack"
            " restores only an output it can verify"
        )
    return f"restored {out} from {path.name}, left by an interrupted --overwrite"


def recover_output(out: str | Path, verify: Callable[[Path], Any] = verify_folder) -> list[str]:
    """Clean up after killed runs at ``out``; return one note per action taken.

    - ``.NAME.seqpack-old-*`` with ``out`` missing: a replacement was
      interrupted between its two renames; the old folder is renamed back
      only when it is the only one, holds only seqpack's files and
      ``verify(folder)`` (default: a full :func:`seqpack.io.verify.verify_folder`)
      passes. Otherwise it stays, with a note.
    - ``.NAME.seqpack-old-*`` with ``out`` present: the new folder was
      published; seqpack's files in the old one are removed.
    - ``.NAME.seqpack-tmp-HOST-PID-*`` of a dead process on this host, holding
      only shard, part and manifest files: removed. Anything else is left.
    """
    out = Path(out)
    if not out.parent.is_dir():
        return []
    notes, host = [], _host()
    stale = remove_stale_lock(out)
    if stale is not None:
        notes.append(stale)
    prefix = f".{out.name}.seqpack-"
    hidden = [
        p
        for p in sorted(out.parent.iterdir())
        if p.name.startswith(prefix) and not p.is_symlink() and p.is_dir()
    ]
    olds = [p for p in hidden if p.name[len(prefix) :].startswith("old-")]
    if len(olds) == 1 and not os.path.lexists(out):
        notes.append(_restore(olds[0], out, verify))
    elif olds and not os.path.lexists(out):
        notes.append(f"left {len(olds)} replaced outputs ({olds[0].name}, …): which to restore?")
    for path in hidden:
        if path in olds and os.path.lexists(out) and path.exists():
            if not foreign_entries(path):
                notes += _remove_ours(path)
                notes.append(f"removed {path.name}, a replaced output left by an interrupted run")
        elif path not in olds and _stale_temp(path, host):
            shutil.rmtree(path, ignore_errors=True)
            notes.append(f"removed {path.name}, the temporary folder of a killed run")
    return notes
