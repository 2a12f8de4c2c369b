"""The seed's acceptance fixture: documents A, B, C packed next-fit at capacity 6.

Documents (BOS 0, EOS 1, vocabulary 266)::

    A = [0, 99, 100, 1]   B = [0, 101, 1]   C = [0, 102, 103, 104, 1]

    column      0    1    2    3    4    5
    inputs    [ 0,  99, 100,   0, 101,  -1]   [  0, 102, 103, 104, -1, -1]
    targets   [99, 100,   1, 101,   1,  -1]   [102, 103, 104,   1, -1, -1]
    segments  [ 0,   0,   0,   1,   1,  -1]   [  2,   2,   2,   2, -1, -1]
    positions [ 0,   1,   2,   0,   1,   0]   [  0,   1,   2,   3,  0,  0]

``exactpack demo``, the figure, the tiny-decoder and transformers verifiers
and the tests all build it here; every number they report is computed from
the packed layout, none is typed in.
"""

from __future__ import annotations

import numpy as np

from exactpack.core.batch import PackedBatch
from exactpack.core.binding import Binding, Split, data_digest
from exactpack.core.compact import PackedEpoch, pack_examples
from exactpack.core.config import PackConfig
from exactpack.core.examples import SequenceExample

FIXTURE_VOCAB = 266
FIXTURE_MAX_LENGTH = 6
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
    return Binding(FIXTURE_VOCAB, "exactpack/bytes-266", data_digest("exactpack-fixture", "A,B,C"))


def fixture_examples(binding: Binding | None = None) -> list[SequenceExample]:
    binding = binding or fixture_binding()
    return [
        SequenceExample.from_document(
            tokens, source_id=name, example_id=name, partition=Split.TRAIN, binding=binding
        )
        for name, tokens in FIXTURE_DOCUMENTS.items()
    ]


def fixture_epoch(max_rows_per_batch: int = 2) -> PackedEpoch:
    binding = fixture_binding()
    config = PackConfig(capacity=FIXTURE_MAX_LENGTH, max_rows_per_batch=max_rows_per_batch)
    return pack_examples(Split.TRAIN, fixture_examples(binding), binding, config)


def fixture_batch() -> PackedBatch:
    """The fixture as one model call of two rows."""
    return fixture_epoch().batches[0]


def probe_gold_probability(batch: PackedBatch) -> np.ndarray:
    """Gold probability per cell, float64 [R, T], from :data:`FIXTURE_PROBE` (0.5 on padding)."""
    occ = batch.occurrences
    q = np.full(batch.shape, 0.5)
    for row, start, end, source in zip(
        occ.row, occ.col_start, occ.col_end, occ.source_ids, strict=True
    ):
        q[row, start:end] = FIXTURE_PROBE[source]
    return q
