"""Storage and attention counted apart: ``B`` rows of width ``T`` hold ``B*T`` cells, dense
attention scores ``B*T^2`` per head, a causal segment of ``l`` pairs permits ``l(l+1)/2``
edges. Shape differences, never a speed-up (an edge is legal, not computed)."""

from __future__ import annotations

from typing import Any

import numpy as np

from seqpack.core.policies import plan_rows


def layout_counts(rows: int, width: int, lengths: Any) -> dict[str, Any]:
    """Counts for ``rows`` x ``width`` storage holding segments of ``lengths``."""
    lens = np.asarray(lengths, dtype=np.int64)
    cells = rows * width
    valid = int(lens.sum())
    return {
        "rows": rows,
        "width": width,
        "cells": cells,
        "valid_cells": valid,
        "dense_scores_per_head": rows * width * width,
        "semantic_edges": int((lens * (lens + 1) // 2).sum()),
        "valid_density": valid / cells if cells else 0.0,
    }


def batch_counts(batch: Any) -> dict[str, Any]:
    """:func:`layout_counts` of a :class:`~seqpack.core.batch.PackedBatch`."""
    occ = batch.occurrences
    rows, width = batch.shape
    return layout_counts(rows, width, occ.col_end - occ.col_start)


def compare_layouts(lengths: Any, capacity: int, policy: str = "next-fit") -> dict[str, Any]:
    """Padded (one example per row, width = longest) versus packed at ``capacity``."""
    lens = np.asarray(lengths, dtype=np.int64)
    plan = plan_rows(lens, capacity, policy)
    return {
        "padded": layout_counts(int(lens.shape[0]), int(lens.max()), lens),
        "packed": layout_counts(plan.num_rows, capacity, lens),
    }
