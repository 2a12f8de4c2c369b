"""Which files one or more input paths name: files, folders of shards, globs, ``-``.

:func:`resolve_files` is what every engine lays its input out from (the
local reader, the Ray driver): a file by its suffixes (case-insensitive,
compression included), a folder by :func:`seqpack.io.files.folder_files`
(one format, nothing left unread), a glob in sorted order, ``-`` for
standard input; several paths are one input of one format, in the order given.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path

from seqpack.core.errors import InvalidInput
from seqpack.io.datasets_folder import is_datasets_folder
from seqpack.io.files import data_kind, folder_files, is_stdin


def _file_kind(path: Path) -> str:
    kind, _ = data_kind(path)
    if kind is None:
        suffix = "".join(path.suffixes[-2:]).lower() or path.name
        raise InvalidInput(
            f"{path}: unknown input type {suffix!r} — use .jsonl, .json, .parquet (JSON Lines"
            " may be compressed: .gz, .zst, .bz2, .xz), a folder of such shards, a datasets"
            " save_to_disk folder, or - for standard input"
        )
    return kind


def resolve_files(
    sources: Sequence[str | Path],
) -> tuple[str, tuple[Path, ...], tuple[Path | None, ...]]:
    """The files of one or more paths (a file, a folder of shards, a glob, ``-``), in order:
    ``(kind, files, roots)`` with each file's folder (None: named by the user). All must be
    of one kind (JSON Lines or Parquet); ``datasets`` folders are :func:`open_input`'s."""
    kinds: set[str] = set()
    files: list[Path] = []
    roots: list[Path | None] = []
    for source in sources:
        text = str(source)
        if is_stdin(text):
            kinds.add("jsonl")
            files.append(Path("-"))
            roots.append(None)
            continue
        matches = [Path(text)]
        if not os.path.lexists(text) and glob.has_magic(text):
            matches = [Path(m) for m in sorted(glob.glob(text))]
            if not matches:
                raise InvalidInput(f"input {text!r} matches no file — check the pattern")
        for match in matches:
            if not os.path.lexists(match) or not match.exists():
                raise InvalidInput(f"input {str(match)!r} does not exist — check the path")
            if match.is_dir():
                if is_datasets_folder(match):
                    raise InvalidInput(
                        f"{match} is a datasets save_to_disk folder: give it as the only input"
                    )
                kind, found = folder_files(match)
                files += found
                roots += [match] * len(found)
            else:
                kind = _file_kind(match)
                files.append(match)
                roots.append(None)
            kinds.add(kind)
    if len(kinds) > 1:
        raise InvalidInput(
            "the inputs mix Parquet and JSON Lines files — pack one format at a time, or"
            " convert one of them"
        )
    return kinds.pop(), tuple(files), tuple(roots)
