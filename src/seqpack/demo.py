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


def demo_trace() -> dict[str, Any]:
    """The full JSON-ready trace of the fixture."""
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
    return trace
