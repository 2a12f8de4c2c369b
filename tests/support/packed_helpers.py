"""Helpers shared by the pipeline tests: recover examples from packed batches, write inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from exactpack.core.batch import CELL_FIELDS as BATCH_FIELDS

OCCURRENCE_FIELDS = (
    "ordinal",
    "row",
    "col_start",
    "col_end",
    "segment",
    "source_ids",
    "example_ids",
    "range_starts",
    "range_ends",
)


def assert_same_batches(got, want) -> None:
    """Two sequences of PackedBatch are identical: cells, occurrences, binding, rows."""
    got, want = list(got), list(want)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        for name in BATCH_FIELDS:
            x, y = getattr(a, name), getattr(b, name)
            assert x.dtype == y.dtype and np.array_equal(x, y), name
        for name in OCCURRENCE_FIELDS:
            x, y = getattr(a.occurrences, name), getattr(b.occurrences, name)
            assert np.array_equal(np.asarray(x), np.asarray(y)), name
        assert a.binding == b.binding and a.partition == b.partition
        assert a.first_row == b.first_row


def recovered_examples(batches) -> dict[int, dict]:
    """Read every occurrence back out of the padded cells, by ordinal.

    Its window is the inputs of its cells plus the last target; its loss
    flags are the cells' loss_mask. Segments and positions are checked here.
    """
    out: dict[int, dict] = {}
    for batch in batches:
        occ = batch.occurrences
        for i in range(len(occ)):
            r, s, e = int(occ.row[i]), int(occ.col_start[i]), int(occ.col_end[i])
            assert (batch.segments[r, s:e] == occ.ordinal[i]).all()
            assert batch.positions[r, s:e].tolist() == list(range(e - s))
            assert batch.target_valid[r, s:e].all()
            window = [*batch.inputs[r, s:e].tolist(), int(batch.targets[r, e - 1])]
            assert batch.targets[r, s:e].tolist() == window[1:]
            ordinal = int(occ.ordinal[i])
            assert ordinal not in out, "an occurrence appears twice"
            out[ordinal] = {
                "source_id": str(occ.source_ids[i]),
                "example_id": str(occ.example_ids[i]),
                "range": (int(occ.range_starts[i]), int(occ.range_ends[i])),
                "tokens": window,
                "loss": batch.loss_mask[r, s:e].tolist(),
            }
    return out


def expected_flags(record: dict) -> list[bool]:
    """Per-target loss flags of a JSON record, computed from its labels / loss_mask."""
    ids = record["input_ids"]
    if record.get("labels") is not None:
        return [label != -100 for label in record["labels"][1:]]
    mask = record.get("loss_mask")
    if mask is None:
        return [True] * (len(ids) - 1)
    return [bool(m) for m in (mask[1:] if len(mask) == len(ids) else mask)]


def random_records(rng: np.random.Generator, n: int, vocab: int, max_len: int) -> list[dict]:
    """Documents with ids, some with labels (-100 on a random prompt prefix), some plain."""
    records = []
    for i in range(n):
        length = int(rng.integers(2, max_len + 1))
        ids = rng.integers(0, vocab, size=length).tolist()
        record: dict = {"id": f"doc-{i}", "input_ids": ids}
        if i % 3 == 0:
            prompt = int(rng.integers(0, length))
            record["labels"] = [-100] * prompt + ids[prompt:]
        records.append(record)
    return records


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
