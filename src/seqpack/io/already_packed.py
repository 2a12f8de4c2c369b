"""A seqpack output given as input is refused as already packed (not read as a corpus)."""

from __future__ import annotations

import json
from pathlib import Path

from seqpack.core.errors import InvalidInput


def refuse_packed(path: Path) -> None:
    """Refuse a seqpack output (its folder or a file in it) given as input: its rows are
    packed already, and reading them as a corpus would pack the packing."""
    manifest = (path if path.is_dir() else path.parent) / "manifest.json"
    try:
        if not manifest.is_file() or manifest.stat().st_size > 64 << 20:
            return
        kind = json.loads(manifest.read_bytes()).get("format")
    except (OSError, ValueError, AttributeError, RecursionError):
        return
    if not isinstance(kind, str) or not kind.startswith("seqpack."):
        return
    use = (
        "seqpack.hf.load_trl(path) or TRL's trainer"
        if kind.endswith("trl-packed")
        else "seqpack.io.load_packed(path) or seqpack.training.PackedBatches(path)"
    )
    raise InvalidInput(
        f"{path} is a seqpack output (format {kind}): it is already packed — use it with"
        f" {use}, or give the corpus it was packed from"
    )
