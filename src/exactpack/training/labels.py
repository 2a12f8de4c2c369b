"""Label tensors under the names ``transformers`` reads, each with ``transformers``' meaning.

``labels`` are aligned with ``input_ids`` (``labels[c]`` is the token at ``c`` when the
pair ``c-1 -> c`` is supervised, ``-100`` on each example's first cell), as
``DataCollatorWithFlattening`` writes them; ``shift_labels`` are the pre-shifted targets
``ForCausalLMLoss`` takes as they are (each example's last included). Fixture row 0
(A = columns 0-2, B = 3-4, padding at 5)::

    input_ids     [ 0,   99, 100,    0,  101,    0]
    labels        [-100, 99, 100, -100,  101, -100]
    shift_labels  [ 99, 100,   1,  101,    1, -100]

``seq_idx`` (int32 ``[1, N]``, as ``DataCollatorWithFlattening(return_seq_idx=True)``
gives): ``[0, 0, 0, 1, 1, 2, 2, 2, 2]`` for the fixture's A, B | C.
"""

from __future__ import annotations

import numpy as np

from exactpack.core.batch import IGNORE_INDEX, PackedBatch


def shift_labels(batch: PackedBatch, ignore_index: int = IGNORE_INDEX) -> np.ndarray:
    """Per-cell targets where loss-eligible, else ``ignore_index``; int64 ``[R, T]``."""
    return np.where(batch.loss_mask, batch.targets, ignore_index).astype(np.int64)


def model_labels(batch: PackedBatch, ignore_index: int = IGNORE_INDEX) -> np.ndarray:
    """``transformers``' unshifted ``labels`` of ``batch``, int64 ``[R, T]``: ``targets[r, c-1]``
    where cells ``c-1`` and ``c`` share an example and that target is eligible."""
    out = np.full(batch.shape, ignore_index, dtype=np.int64)
    segs = batch.segments
    same = batch.input_valid[:, 1:] & (segs[:, 1:] == segs[:, :-1]) & batch.loss_mask[:, :-1]
    out[:, 1:][same] = batch.targets[:, :-1][same]
    return out


def seq_idx(cu_seqlens: np.ndarray) -> np.ndarray:
    """Batch-local example index of each flattened cell, int32 ``[1, N]``, from ``cu_seqlens``."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    lengths = np.diff(cu)
    lengths = lengths[lengths > 0]  # an empty span is no example: indices stay consecutive
    return np.repeat(np.arange(lengths.shape[0], dtype=np.int32), lengths)[None]


__all__ = ["model_labels", "seq_idx", "shift_labels"]
