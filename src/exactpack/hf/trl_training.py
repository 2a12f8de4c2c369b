"""TRL-format rows (``format="trl"``) in TRL and ``transformers`` training scripts.

:func:`load_trl` opens a ``exactpack pack --format trl`` directory as a ``datasets.Dataset``;
:class:`per_example` feeds a collator that flattens *examples*
(``DataCollatorWithFlattening``) each packed row as the examples of its ``seq_lengths``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from exactpack.core.errors import InvalidInput
from exactpack.io.atomic import MANIFEST
from exactpack.io.integrity import DEPTHS, check_checksums, check_manifest, read_manifest
from exactpack.io.trl_schema import TRL_FORMAT, check_trl_contents, is_trl

#: The columns of a packed row that are cut into its examples.
_PER_TOKEN = ("input_ids", "labels")


def load_trl(path: str | Path, *, integrity: bool | str = True, **load_kwargs: Any) -> Any:
    """The TRL-format packed directory ``path`` as a ``datasets.Dataset``, one row per
    packed row (``input_ids``, ``labels``, ``seq_lengths``; the manifest in
    ``info.description``, as :func:`~exactpack.hf.pack_dataset` leaves its metadata).

    ``integrity``: ``True`` / ``"full"``: the manifest, every shard's size and sha256, and
    every shard decoded against the format and the manifest; ``False``: the manifest only.
    ``load_kwargs`` go to ``datasets.load_dataset("parquet", ...)``. A exactpack-format
    directory is refused (``load_packed``).
    """
    import datasets

    path = Path(path)
    if integrity not in DEPTHS:
        raise InvalidInput(f"integrity must be True, False or 'full', not {integrity!r}")
    try:
        manifest = read_manifest(path)  # not valid JSON: one line naming the file
    except OSError:
        raise InvalidInput(
            f"{path} has no readable {MANIFEST}: not a finished exactpack output — run exactpack"
            " pack --format trl again"
        ) from None
    if not is_trl(manifest):
        raise InvalidInput(
            f"{path} is not a TRL-format output (format {manifest.get('format')!r}, want"
            f" {TRL_FORMAT!r}) — load it with exactpack.io.load_packed, or pack with --format trl"
        )
    check_manifest(manifest, path)
    if integrity:  # the checksums, then what the format promises (TRL's rows are read whole)
        check_checksums(manifest, path)
        check_trl_contents(manifest, path)
    files = [str(path / entry["file"]) for entry in manifest["shards"]]
    rows = datasets.load_dataset("parquet", data_files=files, split="train", **load_kwargs)
    # the manifest as pack_dataset's metadata: the first-batch check knows the rows by it
    # even after a Trainer removed their seq_lengths (exactpack.hf.batch_check)
    rows.info.description = json.dumps({"exactpack": manifest})
    return rows


class per_example:  # a wrapper used like a function: collator = per_example(collator)
    """``collator`` fed each packed row (TRL format, any ``datasets`` format) as the
    examples ``input_ids[s:s+n]`` (and ``labels``) of each ``n`` of its ``seq_lengths``, all
    in one batch. The fixture row ``input_ids [0, 99, 100, 1, 0, 101, 1]``,
    ``seq_lengths [4, 3]`` reaches ``DataCollatorWithFlattening`` as
    ``[0, 99, 100, 1]`` and ``[0, 101, 1]``: positions ``[0,1,2,3,0,1,2]``,
    labels ``[-100, 99, 100, 1, -100, 101, 1]``.
    """

    def __init__(self, collator: Callable[..., Any]) -> None:
        self.collator = collator

    def __call__(self, features: Sequence[Mapping[str, Any]], *args: Any, **kwargs: Any) -> Any:
        return self.collator(split_rows(features), *args, **kwargs)


def split_rows(features: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Packed rows cut into their examples (``input_ids`` and ``labels`` when present)."""
    out: list[dict[str, Any]] = []
    for k, row in enumerate(features):
        if "seq_lengths" not in row:
            raise InvalidInput(
                f"feature {k} has no seq_lengths: per_example expects rows of"
                " pack_dataset(..., format='trl') — under Trainer pass"
                " TrainingArguments(remove_unused_columns=False), which keeps the column"
            )
        keys = [key for key in _PER_TOKEN if key in row]
        start = 0
        for n in (int(n) for n in row["seq_lengths"]):
            out.append({key: row[key][start : start + n] for key in keys})
            start += n
        if start != len(row["input_ids"]):
            raise InvalidInput(
                f"feature {k}: seq_lengths add up to {start} tokens but input_ids has"
                f" {len(row['input_ids'])} — the row is not a packed row of format trl"
            )
    return out
