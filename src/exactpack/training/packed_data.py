"""PyTorch read path: packed rows, compact from the shard to the collator, -> tensors.

:class:`PackedBatches` reads a packed directory as model calls or any selection of its
rows (:class:`~exactpack.core.compact.CompactRows`, unpadded); :class:`PackedCollator`
makes tensors, padding only in rows mode. The fixture's call (rows ``[A A A B B .]`` and
``[C C C C . .]``) collates, with ``pad_id=0``, to::

    input_ids     [[   0, 99, 100,    0, 101,    0], [   0, 102, 103, 104,    0,    0]]
    shift_labels  [[  99, 100,  1,  101,   1, -100], [ 102, 103, 104,   1, -100, -100]]
    labels        [[-100, 99, 100, -100, 101, -100], [-100, 102, 103, 104, -100, -100]]
    position_ids  [[   0,  1,   2,    0,   1,    0], [   0,   1,   2,   3,    0,    0]]
    segment_ids   [[   0,  0,   0,    1,   1,   -1], [   2,   2,   2,   2,   -1,   -1]]
    cu_seq_lens_q = cu_seq_lens_k = [0, 3, 5, 9]     max_length_q = max_length_k = 4
    num_items_in_batch = 9

``shift_labels[r, c]``: the token cell ``c`` predicts, or ``-100`` where not
loss-eligible; ``labels``: ``transformers``' unshifted ones (:mod:`exactpack.training.labels`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import Dataset

from exactpack.core.batch import IGNORE_INDEX, NO_SEGMENT, PackedBatch
from exactpack.core.binding import Binding, Split
from exactpack.core.compact import CompactRows
from exactpack.core.errors import InvalidInput, SplitMismatch
from exactpack.core.permission import pairwise
from exactpack.core.tree import refuse_flattened
from exactpack.io.integrity import read_row_stats
from exactpack.io.shards import FIELDS, REQUIRED, arrow_to_rows
from exactpack.io.store import PackedStore, load_packed, tree_batch_from_rows
from exactpack.nn.attention import AttentionLayout
from exactpack.nn.tree_attention import tree_plan
from exactpack.training.distributed import RowStats, Slot
from exactpack.training.labels import seq_idx
from exactpack.training.rows import (
    PAD_FILL,
    Rows,
    compact_of,
    concat_batches,
    concat_rows,
    cu_seq_lens,
    distinct_rows,
    empty_batch,
    empty_rows,
    flat_columns,
    pad_cells,
    select_rows,
)


@dataclass(frozen=True, eq=False)
class ScheduledBatch:
    """Rows (compact or a :class:`PackedBatch`; ``batch`` pads them, on first use) for the
    :class:`Slot` they fill; ``world_size``: the ranks a stream was split over, or None."""

    rows: Rows
    slot: Slot
    world_size: int | None = None

    @cached_property
    def batch(self) -> PackedBatch:
        if isinstance(self.rows, PackedBatch):
            return self.rows
        return self.rows.to_batch()


class PackedBatches(Dataset):
    """Map-style dataset of model calls over a packed directory (verified on open).

    ``ds[i]``: model call ``i`` as packed; ``ds[slot]`` (a :class:`Slot`): a
    :class:`ScheduledBatch` of its rows; ``ds.rows(ids)`` / ``ds.compact_rows(ids)``: any
    global rows, padded / not; ``row_stats()``: what a :class:`RowSampler` needs. Keeps
    ``cache_shards`` decoded shards (LRU). ``expected_split="train"`` refuses other splits.
    """

    def __init__(
        self,
        source: str | Path | PackedStore,
        expected_binding: Binding | None = None,
        *,
        cache_shards: int = 4,
        integrity: bool = True,
        expected_split: Split | str | None = None,
    ) -> None:
        if isinstance(source, PackedStore):
            source.require(expected_binding, expected_split)
            self.store = source
        else:
            self.store = load_packed(
                source, expected_binding, integrity=integrity, expected_split=expected_split
            )
        if self.store.layout == "tree":  # forest rows (exactpack pack --tree)
            raise InvalidInput(
                f"{source} holds tree rows (exactpack pack --tree): read them with"
                " load_packed(...).records() and exactpack.hf.hf_collator(..., tree=True)"
            )
        if cache_shards < 1:
            raise InvalidInput(f"cache_shards must be at least 1, got {cache_shards}")
        self.cache_shards = cache_shards
        self._shards: OrderedDict[int, CompactRows] = OrderedDict()
        self._stats: RowStats | None = None
        firsts = [s["first_row"] for s in self.store.shards] + [self.store.num_rows]
        self._first_rows = np.array(firsts, dtype=np.int64)

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
            return ScheduledBatch(self.compact_rows(index.rows), index)
        return self.store[int(index)]

    def _shard(self, k: int) -> CompactRows:
        if k in self._shards:
            self._shards.move_to_end(k)
            return self._shards[k]
        rows = self._shards[k] = self.store.shard_rows(k)
        if len(self._shards) > self.cache_shards:
            self._shards.popitem(last=False)
        return rows

    def compact_rows(self, ids: Sequence[int] | np.ndarray) -> CompactRows:
        """Global rows ``ids`` (distinct, in this order), unpadded; none: 0 rows."""
        ids = distinct_rows(ids, self.num_rows)
        if not ids.size:
            return empty_rows(self.capacity, self.store.partition, self.binding)
        shard_of = np.searchsorted(self._first_rows, ids, "right") - 1
        parts = []
        for row, k in zip(ids.tolist(), shard_of.tolist(), strict=True):
            shard = self._shard(k)
            local = row - shard.first_row
            parts.append(shard.slice_rows(local, local + 1))
        return concat_rows(parts)

    def rows(self, ids: Sequence[int] | np.ndarray) -> PackedBatch:
        """Global rows ``ids`` (distinct, in this order) as one padded model call."""
        return self.compact_rows(ids).to_batch()

    def row_stats(self) -> RowStats:
        """Valid tokens, eligible targets and Σl² of every row (cached; reads only the pair
        counts and loss flags of each shard)."""
        if self._stats is None:
            parts = []
            for shard in self.store.shards:
                seq, occ, per_row = read_row_stats(self.store.path / shard["file"], shard)
                rows = np.arange(shard["first_row"], shard["first_row"] + shard["rows"])
                parts.append((seq, np.repeat(rows, np.diff(occ)), per_row))
            self._stats = RowStats.stacked(parts)
        return self._stats


class PackedCollator:
    """Tensors for one model call (the module docstring draws the fixture's).

    int64 ``input_ids`` (``pad_id`` on padding), ``shift_labels`` / ``labels``
    (``ignore_index`` where not eligible), ``position_ids``, ``segment_ids`` (-1 on
    padding); int32 ``cu_seq_lens_q``/``_k`` [S+1]; ints ``max_length_q``/``_k``,
    ``num_eligible`` and ``num_items_in_batch`` (for a :class:`ScheduledBatch` the whole
    step's, plus ``last_micro`` and ``slot``).
    Rows mode (default): ``[R, T]`` plus ``valid_index`` int64 [N]; ``permission_mask=True``
    adds bool ``[R, 1, T, T]`` (True = may attend). ``flatten=True``: ``[1, N]``, no
    padding, plus ``seq_idx`` int32 and ``use_cache=False`` (``DataCollatorWithFlattening``'s).
    ``partition="train"`` refuses other partitions. Forest rows: :meth:`tree_features`.

    An item is a :class:`PackedBatch` or :class:`CompactRows`, a :class:`ScheduledBatch`, a
    list of these (stacked), or records of a packed dataset (``pack_dataset``,
    ``load_packed(...).records()``: tree records too), read with ``max_length`` and
    ``binding`` (their packing's). ``model_inputs(rows, slot, world_size)`` makes a model's
    keyword arguments instead of these tensors (:func:`exactpack.hf.hf_collator`: a
    ``transformers`` model's, through ``hf_inputs``).
    """

    def __init__(
        self,
        pad_id: int = 0,
        *,
        ignore_index: int = IGNORE_INDEX,
        flatten: bool = False,
        permission_mask: bool = False,
        partition: Split | str | None = None,
        max_length: int | None = None,
        binding: Binding | None = None,
        model_inputs: Callable[[Rows, Slot | None, int], dict[str, Any]] | None = None,
    ) -> None:
        if isinstance(pad_id, bool) or not isinstance(pad_id, (int, np.integer)) or pad_id < 0:
            raise InvalidInput(f"pad_id must be a non-negative vocabulary id, got {pad_id!r}")
        if flatten and permission_mask:
            raise InvalidInput("flatten=True has no padding to mask; use permission_mask=False")
        self.pad_id = int(pad_id)
        self.ignore_index = int(ignore_index)
        self.flatten = flatten
        self.permission_mask = permission_mask
        self.partition = None if partition is None else Split.parse(partition)
        self.max_length, self.binding, self.model_inputs = max_length, binding, model_inputs

    def _scheduled(self, item: Any) -> tuple[Rows, Slot | None, int]:
        """The rows of ``item``, its slot and the ranks its stream was split over."""
        if isinstance(item, ScheduledBatch):
            return self._scheduled(item.rows)[0], item.slot, item.world_size or 1
        if isinstance(item, PackedBatch) and item.is_tree:
            return item, None, 1
        if isinstance(item, (PackedBatch, CompactRows)):
            return compact_of(item), None, 1
        if isinstance(item, (list, tuple)) and item and all(isinstance(f, Mapping) for f in item):
            return self._records(item), None, 1
        if isinstance(item, (list, tuple)) and len(item) == 1:
            return self._scheduled(item[0])
        if isinstance(item, (list, tuple)) and item:  # Trainer's lists: the rows stacked
            parts = [self._scheduled(f) for f in item]
            if not any(isinstance(rows, PackedBatch) for rows, _, _ in parts):
                return concat_rows([rows for rows, _, _ in parts]), None, max(w for *_, w in parts)
        raise InvalidInput(
            f"cannot collate {type(item).__name__}; pass a PackedBatch, a ScheduledBatch, a list"
            " of PackedBatch (use DataLoader(batch_size=None) with a RowSampler) or records of a"
            " packed dataset"
        )

    def _records(self, features: Sequence[Mapping[str, Any]]) -> Rows:
        """Records of a packed dataset as rows (tree records: forest rows, padded)."""
        if self.max_length is None or self.binding is None:
            raise InvalidInput(
                "this collator does not know the records' max_length and binding — build it"
                " with exactpack.hf.collator_for(packed, attn_implementation), or pass"
                " max_length=N, binding=Binding(vocab_size, ...)"
            )
        if "node_ids" in features[0]:
            return tree_batch_from_rows(list(features), self.max_length, self.binding.vocab_size)
        missing = [n for n in REQUIRED if n not in features[0]]
        if missing:
            raise InvalidInput(
                f"collator features lack the packed columns {missing} — keep them with"
                " TrainingArguments(remove_unused_columns=False)"
            )
        if self.partition is None:
            raise InvalidInput("this collator does not know the records' split — pass partition=")
        schema = pa.schema([(n, FIELDS[n]) for n in FIELDS if n in features[0]])
        table = pa.Table.from_pylist([{n: f[n] for n in schema.names} for f in features], schema)
        where = "collator features"
        return arrow_to_rows(table, capacity=self.max_length, partition=self.partition,
                             binding=self.binding, where=where, contiguous=False)  # fmt: skip

    def rows_of(self, item: Any) -> Rows:
        """The rows of ``item``: compact, or forest rows (one padded :class:`PackedBatch`)."""
        return self._scheduled(item)[0]

    def batch_of(self, item: Any) -> PackedBatch:
        """The rows of ``item`` as one padded :class:`PackedBatch`."""
        rows = self.rows_of(item)
        return rows if isinstance(rows, PackedBatch) else rows.to_batch()

    def __call__(self, item: Any) -> dict[str, Any]:
        rows, slot, world_size = self._scheduled(item)
        tree = isinstance(rows, PackedBatch)  # forest rows stay padded and carry no split
        if not tree:
            check_split(rows, self.partition, "this collator")
        if self.model_inputs is not None:
            return self.model_inputs(rows, slot, world_size)
        out = self.tree_features(rows) if tree else self._flat_features(rows)
        eligible = rows.eligible_count if tree else int(rows.loss_mask.sum())
        out |= {
            "num_eligible": eligible,
            "num_items_in_batch": eligible if slot is None else slot.step_eligible,
        }
        if self.permission_mask:
            seg, pos = out["segment_ids"].numpy(), out["position_ids"].numpy()
            mask = rows.dense_mask() if tree else pairwise(seg != NO_SEGMENT, seg, pos)
            out["permission_mask"] = torch.as_tensor(mask)[:, None]
        if slot is not None:
            out |= {"last_micro": slot.last_micro, "slot": slot}
        return out

    def _flat_features(self, rows: CompactRows) -> dict[str, Any]:
        cells = flat_columns(rows, self.ignore_index)
        index = cells.pop("valid_index")
        shape = (rows.num_rows, rows.capacity)
        if self.flatten:
            cells = {k: v[None] for k, v in cells.items()}
        else:
            fill = PAD_FILL | {"input_ids": self.pad_id}
            cells = {k: pad_cells(v, index, shape, fill[k]) for k, v in cells.items()}
        out: dict[str, Any] = {k: torch.from_numpy(v) for k, v in cells.items()}
        cu = cu_seq_lens(rows)
        longest = int(rows.lengths.max()) if len(rows) else 0
        out |= {
            "cu_seq_lens_q": torch.from_numpy(cu),
            "cu_seq_lens_k": torch.from_numpy(cu.copy()),
            "max_length_q": longest,
            "max_length_k": longest,
        }
        if self.flatten:
            out["seq_idx"] = torch.as_tensor(seq_idx(cu))
            # transformers reads packed position_ids (batch of 1) only when no cache exists.
            out["use_cache"] = False
        else:
            out["valid_index"] = torch.from_numpy(index)
        return out

    def tree_features(self, batch: PackedBatch) -> dict[str, Any]:
        """Forest rows, ``[R, T]``: ``input_ids``, ``shift_labels``, depth ``position_ids``,
        ``segment_ids`` (the nodes), ``weights`` (what :func:`micro_batch_loss` weighs each
        target by; ``num_items_in_batch``: ``Σ weights``, or the step's) and ``tree_plan``
        (:func:`~exactpack.nn.tree_attention.tree_plan`, for
        :func:`~exactpack.nn.varlen.path_attention`)."""
        if self.flatten:
            refuse_flattened("PackedCollator(flatten=True)", "use flatten=False and its tree_plan")
        cells = {
            "input_ids": np.where(batch.input_valid, batch.inputs, self.pad_id),
            "shift_labels": np.where(batch.loss_mask, batch.targets, self.ignore_index),
            "position_ids": batch.position_ids(),
            "segment_ids": batch.segments,
            "weights": batch.weights,
        }
        out: dict[str, Any] = {k: torch.from_numpy(v.astype(np.int64)) for k, v in cells.items()}
        return out | {"tree_plan": tree_plan(batch)}


def check_split(batch: Rows, expected: Split | None, who: str) -> None:
    """Refuse ``batch`` unless it is of partition ``expected`` (None: any)."""
    if expected is not None and batch.partition is not expected:
        got = batch.partition.value
        raise SplitMismatch(
            f"{who} expects {expected.value} rows but got a {got} model call — a {got} output"
            f" must not be used as {expected.value} data; collate it with a collator built"
            f" for partition={got!r}"
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
    """:meth:`AttentionLayout.from_segments` of rows-mode features (equal to ``from_batch``'s),
    for :class:`~exactpack.verify.TinyDecoder` from collated tensors alone."""
    if "valid_index" not in features:
        raise InvalidInput("layout_from_features needs rows-mode features (flatten=False)")
    shape = tuple(features["segment_ids"].shape)
    cu = features["cu_seq_lens_q"].cpu().numpy().astype(np.int64)
    first = features["valid_index"].cpu().numpy()[cu[:-1]]  # each segment's first cell
    segments = features["segment_ids"].cpu().numpy().reshape(-1)[first]
    rows, starts = np.divmod(first, shape[1])
    return AttentionLayout.from_segments(shape, rows, starts, np.diff(cu), segments, device)


def decoder_inputs(
    features: dict[str, Any], device: torch.device | str | None = None
) -> tuple[torch.Tensor, AttentionLayout]:
    """``(ids, layout)`` for :class:`~exactpack.verify.TinyDecoder` from rows-mode features."""
    return features["input_ids"].to(device), layout_from_features(features, device)


__all__ = [
    "PackedBatches",
    "PackedCollator",
    "ScheduledBatch",
    "check_split",
    "compact_of",
    "concat_batches",
    "concat_rows",
    "decoder_inputs",
    "empty_batch",
    "flat_columns",
    "layout_from_features",
    "move_features",
    "select_rows",
]
