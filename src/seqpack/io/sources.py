"""Which files one or more input paths name: files, folders of shards, globs, ``-``.

:func:`resolve_files` is what every engine lays its input out from (the
local reader, the Ray driver): a file by its suffixes (case-insensitive,
compression included), a folder by :func:`folder_files`
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
from seqpack.io.files import CODECS, data_kind, is_stdin

#: Suffixes of data seqpack does not read: a folder holding them is refused (they would be
#: silently left out of the pack).
FOREIGN_SUFFIXES = (".csv", ".tsv", ".arrow", ".feather", ".avro", ".orc", ".txt", ".parq",
                    ".pq", ".jsonlines", ".tar", ".zip", *CODECS)  # fmt: skip
#: Files a data folder may hold beside its shards (metadata that no reader needs).
SIDE_FILES = ("dataset_info.json", "state.json", "dataset_dict.json", "_success", "_metadata",
              "_common_metadata", "license", "license.txt", "readme.txt")  # fmt: skip
SIDE_SUFFIXES = (".md", ".crc", ".lock", ".sha256", ".yaml", ".yml", ".toml")


def _side_file(name: str) -> bool:
    low = name.lower()
    return low.startswith((".", "_")) or low in SIDE_FILES or low.endswith(SIDE_SUFFIXES)


def folder_files(folder: Path) -> tuple[str, tuple[Path, ...]]:
    """The data files of ``folder`` (sorted by name) and their kind, or :class:`InvalidInput`.

    Names match case-insensitively. Refused, naming the files: two formats in one
    folder, files of a format seqpack does not read or an unknown suffix beside the
    shards (they would be left out silently), a subfolder of data, no data file.
    Metadata beside shards (``dataset_info.json``, ``*.md``, hidden files) is ignored.
    """
    found: dict[str, list[Path]] = {}
    stray: list[str] = []
    try:
        entries = sorted(folder.iterdir(), key=lambda p: p.name)
    except OSError as err:
        raise InvalidInput(f"{folder}: cannot list it ({err.strerror or err})") from None
    if os.path.lexists(folder / "manifest.json") and any(
        data_kind(e.name)[0] == "parquet" for e in entries
    ):
        raise InvalidInput(
            f"{folder} holds manifest.json beside Parquet shards: a seqpack packed folder, not"
            " raw data — pack its source instead, or read it with seqpack.io.load_packed"
        )
    for entry in entries:
        if _side_file(entry.name):
            continue
        kind, _ = data_kind(entry.name)
        if entry.is_dir() or kind is None:
            stray.append(entry.name + ("/" if entry.is_dir() else ""))
        else:
            found.setdefault("parquet" if kind == "parquet" else "JSON Lines", []).append(entry)
    if len(found) > 1:
        counts = " and ".join(f"{len(files)} {name}" for name, files in found.items())
        raise InvalidInput(
            f"{folder} mixes formats ({counts} files) — keep one format per folder; seqpack would"
            " otherwise read only some of the rows"
        )
    if not found:
        raise InvalidInput(
            f"{folder} holds no *.parquet or *.jsonl shards and is not a datasets save_to_disk"
            " folder"
        )
    if stray:
        shown = ", ".join(stray[:5]) + (f" and {len(stray) - 5} more" if len(stray) > 5 else "")
        raise InvalidInput(
            f"{folder} holds {shown} beside its shards, which seqpack does not read — move them"
            " out (or convert them) so that no rows are left out silently"
        )
    name, files = next(iter(found.items()))
    return ("parquet" if name == "parquet" else "jsonl"), tuple(files)


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
