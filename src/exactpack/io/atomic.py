"""Publishing a packed directory: ``manifest.json`` is the commit point.

A reader trusts only what ``manifest.json`` lists, so a writer writes its
shards under names no manifest lists yet, then replaces the manifest (part
file, fsync, ``os.replace``, folder fsync)::

    packed/
      .exactpack-lock             one writer at a time (filelock); names the writer
                                and what it replaces while it runs
      manifest.json             the commit: lists generation 2's shards
      shard-0002-00000.parquet  written by this run, listed by the new manifest
      shard-0001-00000.parquet  listed by the previous manifest: removed after the commit
      notes.txt                 the user's: never touched (a note says it stays)

Shard names carry a *generation* one above any in the folder (:meth:`Output.shard`).
A run killed outright leaves its record in the lock file, and the next writer
removes exactly that run's files.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import re
import secrets
import socket
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import filelock
import msgspec

from exactpack.core.errors import InvalidInput, foreign, naming

#: Never follow a link when opening (POSIX; other systems have no such flag).
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
MANIFEST = "manifest.json"
LOCK = ".exactpack-lock"
#: The signals the command line's handler received this run: an output is never committed
#: after one, even when a library swallowed the ``SystemExit`` the handler raised.
SIGNALLED: list[int] = []
#: A shard exactpack wrote: ``shard-GGGG-KKKKK.parquet`` (generation, then index).
SHARD = re.compile(r"^shard-(?P<gen>\d{4,})-\d{5,}\.parquet$")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: Path, write: Callable[[BinaryIO], None], part: str | None = None) -> None:
    """Write ``path`` whole or not at all: ``write(f)`` into a part file beside it, fsync,
    rename. A full disk names the file (``OSError`` with its path)."""
    tmp = path.with_name(part or f".{path.name}.{secrets.token_hex(4)}.part")
    try:
        with naming(str(path)):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def output_path(out: str | os.PathLike[str]) -> Path:
    """``out`` as an output folder's path (a symbolic link followed); refused if it names none."""
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
    with foreign(f"cannot use --out {text!r}"):
        linked = path.is_symlink()
    if linked:
        target = Path(os.path.realpath(path))
        if target.is_symlink() or target.name in ("", ".", ".."):
            raise InvalidInput(f"--out {text!r} is a symbolic link that names no folder")
        return output_path(target)
    return path


def _paths(sources: Iterable[Any]) -> Iterator[str]:
    """The paths of ``sources`` (lists flattened, globs expanded; stdin and data skipped)."""
    for source in sources:
        if isinstance(source, (list, tuple)):
            yield from _paths(source)
        elif isinstance(source, (str, os.PathLike)) and os.fspath(source) != "-":
            text = os.fspath(source)
            yield from (glob.glob(text, recursive=True) if glob.has_magic(text) else [text])


def _refuse_overlap(out: Path, inputs: Iterable[Any]) -> None:
    """An output that is an input, holds one or lies inside one would replace or mix with it."""
    mine = os.path.realpath(out)
    for source in _paths(inputs):
        theirs = os.path.realpath(source)
        common = os.path.commonpath([mine, theirs])
        if common == mine or (common == theirs and os.path.isdir(theirs)):
            raise InvalidInput(
                f"--out {out} overlaps the input {source} (the same folder, or one inside the"
                " other); exactpack never publishes over its input — choose another --out"
            )


def _plain_file(path: Path, what: str) -> os.stat_result | None:
    """``lstat(path)`` (None when absent); a link or special file is refused."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        kind = "symbolic link" if stat.S_ISLNK(st.st_mode) else "hard link or special file"
        raise InvalidInput(
            f"{path}: the {what} is a {kind}; exactpack never writes through a link — remove it"
            " or choose another --out"
        )
    return st


def listed_shards(folder: Path) -> list[str] | None:
    """The file names the manifest of ``folder`` lists (None: no readable manifest, or a
    link: not ours to read)."""
    try:
        if _plain_file(folder / MANIFEST, "manifest") is None:
            return None
        # not a link (checked above): reading it follows none
        shards = json.loads((folder / MANIFEST).read_bytes())["shards"]
        return [s["file"] for s in shards if isinstance(s["file"], str)]
    except (InvalidInput, OSError, ValueError, RecursionError, KeyError, TypeError):
        return None


def _check_target(path: Path, overwrite: bool) -> None:
    """Refuse a path holding other than exactpack's files, or an output without ``overwrite``."""
    if not os.path.lexists(path):
        return
    if not path.is_dir():
        raise InvalidInput(
            f"{path} exists and is not a exactpack output; refusing to replace it (even with"
            " --overwrite, exactpack replaces only its own outputs) — choose another --out"
        )
    if _plain_file(path / MANIFEST, "manifest") is not None:
        if not overwrite:
            raise InvalidInput(f"{path} already exists — pass --overwrite to replace it")
        return
    ours = (LOCK, MANIFEST)  # and shards and part files: what exactpack writes there
    others = sorted(
        n for n in os.listdir(path) if not (n in ours or SHARD.match(n) or n.endswith(".part"))
    )
    if others:
        raise InvalidInput(
            f"{path} exists and is not a exactpack output; refusing to replace it (it holds"
            f" {others[0]!r}) — choose another --out"
        )


def make_folders(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; those created, outermost first (none left
    on an ``OSError``)."""
    missing: list[Path] = []
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    made: list[Path] = []
    try:
        if not folder.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, f"{folder} is not a folder")
        for path in reversed(missing):
            path.mkdir()
            made.append(path)
    except OSError:
        remove_folders(made)
        raise
    return made


def remove_folders(made: list[Path]) -> None:
    for folder in reversed(made):
        try:
            folder.rmdir()  # only empty folders this run created
        except OSError:
            break


class _Record(msgspec.Struct):
    """What a writer records in the lock file while it runs."""

    pid: int | None = None
    host: str | None = None
    since: str | None = None
    generation: int | None = None
    replaces: list[str] = []


def _read_record(raw: bytes) -> _Record:
    try:
        return msgspec.json.decode(raw, type=_Record)
    except (msgspec.DecodeError, RecursionError):  # empty, torn or edited: no record
        return _Record()


def _describe(record: _Record) -> str:
    if record.pid is None:
        return "starting up"
    return f"pid {record.pid} on {record.host}, since {record.since}"


def _remove(folder: Path, names: Iterable[str], keep: Iterable[str]) -> int:
    """Remove the regular files ``names`` of ``folder`` not in ``keep``; how many."""
    keep, removed = set(keep), 0
    for name in names:
        path = folder / name
        if name in keep or not path.is_file() or path.is_symlink():
            continue
        path.unlink(missing_ok=True)
        removed += 1
    return removed


@dataclass
class Output:
    """An output folder held by one writer: shards go to :meth:`shard` names in
    :attr:`path`; :meth:`commit` publishes them. ``notes`` are for the user."""

    path: Path
    generation: int
    replaces: list[str]
    notes: list[str] = field(default_factory=list)

    def shard(self, k: int) -> str:
        """The one place a shard file is named."""
        return f"shard-{self.generation:04d}-{k:05d}.parquet"

    def commit(self, manifest: dict[str, Any]) -> None:
        """Replace ``manifest.json`` (the commit point), then remove the shards the previous
        one listed; a note names what else the folder holds."""
        if SIGNALLED:  # a termination a library swallowed: unwind as the signal would have
            raise SystemExit(128 + SIGNALLED[-1])
        data = json.dumps(manifest, indent=2).encode()
        _plain_file(self.path / MANIFEST, "manifest")
        part = f".manifest-{self.generation:04d}.json.{secrets.token_hex(4)}.part"
        write_file(self.path / MANIFEST, lambda f: f.write(data), part)
        fsync_dir(self.path)
        listed = {s["file"] for s in manifest["shards"]}
        _remove(self.path, self.replaces, listed)
        left = sorted(set(os.listdir(self.path)) - listed - {LOCK, MANIFEST})
        if left:
            self.notes.append(
                f"left {', '.join(map(repr, left))} in {self.path}: the manifest does not list"
                f" {'it' if len(left) == 1 else 'them'} and exactpack removes only its own shards"
            )


def _take_lock(path: Path) -> tuple[filelock.BaseFileLock, int, _Record]:
    """Lock ``path/.exactpack-lock`` without waiting; (lock, descriptor, a killed writer's
    record)."""
    file = path / LOCK
    _plain_file(file, "lock file")
    lock = filelock.FileLock(file, timeout=0)
    try:
        lock.acquire()
    except filelock.Timeout:
        try:
            fd = os.open(file, os.O_RDONLY | _NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                who = _describe(_read_record(f.read(4096)))
        except OSError:
            who = "starting up"
        if f"pid {os.getpid()} on {socket.gethostname()}," in who:
            who = f"pid {os.getpid()} on {socket.gethostname()}, another thread"
        raise InvalidInput(
            f"another exactpack run ({who}) is writing {path} — wait for it to finish, or"
            " choose another --out"
        ) from None
    try:
        fd = os.open(file, os.O_RDWR | _NOFOLLOW)
        if os.fstat(fd).st_nlink != 1:  # a hard link made since the check
            os.close(fd)
            _plain_file(file, "lock file")  # raises
        previous = _read_record(os.pread(fd, 1 << 16, 0))
    except BaseException:
        lock.release()
        raise
    return lock, fd, previous


def _clean(path: Path, generation: int, replaces: Iterable[str]) -> int:
    """Remove (and count) what a run of ``generation`` left that no manifest lists: its own
    files and, once a manifest stops listing them, the shards it replaces."""
    listed = listed_shards(path)
    g = f"{generation:04d}"  # its shards, their part files and its manifest's part file
    mine = re.compile(
        rf"^(shard-{g}-\d{{5,}}\.parquet|\.shard-{g}-\d{{5,}}\.parquet\.[0-9a-f]{{8}}\.part"
        rf"|\.manifest-{g}\.json\.[0-9a-f]{{8}}\.part)$"
    )
    names = [n for n in os.listdir(path) if mine.match(n)]
    if listed is not None:
        names += [n for n in replaces if SHARD.match(n)]
    return _remove(path, names, listed or ())


@contextmanager
def open_output(
    out: str | os.PathLike[str], overwrite: bool = False, inputs: Iterable[Any] = ()
) -> Iterator[Output]:
    """Hold the output folder ``out`` for one writer, from the first check to the commit.

    Raises :class:`~exactpack.core.errors.InvalidInput` when another run holds it
    (naming it), ``out`` names no new folder (``""``, ``.``, ``..``, ``/``),
    overlaps one of ``inputs``, holds foreign files and no manifest, holds an
    output and ``overwrite`` is False, or its lock file or manifest is a link.
    If the body raises (an error, SIGTERM, Ctrl-C) before :meth:`Output.commit`,
    everything this run wrote is removed, and so are the folders it created.
    """
    path = output_path(out)
    _refuse_overlap(path, inputs)
    _check_target(path, overwrite)
    with foreign(f"cannot create the output folder {path}", "choose a writable --out"):
        made = make_folders(path)
    try:
        lock, fd, previous = _take_lock(path)
    except BaseException:
        remove_folders(made)
        raise
    try:
        _check_target(path, overwrite)  # again, holding the lock
        notes = []
        if previous.generation is not None:  # the files of a killed run no manifest lists
            removed = _clean(path, previous.generation, previous.replaces)
            notes.append(
                f"took over {LOCK} of {path}, left by a run that ended ({_describe(previous)})"
                + (f"; removed {removed} file(s) it wrote" if removed else "")
            )
        listed = listed_shards(path)
        gens = [int(m["gen"]) for p in path.iterdir() if (m := SHARD.match(p.name))]
        replaces = [n for n in listed or () if SHARD.match(n)]
        output = Output(path, max([0, *gens]) + 1, replaces, notes)
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        record = _Record(os.getpid(), socket.gethostname(), since, output.generation, replaces)
        os.ftruncate(fd, 0)
        os.pwrite(fd, msgspec.json.encode(record), 0)
        try:
            yield output
        finally:
            # What the manifest on disk lists decides, not a flag: a signal may land
            # between the rename and any bookkeeping after it.
            _clean(path, output.generation, output.replaces)
    finally:
        try:
            (path / LOCK).unlink(missing_ok=True)  # while locked: one that opened it retries
        finally:
            os.close(fd)
            lock.release()
        remove_folders(made)
