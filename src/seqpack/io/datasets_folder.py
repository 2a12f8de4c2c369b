"""A ``datasets`` ``save_to_disk`` folder, checked before ``datasets`` reads a byte of it.

``datasets.load_from_disk`` joins the names in ``state.json`` (``_data_files``)
and ``dataset_dict.json`` (``splits``) to the folder and reads whatever they
name: ``../other/data-00000-of-00001.arrow`` made it read a file outside the
input, and a FIFO among the files made it hang. :func:`check_folder` reads
those JSON files itself (bounded, duplicate keys refused) and holds every
name to the input policy (:mod:`seqpack.io.files`): a plain name inside the
folder, a regular file, no symlink leaving it. :func:`load_folder` then loads
it and checks the files ``datasets`` mapped are the ones checked.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from seqpack.core.errors import InvalidInput
from seqpack.io.files import open_regular, read_limited, resolve_inside
from seqpack.io.jsonl import DuplicateKey, unique_keys

#: The most bytes of ``state.json`` / ``dataset_dict.json`` / ``dataset_info.json`` read.
MAX_METADATA_FILE = 16 << 20


def is_datasets_folder(path: Path) -> bool:
    return os.path.lexists(path / "state.json") or os.path.lexists(path / "dataset_dict.json")


def _damaged(path: Path, what: str) -> InvalidInput:
    return InvalidInput(
        f"{path.parent}: cannot load as a datasets save_to_disk folder ({path.name}: {what})"
        " — save it again with Dataset.save_to_disk"
    )


def _json(path: Path, root: Path) -> Any:
    data = read_limited(path, MAX_METADATA_FILE, root=root)
    try:
        return json.loads(data, object_pairs_hook=unique_keys)
    except DuplicateKey as err:
        raise _damaged(path, f"key {err.args[0]!r} appears twice") from None
    except (ValueError, RecursionError) as err:
        raise _damaged(path, f"not valid JSON: {err}") from None


def _names(doc: Any, path: Path, key: str, field: str | None) -> list[str]:
    items = doc.get(key) if isinstance(doc, dict) else None
    if not isinstance(items, list) or not items:
        raise _damaged(path, f"{key!r} is not a non-empty list")
    names = [item.get(field) if field and isinstance(item, dict) else item for item in items]
    if not all(isinstance(n, str) for n in names):
        raise _damaged(path, f"an entry of {key!r} names no file")
    return names


def _check_split(folder: Path, root: Path) -> list[Path]:
    state = folder / "state.json"
    names = _names(_json(state, root), state, "_data_files", "filename")
    files = [resolve_inside(folder, name, "a data file") for name in names]
    for file in files:
        open_regular(file, root=root).close()
    info = folder / "dataset_info.json"
    if os.path.lexists(info):
        open_regular(info, root=root, max_bytes=MAX_METADATA_FILE).close()
    return files


def check_folder(path: Path) -> list[Path]:
    """Every data file ``path`` names (all splits), each checked by the input policy."""
    listing = path / "dataset_dict.json"
    if not os.path.lexists(listing):
        return _check_split(path, path)
    splits = _names(_json(listing, path), listing, "splits", None)
    files: list[Path] = []
    for split in splits:
        files += _check_split(resolve_inside(path, split, "a split folder"), path)
    return files


def load_folder(path: Path) -> Any:
    """``datasets.load_from_disk(path)`` after :func:`check_folder`; its mapped files checked
    to lie inside ``path``."""
    import datasets

    check_folder(path)
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as err:  # datasets raises many kinds on a damaged folder
        raise InvalidInput(
            f"{path}: cannot load as a datasets save_to_disk folder ({type(err).__name__}:"
            f" {err}) — save it again with Dataset.save_to_disk"
        ) from None
    parts = loaded.values() if isinstance(loaded, datasets.DatasetDict) else [loaded]
    for part in parts:
        for cache in part.cache_files:
            open_regular(cache["filename"], root=path).close()
    return loaded
