"""PyTorch data path: packed rows -> model calls -> tensors.

:class:`PackedDataset` reads a packed directory (``seqpack pack``) as model
calls, or as any selection of its rows (what :class:`RowSampler` slots ask
for); :class:`PackedCollator` turns a model call into tensors. The fixture's
call (rows ``[A A A B B .]`` and ``[C C C C . .]``) collates, with
``pad_id=0``, to::

    input_ids     [[   0, 99, 100,    0, 101,    0], [   0, 102, 103, 104,    0,    0]]
    shift_labels  [[  99, 100,  1,  101,   1, -100], [ 102, 103, 104,   1, -100, -100]]
    labels        [[-100, 99, 100, -100, 101, -100], [-100, 102, 103, 104, -100, -100]]
    position_ids  [[   0,  1,   2,    0,   1,    0], [   0,   1,   2,   3,    0,    0]]
    segment_ids   [[   0,  0,   0,    1,   1,   -1], [   2,   2,   2,   2,   -1,   -1]]
    cu_seq_lens_q = cu_seq_lens_k = [0, 3, 5, 9]     max_length_q = max_length_k = 4
    num_items_in_batch = 9

``shift_labels[r, c]`` is the token cell ``c`` must predict (already
shifted, never a pair across examples), or ``-100`` where the target is not
loss-eligible; ``labels`` are ``transformers``' unshifted labels of the same
pairs (:mod:`seqpack.training.labels`), so a Hugging Face model fed these
keys computes the right loss and never shifts pre-shifted targets.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from seqpack.core.batch import IGNORE_INDEX, NO_SEGMENT, PackedBatch
from seqpack.core.binding import Binding, Partition
from seqpack.core.compact import CompactRows
from seqpack.core.errors import InvalidInput, PartitionMismatch
from seqpack.core.permission import key_bounds
from seqpack.io.integrity import read_row_stats
from seqpack.io.store import PackedStore, load_packed
from seqpack.nn.attention import AttentionLayout
from seqpack.training.distributed import RowStats
from seqpack.training.labels import model_labels, seq_idx, shift_labels
from seqpack.training.rows import concat_batches, distinct_rows, empty_batch, select_rows
from seqpack.training.sampler import Slot


@dataclass(frozen=True, eq=False)
class ScheduledBatch:
    """A model call together with the :class:`Slot` it fills (step, rank, micro, step count).

    ``world_size``: the ranks a :class:`StreamDataset` split its stream over (its
    items are this rank's share), None when not known.
    """

    batch: PackedBatch
    slot: Slot
    world_size: int | None = None


class PackedDataset(Dataset):
    """Map-style dataset over a packed directory (checksums and binding verified on open).

    ``ds[i]`` (int) is model call ``i`` exactly as packed; ``ds[slot]`` (a
    :class:`Slot` from :class:`RowSampler`) is a :class:`ScheduledBatch` of
    the slot's rows; ``ds.rows([5, 2, 9])`` is any selection of global rows.
    ``row_stats()`` gives the per-row counts a :class:`RowSampler` needs.
    Up to ``cache_shards`` decoded shards are kept (least recently used out).
    Pass ``expected_partition="train"`` in a training loop so a validation or
    test output can never be trained on by mistake.
    """

    def __init__(
        self,
        source: str | Path | PackedStore,
        expected_binding: Binding | None = None,
        *,
        cache_shards: int = 4,
        verify: bool = True,
        expected_partition: Partition | str | None = None,
    ) -> None:
        if isinstance(source, PackedStore):
            source.require(expected_binding, expected_partition)
            self.store = source
        else:
            self.store = load_packed(
                source, expected_binding, verify=verify, expected_partition=expected_partition
            )
        if not isinstance(self.store, PackedStore):  # a tree output (format version 3)
            raise InvalidInput(
                f"{source} holds tree rows (seqpack pack --tree): read them with"
                " load_packed(...).records() and seqpack.hf.tree_inputs.TreeCollator"
            )
        if cache_shards < 1:
            raise InvalidInput(f"cache_shards must be at least 1, got {cache_shards}")
        self.cache_shards = cache_shards
        self._shards: OrderedDict[int, CompactRows] = OrderedDict()
        self._stats: RowStats | None = None
        self._first_rows = np.array(
            [s["first_row"] for s in self.store.shards] + [self.store.num_rows], dtype=np.int64
        )

    def __getstate__(self) -> dict[str, Any]:
        # DataLoader workers get the dataset pickled: send no decoded shards.
        return self.__dict__ | {"_shards": OrderedDict()}

    @property
    def num_rows(self) -> int:
        return self.store.num_rows

    @property
    def capacity(self) -> int:
        return self.store.capacity

    @property
    def binding(self) -> Binding:
        return self.store.binding

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, index: int | Slot) -> PackedBatch | ScheduledBatch:
        if isinstance(index, Slot):
            return ScheduledBatch(self.rows(index.rows), index)
        return self.store[int(index)]

    def _shard(self, k: int) -> CompactRows:
        if k in self._shards:
            self._shards.move_to_end(k)
            return self._shards[k]
        rows = self.store.shard_rows(k)
        self._shards[k] = rows
        if len(self._shards) > self.cache_shards:
            self._shards.popitem(last=False)
        return rows

    def rows(self, ids: Sequence[int] | np.ndarray) -> PackedBatch:
        """Global rows ``ids`` (distinct, in this order) as one model call; none: 0 rows."""
        ids = distinct_rows(ids, self.num_rows)
        if not ids.size:
            return empty_batch(self.capacity, self.store.partition, self.binding)
        shard_of = np.searchsorted(self._first_rows, ids, "right") - 1
        parts = []
        for row, k in zip(ids.tolist(), shard_of.tolist(), strict=True):
            shard = self._shard(k)
            local = row - shard.first_row
            parts.append(shard.slice_rows(local, local + 1).to_batch())
        return concat_batches(parts)

    def row_stats(self) -> RowStats:
        """Valid tokens, eligible targets and Σl² of every row (computed once, then cached).

        Reads only the pair counts and loss flags of each shard.
        """
        if self._stats is None:
            lengths, row_of, eligible = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], []
            for shard in self.store.shards:
                seq, occ, per_row = read_row_stats(self.store.path / shard["file"], shard)
                rows = np.arange(shard["first_row"], shard["first_row"] + shard["rows"])
                lengths.append(seq)
                row_of.append(np.repeat(rows, np.diff(occ)))
                eligible.append(per_row)
            self._stats = RowStats.from_segments(
                np.concatenate(lengths),
                np.concatenate(row_of),
                np.concatenate(eligible) if eligible else np.zeros(0, np.int64),
            )
        return self._stats


def _as_batch(item: Any) -> tuple[PackedBatch, Slot | None]:
    if isinstance(item, ScheduledBatch):
        return item.batch, item.slot
    if isinstance(item, PackedBatch):
        return item, None
    if isinstance(item, (list, tuple)) and item:
        if len(item) == 1:
            return _as_batch(item[0])
        if all(isinstance(b, PackedBatch) for b in item):
            return concat_batches(item), None
    raise InvalidInput(
        f"cannot collate {type(item).__name__}; pass a PackedBatch, a ScheduledBatch, or a list"
        " of PackedBatch (use DataLoader(batch_size=None) with a RowSampler)"
    )


class PackedCollator:
    """Tensors for one model call (see the module docstring for the fixture's values).

    Keys: ``input_ids`` int64 (``pad_id`` on padding), ``shift_labels``
    int64 (the pre-shifted targets, ``ignore_index`` where not
    loss-eligible), ``labels`` int64 (``transformers``' unshifted labels of
    the same pairs), ``position_ids`` int64, ``segment_ids`` int64 (the
    occurrences' epoch-wide ordinals, -1 on padding), ``cu_seq_lens_q``/``_k``
    int32 [S+1] over the valid cells in row-major order,
    ``max_length_q``/``_k`` (int), ``num_eligible`` (int, this call's
    eligible targets) and ``num_items_in_batch`` (int: the whole optimizer
    step's count across ranks and micro-batches for a
    :class:`ScheduledBatch`, else this call's). Rows mode (default) keeps
    ``[R, T]`` and adds ``valid_index`` int64 [Σl] (flat cells to gather);
    ``flatten=True`` drops padding and returns ``[1, Σl]`` tensors (what
    varlen / flash kernels and HF's flattening collator use) plus
    ``seq_idx`` int32 ``[1, Σl]`` (0-based per call, as
    ``DataCollatorWithFlattening(return_seq_idx=True)`` gives) and
    ``use_cache=False`` (so a ``transformers`` model of any kind keeps the
    flattened examples apart from their restarting ``position_ids``). Every key a
    ``transformers`` model reads has ``transformers``' meaning; rows mode
    carries no ``attention_mask``, so feed Hugging Face models with
    ``flatten=True`` or :class:`seqpack.hf.HFCollator` /
    :func:`seqpack.hf.hf_inputs`.
    ``permission_mask=True`` (rows mode only) adds the permission as a bool
    ``[R, 1, T, T]`` mask under the key ``permission_mask`` (True = may
    attend; for ``F.scaled_dot_product_attention``). It is deliberately not
    called ``attention_mask``: a ``transformers`` eager model adds a boolean
    4-D mask as numbers and silently attends across examples.
    ``partition="train"`` refuses a call of any other partition (a
    validation output trained on by mistake). A scheduled call also carries
    its ``slot``.
    """

    def __init__(
        self,
        pad_id: int = 0,
        *,
        ignore_index: int = IGNORE_INDEX,
        flatten: bool = False,
        permission_mask: bool = False,
        partition: Partition | str | None = None,
    ) -> None:
        if isinstance(pad_id, bool) or not isinstance(pad_id, (int, np.integer)) or pad_id < 0:
            raise InvalidInput(f"pad_id must be a non-negative vocabulary id, got {pad_id!r}")
        if flatten and permission_mask:
            raise InvalidInput("flatten=True has no padding to mask; use permission_mask=False")
        self.pad_id = int(pad_id)
        self.ignore_index = int(ignore_index)
        self.flatten = flatten
        self.permission_mask = permission_mask
        self.partition = None if partition is None else Partition.parse(partition)

    def __call__(self, item: Any) -> dict[str, Any]:
        batch, slot = _as_batch(item)
        check_partition(batch, self.partition, "PackedCollator")
        cu = batch.cu_seqlens()
        cells = {
            "input_ids": np.where(batch.input_valid, batch.inputs, self.pad_id),
            "labels": model_labels(batch, self.ignore_index),
            "shift_labels": shift_labels(batch, self.ignore_index),
            "position_ids": batch.position_ids(),
            "segment_ids": batch.segments,
        }
        if self.flatten:
            cells = {k: v.reshape(-1)[cu.valid_index][None] for k, v in cells.items()}
        out: dict[str, Any] = {
            k: torch.as_tensor(np.ascontiguousarray(v), dtype=torch.int64) for k, v in cells.items()
        }
        cu_t = torch.as_tensor(cu.cu_seqlens, dtype=torch.int32)
        out |= {
            "cu_seq_lens_q": cu_t,
            "cu_seq_lens_k": cu_t.clone(),
            "max_length_q": cu.max_seqlen,
            "max_length_k": cu.max_seqlen,
            "num_eligible": batch.eligible_count,
            "num_items_in_batch": batch.eligible_count if slot is None else slot.step_eligible,
        }
        if self.flatten:
            out["seq_idx"] = torch.as_tensor(seq_idx(cu.cu_seqlens))
            # transformers reads packed position_ids (batch of 1) only when no cache exists.
            out["use_cache"] = False
        else:
            out["valid_index"] = torch.as_tensor(cu.valid_index, dtype=torch.int64)
        if self.permission_mask:
            out["permission_mask"] = torch.as_tensor(batch.dense_mask())[:, None]
        if slot is not None:
            out["slot"] = slot
        return out


def check_partition(batch: PackedBatch, expected: Partition | None, who: str) -> None:
    """Refuse ``batch`` unless it is of partition ``expected`` (None: any)."""
    if expected is not None and batch.partition is not expected:
        raise PartitionMismatch(
            f"{who} expects {expected.value} rows but got a {batch.partition.value} model call —"
            f" a {batch.partition.value} output must not be used as {expected.value} data; collate"
            f" it with a collator built for partition={batch.partition.value!r}"
        )


def move_features(features: dict[str, Any], device: torch.device | str) -> dict[str, Any]:
    """The collated dict with every tensor on ``device`` (other values as they are)."""
    return {
        k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
        for k, v in features.items()
    }


def layout_from_features(
    features: dict[str, Any], device: torch.device | str | None = None
) -> AttentionLayout:
    """The :class:`AttentionLayout` of rows-mode features, equal to ``from_batch``'s.

    Lets a training loop run :class:`~seqpack.verify.TinyDecoder` from collated
    tensors alone: ``model(features["input_ids"], layout_from_features(features))``.
    """
    if "valid_index" not in features:
        raise InvalidInput("layout_from_features needs rows-mode features (flatten=False)")
    seg = features["segment_ids"].to(device)
    pos = features["position_ids"].to(device)
    valid = seg != NO_SEGMENT
    cols = torch.arange(seg.shape[1], device=seg.device).expand_as(seg)
    starts, ends = key_bounds(valid, pos, cols)
    cu = features["cu_seq_lens_q"]
    return AttentionLayout(
        valid=valid,
        segments=seg,
        positions=pos,
        key_starts=starts,
        key_ends=ends,
        cu_seqlens=cu.to(device),
        max_seqlen=int(features["max_length_q"]),
        valid_index=features["valid_index"].to(device),
        lengths=np.diff(cu.cpu().numpy()).astype(np.int64),
    )


def decoder_inputs(
    features: dict[str, Any], device: torch.device | str | None = None
) -> tuple[torch.Tensor, AttentionLayout]:
    """``(ids, layout)`` for :class:`~seqpack.verify.TinyDecoder` from rows-mode features."""
    return features["input_ids"].to(device), layout_from_features(features, device)


__all__ = [
    "PackedCollator",
    "PackedDataset",
    "ScheduledBatch",
    "check_partition",
    "concat_batches",
    "decoder_inputs",
    "empty_batch",
    "layout_from_features",
    "move_features",
    "select_rows",
]
