"""A ``data_collator`` for ``transformers.Trainer`` over packed rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import torch

from exactpack.core.batch import PackedBatch
from exactpack.core.binding import Binding, Split
from exactpack.core.compact import CompactRows
from exactpack.core.errors import InvalidInput
from exactpack.hf.adapter import build_inputs
from exactpack.hf.architectures import Architecture
from exactpack.hf.capabilities import check_collator, check_vocabulary
from exactpack.hf.kinds import attention_kind, tree_kind
from exactpack.io.shards import FIELDS, REQUIRED, arrow_to_rows
from exactpack.io.tree_rows import tree_batch_from_rows
from exactpack.training.packed_data import ScheduledBatch, check_split
from exactpack.training.rows import concat_rows


@dataclass
class HFCollator:
    """A ``data_collator`` for ``transformers.Trainer`` over packed rows.

    ``features``: :class:`PackedBatch` objects, ``StreamDataset`` items
    (:class:`~exactpack.training.ScheduledBatch`), or rows of :func:`exactpack.hf.pack_dataset`
    (:meth:`for_dataset`; keep their columns with ``remove_unused_columns=False``). Returns
    :func:`hf_inputs` of the stacked rows. ``kind=``: :mod:`exactpack.hf.kinds`. ``config``
    (``model.config``, or the model; required) decides windows and refusals. ``split``
    (``"train"``; None: any) refuses other splits. ``use_cache=False`` is passed unless
    ``config.use_cache`` is already False.

    ``tree=True``: forest rows (docs/tree.md) — a tree :class:`PackedBatch`, or
    records of ``pack_dataset(..., tree=True)`` / ``load_packed(...).records()`` (with
    ``max_length`` and ``binding``: their vocabulary); the capability is checked with the
    tree's refusals up front. :meth:`rows_of` gives the batch the loss and the
    per-sequence views (:mod:`exactpack.nn.logprobs`) read.
    """

    attn_implementation: str
    dtype: torch.dtype = torch.float32
    pad_token_id: int = 0
    max_length: int | None = None
    binding: Binding | None = None
    split: Split | str | None = Split.TRAIN
    config: Any = None  # required (a field with a default only to keep the order above)
    kind: str | None = None
    tree: bool = False
    arch: Architecture | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        self.kind = (tree_kind if self.tree else attention_kind)(
            self.attn_implementation, self.kind
        )
        if self.split is not None:
            self.split = Split.parse(self.split)
        self.arch = check_collator(
            "HFCollator",
            self.attn_implementation,
            self.kind,
            self.config,
            self.binding,
            self.pad_token_id,
            tree=self.tree,
        )

    @property
    def _config(self) -> Any:
        """The model's config (``config`` may be the model)."""
        return getattr(self.config, "config", self.config)

    @classmethod
    def for_dataset(cls, packed: Any, attn_implementation: str, **options: Any) -> HFCollator:
        """A collator for the rows of ``packed`` (max_length, binding, split, pad id: its
        metadata): a :func:`~exactpack.hf.pack_dataset` Dataset, or the folder ``exactpack
        pack`` wrote (its shards loaded with ``datasets.load_dataset("parquet", ...)``, one
        item a row); ``options``: the other fields (``config=model.config``)."""
        from exactpack.hf.datasets_io import packed_metadata

        meta = packed_metadata(packed)
        recorded = meta["config"].get("pad_token_id")
        if isinstance(recorded, int) and "pad_token_id" not in options:
            options["pad_token_id"] = recorded  # the pad id the packing was checked with
        return cls(
            attn_implementation,
            max_length=int(meta["config"]["capacity"]),
            binding=Binding.from_dict(meta["binding"]),
            split=Split.parse(meta["partition"]),
            **options,
        )

    def batch_of(self, features: Sequence[Any]) -> PackedBatch:
        """The stacked rows of ``features`` as one padded :class:`PackedBatch`."""
        return self.rows_of(features).to_batch()

    def rows_of(self, features: Sequence[Any]) -> CompactRows | PackedBatch:
        """The stacked rows of ``features``, compact (forest rows: one padded batch)."""
        if isinstance(features, ScheduledBatch) and isinstance(features.rows, PackedBatch):
            features = features.rows  # a RowSampler slot of forest rows (PackedCollator's item)
        if isinstance(features, PackedBatch) and features.is_tree:
            return features
        if self.tree:
            return self._tree_rows(features)
        if isinstance(features, (PackedBatch, CompactRows, ScheduledBatch)):
            features = [features]
        for f in features:
            if isinstance(f, ScheduledBatch) and (f.world_size or 1) > 1:
                raise InvalidInput(
                    f"these StreamDataset items are rank {f.slot.rank}'s share of"
                    f" {f.world_size} ranks, but Trainer (accelerate) splits the data between"
                    " ranks itself, so half would never be trained on — build the"
                    " StreamDataset with world_size=1, rank=0 for Trainer"
                )
        # StreamDataset / PackedBatches[slot] items: their rows (Trainer sums the targets)
        features = [f.rows if isinstance(f, ScheduledBatch) else f for f in features]
        if features and all(isinstance(f, (PackedBatch, CompactRows)) for f in features):
            rows = concat_rows(features)
            check_split(rows, self.split, "this HFCollator")
            if self.binding is None:  # known only now
                check_vocabulary(self._config, rows.binding, self.pad_token_id)
            return rows
        if not features or not all(isinstance(f, Mapping) for f in features):
            raise InvalidInput(
                "collator features must be PackedBatch / ScheduledBatch objects or rows of a"
                " packed dataset"
            )
        return self._rows(features)

    def _tree_rows(self, features: Sequence[Any]) -> PackedBatch:
        if self.max_length is None or self.binding is None:
            raise InvalidInput(
                "this collator does not know the tree rows' max_length and vocabulary — build"
                " it with HFCollator(..., tree=True, max_length=N, binding=Binding(vocab_size,"
                " ...))"
            )
        return tree_batch_from_rows(list(features), self.max_length, self.binding.vocab_size)

    def _rows(self, features: Sequence[Mapping[str, Any]]) -> CompactRows:
        names = list(features[0])
        missing = [n for n in REQUIRED if n not in names]
        if missing:
            raise InvalidInput(
                f"collator features lack the packed columns {missing} — keep them with"
                " TrainingArguments(remove_unused_columns=False)"
            )
        if self.max_length is None or self.binding is None or self.split is None:
            raise InvalidInput(
                "this collator does not know the packing's max_length, binding and split —"
                " build it with HFCollator.for_dataset(packed, attn_implementation)"
            )
        schema = pa.schema([(n, FIELDS[n]) for n in FIELDS if n in names])
        table = pa.Table.from_pylist([{n: f[n] for n in schema.names} for f in features], schema)
        return arrow_to_rows(
            table,
            capacity=self.max_length,
            partition=self.split,
            binding=self.binding,
            where="collator features",
            contiguous=False,
        )

    def __call__(self, features: Sequence[Any]) -> dict[str, Any]:
        out = build_inputs(
            self.rows_of(features),
            self.attn_implementation,
            self.arch,
            dtype=self.dtype,
            pad_token_id=self.pad_token_id,
            kind=self.kind,
        )
        if getattr(self._config, "use_cache", True) is False:
            # no cache made: every value a tensor of rows, as accelerate's dispatch_batches needs
            del out["use_cache"]
        return out
