"""The JSON trace ``exactpack demo`` prints for the A/B/C fixture
(:mod:`exactpack.verify.fixture`); every number in it is computed from the packed layout."""

from __future__ import annotations

from typing import Any

import numpy as np

from exactpack.core import permission
from exactpack.core.batch import PackedBatch
from exactpack.core.loss import probe_logits, weighting_report
from exactpack.core.policies import batch_counts, compare_layouts
from exactpack.verify.fixture import (
    DENSITY_LENGTHS,
    FIXTURE_DOCUMENTS,
    FIXTURE_MAX_LENGTH,
    FIXTURE_PROBE,
    FIXTURE_VOCAB,
    fixture_epoch,
    fixture_examples,
    probe_gold_probability,
)


def layout_section(batch: PackedBatch) -> dict[str, Any]:
    """Rows, occurrences, permitted keys, key ranges and counts of one batch."""
    rows, width = batch.shape
    ranges = batch.key_ranges()
    allowed = [[np.flatnonzero(keys).tolist() for keys in row] for row in batch.dense_mask()]
    query_edges = batch.edges()
    tiled = permission.tiled_edges(batch, tile_width=2)
    tiled_sorted = tiled[np.lexsort(tiled.T[::-1])]
    lengths = [len(tokens) - 1 for tokens in FIXTURE_DOCUMENTS.values()]
    return {
        "rows": batch.rows_as_dicts(),
        "occurrences": batch.occurrences.records(),
        "allowed_keys": allowed,
        "key_ranges": [
            [None if (kr := ranges.get(r, q)) is None else list(kr) for q in range(width)]
            for r in range(rows)
        ],
        "row_valid_lengths": ranges.row_lengths.tolist(),
        "valid_targets": int(batch.target_valid.sum()),
        "eligible_targets": batch.eligible_count,
        "cells": rows * width,
        "edges": {
            "count": int(query_edges.shape[0]),
            "tile_width": 2,
            "tiled_equals_query_order": bool(np.array_equal(query_edges, tiled_sorted)),
        },
        "counts": {
            "fixture": compare_layouts(lengths, FIXTURE_MAX_LENGTH),
            "fixture_batch": batch_counts(batch),
            "density_example": {"lengths": DENSITY_LENGTHS}
            | compare_layouts(DENSITY_LENGTHS, FIXTURE_MAX_LENGTH),
        },
    }


def probe_section(batch: PackedBatch) -> dict[str, Any]:
    """The constructed loss probe: token-weighted sum and mean, and the wrong weightings.

    A's and C's targets get gold probability 1/2, B's 1/4 (sums 3 ln2, 4 ln2, 4 ln2): the
    sum, the mean over the 9 targets, and the row-mean and document-mean that weigh them
    unequally. A NaN written into every excluded cell changes nothing.
    """
    logits = probe_logits(batch, probe_gold_probability(batch))
    report = weighting_report(logits, batch)
    poisoned = logits.copy()
    poisoned[~batch.loss_mask] = np.nan
    same = weighting_report(poisoned, batch) == report
    keys = ("loss_sum", "mean", "row_mean", "document_mean")
    return {
        "gold_probability": FIXTURE_PROBE,
        **report,
        "printed": {k: f"{report[k]:.6f}" for k in keys},
        "nan_in_excluded_cells_changes_nothing": same,
    }


def model_section(profile: str = "large", seed: int = 42) -> dict[str, Any]:
    """The tiny decoder run separate, padded and packed on the fixture (needs torch)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return {"skipped": "PyTorch is not installed — pip install 'exactpack[torch]'"}
    from exactpack.verify.decoder import TinyDecoder
    from exactpack.verify.layouts import describe, three_way

    model = TinyDecoder(profile, seed=seed)
    report = three_way(model, fixture_examples(), FIXTURE_MAX_LENGTH)
    sums, diffs = report["loss_sum"], report["max_abs_diff"]
    kept = ("loss_sum", "max_abs_diff", "comparisons", "failures", "tolerance", "passed")
    return {
        **describe(model),
        **{k: report[k] for k in kept},
        "printed": {
            "loss_sum": {k: f"{v:.6f}" for k, v in sums.items()},
            "max_abs_diff": {k: f"{v:.12f}" for k, v in diffs.items()},
        },
    }


def demo_trace(model: bool = True) -> dict[str, Any]:
    """The full JSON-ready trace of the fixture; ``model=False`` leaves out the decoder
    comparison (without PyTorch it only says it was skipped)."""
    epoch = fixture_epoch()
    batch = epoch.batches[0]
    trace: dict[str, Any] = {
        "fixture": {
            "documents": FIXTURE_DOCUMENTS,
            "vocab_size": FIXTURE_VOCAB,
            "capacity": FIXTURE_MAX_LENGTH,
            "policy": epoch.plan.policy,
            "binding": batch.binding.to_dict(),
            "metadata_peak_bytes": epoch.metadata_peak,
        }
    }
    trace.update(layout_section(batch))
    trace["probe"] = probe_section(batch)
    if model:
        trace["model"] = model_section()
    return trace
