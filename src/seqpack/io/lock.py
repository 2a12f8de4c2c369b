"""One writer per output path: an advisory lock beside the output folder.

``seqpack pack --out packed`` holds ``.packed.seqpack-lock`` (in the same
parent folder) from its first check of ``packed`` until the new folder is
published. The lock is ``flock(2)`` on that file, so the kernel releases it
when the writer exits however it exits (a SIGKILL too): a lock file left by
a killed run is simply taken over, with a note. The file records who holds
it, so a second writer is refused with a message naming the first::

    another seqpack run (pid 4242 on node1, since 2026-12-01 08:32:10 UTC) is writing
    packed — wait for it to finish, or choose another --out

Within one process the lock is re-entrant for the thread holding it (the
pipeline holds it and :func:`seqpack.io.store.write_packed` asks again);
another thread is refused like another process.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from seqpack.core.errors import InvalidInput

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

LOCK_SUFFIX = ".seqpack-lock"
#: Errors of flock(2) that mean "this file system cannot lock", not "someone holds it".
_NO_LOCKING = (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)

_held: dict[str, tuple[int, int, int, int]] = {}  # key -> (pid, thread, fd, depth)
_held_guard = threading.Lock()


def lock_path(out: Path) -> Path:
    """The lock file of the output folder ``out``: ``PARENT/.NAME.seqpack-lock``."""
    return out.with_name(f".{out.name}{LOCK_SUFFIX}")


def _holder_text() -> str:
    return json.dumps(
        {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        }
    )


def _describe(raw: bytes) -> str:
    try:
        info = json.loads(raw)
        return f"pid {int(info['pid'])} on {info['host']}, since {info['since']}"
    except (ValueError, TypeError, KeyError):
        return "starting up"


def _refuse(out: Path, who: str, unlocked: Path | None = None) -> InvalidInput:
    gone = f"; if it is gone, remove {unlocked}" if unlocked is not None else ""
    return InvalidInput(
        f"another seqpack run ({who}) is writing {out} — wait for it to finish{gone}, or"
        " choose another --out"
    )


def _try_lock(fd: int) -> bool | None:
    """Take the lock on ``fd`` without waiting: True if taken, False if someone holds it,
    None where the file system cannot lock."""
    if fcntl is None:  # pragma: no cover - not POSIX
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as err:
        if err.errno in _NO_LOCKING:
            return None
        raise
    return True


def _alive(raw: bytes) -> bool:
    """Whether the holder recorded in ``raw`` may still run (unknown hosts: assume so)."""
    try:
        info = json.loads(raw)
        pid, host = int(info["pid"]), str(info["host"])
    except (ValueError, TypeError, KeyError):
        return bool(raw.strip())
    if host != socket.gethostname():
        return True
    return pid_alive(pid) and pid != os.getpid()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (under any user)."""
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    return True


def _open_locked(path: Path, out: Path) -> tuple[int, bytes]:
    """Open and lock ``path``; (fd, what the previous holder wrote)."""
    for _ in range(100):  # another writer may remove the file between our open and lock
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            taken = _try_lock(fd)
            previous = os.pread(fd, 4096, 0)
            if taken is False or (taken is None and _alive(previous)):
                raise _refuse(out, _describe(previous), path if taken is None else None)
            try:
                same = os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fd, previous
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise _refuse(out, "the lock file keeps changing")


@contextmanager
def output_lock(out: Path) -> Iterator[list[str]]:
    """Hold the lock of the output folder ``out`` (its parent must exist).

    Yields a list of notes: one when the lock of a killed run was taken over.
    Raises :class:`~seqpack.core.errors.InvalidInput` naming the writer holding it.
    """
    path = lock_path(out)
    key = os.path.join(os.path.realpath(path.parent), path.name)
    me = (os.getpid(), threading.get_ident())
    with _held_guard:
        entry = _held.get(key)
        if entry is not None and entry[0] == me[0]:
            if entry[1] != me[1]:
                raise _refuse(out, f"pid {me[0]} on {socket.gethostname()}, another thread")
            _held[key] = (*entry[:3], entry[3] + 1)
            reentered = True
        else:
            reentered = False
    if reentered:
        try:
            yield []
        finally:
            with _held_guard:
                pid, thread, fd, depth = _held[key]
                _held[key] = (pid, thread, fd, depth - 1)
        return
    try:
        fd, previous = _open_locked(path, out)
    except OSError as err:
        raise InvalidInput(
            f"cannot create the lock {path} ({err.strerror or err}) — choose a writable --out"
        ) from None
    notes = []
    if previous.strip():
        notes.append(f"took over {path.name}, the lock of a run that ended ({_describe(previous)})")
    os.ftruncate(fd, 0)
    os.pwrite(fd, _holder_text().encode(), 0)
    with _held_guard:
        _held[key] = (*me, fd, 1)
    try:
        yield notes
    finally:
        with _held_guard:
            del _held[key]
        try:
            os.unlink(path)  # while still locked: a waiting writer re-opens the new file
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)


def remove_stale_lock(out: Path) -> str | None:
    """Remove the lock file of ``out`` if nobody holds it (a killed run left it); a note."""
    path = lock_path(out)
    key = os.path.join(os.path.realpath(path.parent), path.name)
    with _held_guard:
        if key in _held and _held[key][0] == os.getpid():
            return None  # ours
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        previous = os.pread(fd, 4096, 0)
        if _try_lock(fd) is not True:
            return None
        if os.fstat(fd).st_ino != os.stat(path, follow_symlinks=False).st_ino:
            return None
        os.unlink(path)
    except OSError:
        return None
    finally:
        os.close(fd)
    return f"removed {path.name}, the lock of a run that ended ({_describe(previous)})"
