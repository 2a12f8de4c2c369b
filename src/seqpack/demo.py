"""The seed's A/B/C fixture and the JSON trace ``seqpack demo`` prints.

Documents (BOS 0, EOS 1, vocabulary 266): A=[0,99,100,1], B=[0,101,1],
C=[0,102,103,104,1]; capacity 6, next-fit. Every number in the trace is
computed from the packed layout, none is typed in.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import permission
from .batch import PackConfig, PackedBatch, PackedEpoch, pack_examples
from .counts import batch_counts, compare_layouts
from .examples import Binding, Partition, SequenceExample, split_digest
from .loss import probe_logits, weighting_report

FIXTURE_VOCAB = 266
FIXTURE_CAPACITY = 6
FIXTURE_DOCUMENTS: dict[str, list[int]] = {
    "A": [0, 99, 100, 1],
    "B": [0, 101, 1],
    "C": [0, 102, 103, 104, 1],
}
#: Prediction lengths whose packed density rises from 75% to 100% while the
#: packed rectangle computes more dense score positions (capacity 6).
DENSITY_LENGTHS = [2, 4, 4, 2]
#: The constructed loss probe: gold probability of every target of each document.
FIXTURE_PROBE: dict[str, float] = {"A": 0.5, "B": 0.25, "C": 0.5}


def fixture_binding() -> Binding:
    return Binding(FIXTURE_VOCAB, "seqpack/bytes-266", split_digest("seqpack-fixture", "A,B,C"))


def fixture_examples(binding: Binding | None = None) -> list[SequenceExample]:
    binding = binding or fixture_binding()
    return [
        SequenceExample.from_document(
            tokens, source_id=name, example_id=name, partition=Partition.TRAIN, binding=binding
        )
        for name, tokens in FIXTURE_DOCUMENTS.items()
    ]


def fixture_epoch(max_rows_per_batch: int = 2) -> PackedEpoch:
    binding = fixture_binding()
    config = PackConfig(capacity=FIXTURE_CAPACITY, max_rows_per_batch=max_rows_per_batch)
    return pack_examples(Partition.TRAIN, fixture_examples(binding), binding, config)


def fixture_batch() -> PackedBatch:
    """The fixture as one model call of two rows."""
    return fixture_epoch().batches[0]


def layout_section(batch: PackedBatch) -> dict[str, Any]:
    """Rows, occurrences, permitted keys, key ranges and counts of one batch."""
    rows, width = batch.shape
    ranges = batch.key_ranges()
    allowed = [
        [
            [k for k in range(width) if batch.allowed_key(r, q, k)]
            if batch.input_valid[r, q]
            else []
            for q in range(width)
        ]
        for r in range(rows)
    ]
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
            "fixture": compare_layouts(lengths, FIXTURE_CAPACITY),
            "fixture_batch": batch_counts(batch),
            "density_example": {"lengths": DENSITY_LENGTHS}
            | compare_layouts(DENSITY_LENGTHS, FIXTURE_CAPACITY),
        },
    }


def probe_gold_probability(batch: PackedBatch) -> np.ndarray:
    """Gold probability per cell, float64 [R, T], from :data:`FIXTURE_PROBE` (0.5 on padding)."""
    occ = batch.occurrences
    q = np.full(batch.shape, 0.5)
    for row, start, end, source in zip(
        occ.row, occ.col_start, occ.col_end, occ.source_ids, strict=True
    ):
        q[row, start:end] = FIXTURE_PROBE[source]
    return q


def probe_section(batch: PackedBatch) -> dict[str, Any]:
    """The constructed loss probe: token-weighted sum and mean, and the wrong weightings.

    Logits are built so that A's and C's targets get gold probability 1/2
    and B's 1/4 (sums 3 ln2, 4 ln2, 4 ln2); the section shows the sum, the
    mean over the 9 targets, and the row-mean and document-mean that weigh
    targets unequally. A NaN written into every excluded cell changes nothing.
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
        return {"skipped": "PyTorch is not installed — pip install 'seqpack[torch]'"}
    from .nn.decoder import TinyDecoder
    from .nn.verify import describe, three_way

    model = TinyDecoder(profile, seed=seed)
    report = three_way(model, fixture_examples(), FIXTURE_CAPACITY)
    sums, diffs = report["loss_sum"], report["max_abs_diff"]
    return {
        **describe(model),
        "loss_sum": sums,
        "max_abs_diff": diffs,
        "comparisons": report["comparisons"],
        "failures": report["failures"],
        "tolerance": report["tolerance"],
        "passed": report["passed"],
        "printed": {
            "loss_sum": {k: f"{v:.6f}" for k, v in sums.items()},
            "max_abs_diff": {k: f"{v:.12f}" for k, v in diffs.items()},
        },
    }


def demo_trace(model: bool = True) -> dict[str, Any]:
    """The full JSON-ready trace of the fixture.

    ``model=False`` leaves out the decoder comparison; without PyTorch the
    ``model`` section only says it was skipped (the rest needs NumPy only).
    """
    epoch = fixture_epoch()
    batch = epoch.batches[0]
    trace: dict[str, Any] = {
        "fixture": {
            "documents": FIXTURE_DOCUMENTS,
            "vocab_size": FIXTURE_VOCAB,
            "capacity": FIXTURE_CAPACITY,
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
