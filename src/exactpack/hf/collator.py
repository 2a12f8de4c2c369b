"""The ``data_collator`` for ``transformers.Trainer``: the one
:class:`~exactpack.training.packed_data.PackedCollator`, its output made by
:class:`HFInputs` (``hf_inputs``' keyword arguments for a checked model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from exactpack.core.binding import Binding, Split
from exactpack.core.errors import InvalidInput
from exactpack.hf.adapter import build_inputs
from exactpack.hf.architectures import Architecture
from exactpack.hf.capabilities import check_config, check_runnable, check_vocabulary
from exactpack.hf.kinds import attention_kind, tree_kind
from exactpack.training.distributed import Slot
from exactpack.training.packed_data import PackedCollator
from exactpack.training.rows import Rows


@dataclass(frozen=True)
class HFInputs:
    """:func:`~exactpack.hf.adapter.build_inputs` of collated rows for a model checked once
    (``arch``): the ``model_inputs`` of :func:`hf_collator`'s :class:`PackedCollator`.
    ``check_vocab``: the binding was unknown up front, so the rows' is checked."""

    attn_implementation: str
    arch: Architecture
    kind: str
    dtype: torch.dtype
    pad_token_id: int
    config: Any
    check_vocab: bool

    def __call__(self, rows: Rows, slot: Slot | None, world_size: int) -> dict[str, Any]:
        if world_size > 1:
            raise InvalidInput(
                f"these StreamDataset items are rank {slot.rank if slot else 0}'s share of"
                f" {world_size} ranks, but Trainer (accelerate) splits the data between"
                " ranks itself, so half would never be trained on — build the"
                " StreamDataset with world_size=1, rank=0 for Trainer"
            )
        if self.check_vocab:
            check_vocabulary(self.config, rows.binding, self.pad_token_id)
        out = build_inputs(rows, self.attn_implementation, self.arch, dtype=self.dtype,
                           pad_token_id=self.pad_token_id, kind=self.kind)  # fmt: skip
        if getattr(self.config, "use_cache", True) is False:
            # no cache made: every value a tensor of rows, as accelerate's dispatch_batches needs
            del out["use_cache"]
        return out


def hf_collator(
    attn_implementation: str,
    *,
    config: Any = None,
    dtype: torch.dtype = torch.float32,
    pad_token_id: int = 0,
    max_length: int | None = None,
    binding: Binding | None = None,
    split: Split | str | None = Split.TRAIN,
    kind: str | None = None,
    tree: bool = False,
) -> PackedCollator:
    """A ``data_collator`` for ``transformers.Trainer`` over packed rows: the one
    :class:`PackedCollator`, its output :func:`hf_inputs`' of the stacked rows.

    Items: :class:`PackedBatch` objects, ``StreamDataset`` items
    (:class:`~exactpack.training.ScheduledBatch`), or rows of :func:`exactpack.hf.pack_dataset`
    (:func:`collator_for`; keep their columns with ``remove_unused_columns=False``).
    ``kind=``: :mod:`exactpack.hf.kinds`. ``config`` (``model.config``, or the model;
    required) decides windows and refusals. ``split`` (``"train"``; None: any) refuses other
    splits. ``use_cache=False`` is passed unless ``config.use_cache`` is already False.

    ``tree=True``: forest rows (docs/tree.md) — a tree :class:`PackedBatch`, or records of
    ``pack_dataset(..., tree=True)`` / ``load_packed(...).records()`` (with ``max_length``
    and ``binding``: their vocabulary); the capability is checked with the tree's refusals
    up front. ``rows_of`` gives the batch the loss and the per-sequence views
    (:mod:`exactpack.nn.logprobs`) read.
    """
    kind = (tree_kind if tree else attention_kind)(attn_implementation, kind)
    check_runnable(attn_implementation)  # a flash implementation must run here
    arch = check_config(config, kind, "hf_collator", binding, pad_token_id, tree=tree)
    model_config = getattr(config, "config", config)  # config may be the model
    inputs = HFInputs(attn_implementation, arch, kind, dtype, pad_token_id, model_config,
                      binding is None)  # fmt: skip
    return PackedCollator(pad_token_id, partition=split, max_length=max_length,
                          binding=binding, model_inputs=inputs)  # fmt: skip


def collator_for(packed: Any, attn_implementation: str, **options: Any) -> PackedCollator:
    """:func:`hf_collator` for the rows of ``packed`` (max_length, binding, split, pad id: its
    metadata): a :func:`~exactpack.hf.pack_dataset` Dataset, or the folder ``exactpack
    pack`` wrote (its shards loaded with ``datasets.load_dataset("parquet", ...)``, one
    item a row); ``options``: the other keywords (``config=model.config``)."""
    from exactpack.hf.datasets_io import packed_metadata

    meta = packed_metadata(packed)
    recorded = meta["config"].get("pad_token_id")
    if isinstance(recorded, int) and "pad_token_id" not in options:
        options["pad_token_id"] = recorded  # the pad id the packing was checked with
    return hf_collator(
        attn_implementation,
        max_length=int(meta["config"]["capacity"]),
        binding=Binding.from_dict(meta["binding"]),
        split=Split.parse(meta["partition"]),
        **options,
    )
