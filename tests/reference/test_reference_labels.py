"""Labels written out by hand: TRL format's column rule and ``-100`` in every token dtype.

The fixture A=[0,99,100,1], B=[0,101,1], C=[0,102,103,104,1] at 7 tokens a row,
next-fit, packs as rows ``A+B`` and ``C``. TRL format version 2 always stores a ``labels``
column (so no collator, with or without its padding-free flag, trains an EOS→BOS pair);
its values are the token where the pair is supervised and ``-100`` elsewhere and on each
example's first token. Shards are read with pyarrow alone; no trl is needed here (the same
rule against TRL's own collator is in ``tests/unit/test_trl_format.py``).
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from exactpack.core import engine
from exactpack.core.compact import span_labels
from exactpack.pipeline.local import pack_path

A, B, C = [0, 99, 100, 1], [0, 101, 1], [0, 102, 103, 104, 1]
ROWS = [A + B, C]
SEQ_LENGTHS = [[4, 3], [5]]
#: Inputs that mask no target: no column, every token its own label, a -100 only on a
#: first token (no pair predicts it), every flag 1, a first flag 0 (it flags no target).
#: Their labels: -100 on each example's first token only.
UNMASKED = {
    "bare": {},
    "labels=tokens": {"labels": [A, B, C]},
    "labels -100 on first tokens": {"labels": [[-100, *A[1:]], [-100, *B[1:]], C]},
    "loss_mask ones": {"loss_mask": [[1] * 4, [1] * 3, [1] * 5]},
    "loss_mask 0 on a first token": {"loss_mask": [[0, 1, 1, 1], [1] * 3, [1] * 5]},
    "assistant_masks ones": {"assistant_masks": [[1] * 4, [1] * 3, [1] * 5]},
}
#: Inputs that mask target 99 of A (its second token), written by hand.
MASKED = {
    "labels": {"labels": [[-100, -100, 100, 1], B, C]},
    "loss_mask": {"loss_mask": [[1, 0, 1, 1], [1] * 3, [1] * 5]},
    "assistant_masks": {"assistant_masks": [[1, 0, 1, 1], [1] * 3, [1] * 5]},
}
MASKED_LABELS = [[-100, -100, 100, 1, -100, 101, 1], [-100, 102, 103, 104, 1]]
UNMASKED_LABELS = [[-100, 99, 100, 1, -100, 101, 1], [-100, 102, 103, 104, 1]]


def _pack_trl_file(folder, columns: dict) -> list[dict]:
    """``columns`` beside ``input_ids`` as a JSON Lines file packed in TRL format; the
    shards' rows read with pyarrow, and their column names."""
    folder.mkdir()
    rows = [{"input_ids": ids, **{k: v[i] for k, v in columns.items()}} for i, ids in
            enumerate([A, B, C])]  # fmt: skip
    (folder / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pack_path(folder / "in.jsonl", folder / "out", max_length=7, vocab_size=200,
              policy="next-fit", format="trl")  # fmt: skip
    manifest = json.loads((folder / "out" / "manifest.json").read_text())
    tables = [pq.read_table(folder / "out" / s["file"]) for s in manifest["shards"]]
    assert len({tuple(t.column_names) for t in tables}) == 1
    return [r for t in tables for r in t.to_pylist()]


@pytest.mark.parametrize("name", list(UNMASKED))
def test_a_trl_file_without_masked_targets_still_has_labels_100_on_first_tokens(tmp_path, name):
    rows = _pack_trl_file(tmp_path / "o", UNMASKED[name])
    assert rows == [
        {"input_ids": r, "labels": lab, "seq_lengths": n}
        for r, lab, n in zip(ROWS, UNMASKED_LABELS, SEQ_LENGTHS, strict=True)
    ]


@pytest.mark.parametrize("name", list(MASKED))
def test_a_trl_file_with_a_masked_target_has_labels_written_by_hand(tmp_path, name):
    rows = _pack_trl_file(tmp_path / "o", MASKED[name])
    assert rows == [
        {"input_ids": r, "labels": lab, "seq_lengths": n}
        for r, lab, n in zip(ROWS, MASKED_LABELS, SEQ_LENGTHS, strict=True)
    ]


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
def test_a_trl_dataset_has_labels_written_by_hand_masked_or_not(masked):
    datasets = pytest.importorskip("datasets")
    from exactpack.hf import pack_dataset

    cases = MASKED if masked else UNMASKED
    for name, columns in cases.items():
        data = datasets.Dataset.from_dict({"input_ids": [A, B, C], **columns})
        packed = pack_dataset(data, 7, "next-fit", format="trl").to_dict()
        labels = MASKED_LABELS if masked else UNMASKED_LABELS
        want = {"input_ids": ROWS, "labels": labels, "seq_lengths": SEQ_LENGTHS}
        assert packed == want, name


# ------------------------------------------------------------------ -100 in every dtype

#: Two windows: [5, 6, 7] with flags [T, F] and [250, 251] with flags [T] (token ids a
#: uint8 holds), back to back; the labels written by hand.
TOKENS = [5, 6, 7, 250, 251]
LENGTHS = [2, 1]
FLAGS = [True, False, True]
LABELS = [-100, 6, -100, -100, 251]
#: Every integer dtype the C kernels take (``_native_ok``: kinds i and u).
DTYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kernels", ["native", "python"])
def test_labels_are_minus_100_where_unsupervised_in_every_token_dtype(dtype, kernels):
    tokens = np.array(TOKENS if dtype != np.int8 else [5, 6, 7, 50, 51], dtype=dtype)
    want = LABELS if dtype != np.int8 else [-100, 6, -100, -100, 51]
    mask, lens = np.array(FLAGS), np.array(LENGTHS, dtype=np.int64)
    got = span_labels(tokens, mask, lens, native=kernels == "native")
    assert got.dtype == np.int32 and got.tolist() == want
    out = np.zeros(len(TOKENS), dtype=np.int32)  # the kernel itself, by engine
    if kernels == "python" or engine.native_available():
        engine.call(kernels, "labels_loop", tokens, mask, lens, out, inputs=3)
        assert out.tolist() == want


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16], ids=["uint8", "uint16"])
def test_narrow_unsigned_tokens_never_wrap_the_ignore_index(dtype):
    """A bare -100 beside uint8 / uint16 tokens wraps to 156 / 65436 under NumPy 2."""
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 6, 40).astype(np.int64)
    tokens = rng.integers(0, 200, int((lens + 1).sum())).astype(dtype)
    mask = rng.random(int(lens.sum())) < 0.5
    for native in (True, False):
        got = span_labels(tokens, mask, lens, native=native).tolist()
        p = q = 0
        for n in lens.tolist():
            assert got[p] == -100
            for j in range(n):
                assert got[p + 1 + j] == (int(tokens[p + 1 + j]) if mask[q + j] else -100)
            p, q = p + n + 1, q + n
