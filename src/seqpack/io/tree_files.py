"""Tree packing from files: records with prompt/completion id columns -> tries -> statistics.

Reads a ``.jsonl`` / ``.json`` or ``.parquet`` file whole (pyarrow), takes
the first column set of :data:`seqpack.core.tree_input.TREE_COLUMNS` it has,
and compares tree packing with flat packing of the same sequences under one
policy: ``tokens_stored`` (cells the tree layout stores), ``tokens_flat``
(cells flat packing stores), and the rows of both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from seqpack.core.binding import Binding
from seqpack.core.errors import InvalidInput
from seqpack.core.policies import plan_rows
from seqpack.core.tree import build_layout
from seqpack.core.tree_input import TREE_COLUMNS, SequenceGroups


def read_table(path: str | Path) -> Any:
    """A JSONL/JSON or Parquet file as one Arrow table (read whole)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"{path}: --tree reads one .jsonl/.json or .parquet file")
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        elif path.suffix in (".jsonl", ".json"):
            import pyarrow.json as pj

            table = pj.read_json(path)
        else:
            raise InvalidInput(f"{path}: --tree reads .jsonl/.json or .parquet files")
    except (OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InvalidInput(f"{path}: cannot read it as a table: {first}") from err
    return table


def read_columns(path: str | Path) -> dict[str, list[Any]]:
    """The tree columns of a JSONL/JSON or Parquet file, as Python lists."""
    table = read_table(path)
    wanted = {name for names in TREE_COLUMNS for name in names}
    return {
        name: table.column(name).to_pylist() for name in table.column_names if name in wanted
    } | {name: [] for name in table.column_names if name not in wanted}


def tree_file_groups(
    path: str | Path,
    *,
    mode: str = "on",
    prefix: int = 16,
    window: int = 4096,
    tokenizer: Any = None,
) -> SequenceGroups:
    """The groups of a file (:func:`seqpack.io.tree_rows.file_groups`); without a tokenizer
    the vocabulary is one past the largest id."""
    from seqpack.io.tree_rows import file_groups

    table = read_table(path)
    if tokenizer is not None:
        vocab = int(tokenizer.vocab_size)
    else:
        idcols = [n for n in table.column_names if n.endswith("_ids")]
        ids = [v for n in idcols for v in _flatten(table.column(n).to_pylist())]
        vocab = int(max(ids)) + 1 if ids else 1
    binding = Binding(
        vocab, getattr(tokenizer, "identity", "pre-tokenized"), f"file:{Path(path).name}"
    )
    groups, _ = file_groups(
        table,
        str(path),
        binding=binding,
        tokenizer=tokenizer,
        mode=mode,
        prefix=prefix,
        window=window,
    )
    return groups


def _flatten(values: list[Any]) -> list[int]:
    out: list[int] = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out.extend(_flatten(list(v)))
        elif isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            out.append(int(v))
    return out


def tree_stats(groups: SequenceGroups, capacity: int, policy: str = "best-fit-decreasing") -> dict:
    """Tree vs flat packing of ``groups`` at ``capacity`` under ``policy``."""
    layout = build_layout(groups, capacity)
    flat = plan_rows(groups.lengths, capacity, policy)
    tree = plan_rows(layout.sizes, capacity, policy)
    stored, total = int(layout.sizes.sum()), int(groups.lengths.sum())
    return {
        "groups": int(np.unique(groups.group).shape[0]),
        "sequences": len(groups),
        "tries": int(layout.sizes.shape[0]),
        "capacity": int(capacity),
        "policy": policy,
        "tokens_stored": stored,
        "tokens_flat": total,
        "stored_over_flat": stored / total if total else 0.0,
        "rows_tree": tree.num_rows,
        "rows_flat": flat.num_rows,
    }


__all__ = ["read_columns", "read_table", "tree_file_groups", "tree_stats"]
