"""Claiming an output path: one writer holds it from its first check to publication.

:func:`claim_output` takes the path's lock (:mod:`seqpack.io.lock`), cleans
up after killed runs (:func:`seqpack.io.atomic.recover_output`) and checks
the path (:func:`seqpack.io.atomic.check_output`); the :class:`Claim` it
yields publishes the finished folder (:func:`seqpack.io.atomic.publish`).
The local pipeline and the Ray driver claim before reading any input;
:func:`seqpack.io.store.write_packed` claims too (re-entrant in the thread
holding the claim), so a library caller is covered as well.
"""

from __future__ import annotations

import errno
import functools
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seqpack.core.errors import InvalidInput
from seqpack.io.atomic import check_output, output_path, publish, recover_output
from seqpack.io.lock import output_lock


@dataclass
class Claim:
    """The output path a writer holds: ``path`` (after :func:`output_path`), whether it may
    replace an existing output, and notes for the user (recovery, the lock taken over)."""

    path: Path
    overwrite: bool
    notes: list[str] = field(default_factory=list)

    def publish(self, tmp: Path) -> None:
        """Publish the complete folder ``tmp`` at :attr:`path` (see :func:`publish`)."""
        self.notes += publish(tmp, self.path, self.overwrite)


_claims: dict[tuple[str, int, int], Claim] = {}


def _claim_key(path: Path) -> tuple[str, int, int]:
    return (os.path.realpath(path.parent) + os.sep + path.name, os.getpid(), threading.get_ident())


def held_claim(out: str | os.PathLike[str]) -> Claim:
    """The :class:`Claim` this thread holds on ``out`` (a writer must claim before publishing)."""
    claim = _claims.get(_claim_key(output_path(out)))
    if claim is None:
        raise InvalidInput(f"{out} is not claimed — publish inside claim_output({str(out)!r}, ...)")
    return claim


def claims_output(writer: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``writer(x, out, *, overwrite=False, ...)`` to run holding ``out``
    (:func:`claim_output`), with ``out`` as the claim's path."""

    @functools.wraps(writer)
    def claimed(x: Any, out: str | os.PathLike[str], /, **kwargs: Any) -> Any:
        with claim_output(out, kwargs.get("overwrite", False)) as claim:
            return writer(x, claim.path, **kwargs)

    return claimed


@contextmanager
def claim_output(out: str | os.PathLike[str], overwrite: bool) -> Iterator[Claim]:
    """Hold the output path ``out`` for one writer: lock, recover, check.

    Raises :class:`~seqpack.core.errors.InvalidInput` when another run holds it
    (naming it), when ``out`` cannot name an output folder, or when it exists
    and may not be replaced. Re-entrant in the holding thread (a nested
    claim is the same :class:`Claim`). Missing parent folders are created,
    and removed again if nothing was published.
    """
    path = output_path(out)
    key = _claim_key(path)
    if key in _claims:
        check_output(path, overwrite)
        yield _claims[key]
        return
    made = _make_parents(path)
    try:
        with output_lock(path) as notes:
            claim = Claim(path, overwrite, notes + recover_output(path))
            check_output(path, overwrite)
            _claims[key] = claim
            try:
                yield claim
            finally:
                del _claims[key]
    finally:
        for folder in reversed(made):
            try:
                folder.rmdir()  # only the (empty) folders made here
            except OSError:
                break


def _make_parents(out: Path) -> list[Path]:
    """Create the missing parent folders of ``out``; the ones created, outermost first."""
    folder, missing = out.parent, []
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
    except OSError as err:
        for path in reversed(made):
            path.rmdir()
        raise InvalidInput(
            f"cannot create the output folder {out} ({err.strerror or err}) — choose a writable"
            " --out"
        ) from None
    return made
