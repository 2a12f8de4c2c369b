"""Tree-packed rows in ``transformers``: inputs per attention kind, ``exactpack_tree``, datasets.

:func:`tree_inputs` gives a causal LM on tree-packed rows
(:class:`~exactpack.core.tree.TreeBatch`) what makes it compute each sequence as alone:
``input_ids`` (``pad_token_id`` on padding), depth ``position_ids``, ``use_cache=False``,
and by kind: the masks of :mod:`exactpack.hf.masks` (``eager`` / ``sdpa`` /
``flex_attention``, with the tree's node ends), or for ``exactpack_tree`` /
``exactpack_tree_varlen`` no mask and the plan as the keyword ``exactpack_tree``
(:func:`~exactpack.nn.tree_attention.tree_attention` /
:func:`~exactpack.nn.tree_attention.tree_flash_attention`). The flattened kinds are refused.
Tree rows take flat packing's checks, not copies of them: the model's capability
(:func:`exactpack.hf.capabilities.capability`, its modules included, with the tree's own
refusals: ``Architecture.check(kind, tree=True)``) and, on every batch, its conditions
(``Architecture.check_batch`` with the longest sequence's depth).
:func:`pack_tree_dataset` (``pack_dataset(..., tree=True)``) packs a ``Dataset``'s groups
into one record per row; :class:`TreeCollator` turns records into a model call.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from exactpack.core.binding import Binding
from exactpack.core.errors import InvalidInput
from exactpack.core.tree import TREE_COLUMNS, TreeBatch, groups_from_columns, pack_tree
from exactpack.hf.architectures import Architecture
from exactpack.hf.attention_impl import register
from exactpack.hf.capabilities import (
    check_collator,
    check_model,
    check_restarts,
    check_vocabulary,
    require_config,
)
from exactpack.hf.kinds import TREE as NAME
from exactpack.hf.kinds import TREE_NAMES, tree_kind
from exactpack.hf.kinds import TREE_VARLEN as VARLEN_NAME
from exactpack.hf.masks import block_mask, hf_allowed, layer_masks
from exactpack.hf.mixers import PARENTS, cell_parents
from exactpack.io.tree_rows import max_id, tree_batch_from_rows, tree_records
from exactpack.nn.tree_attention import flash_plan, tree_plan

#: The permission plus each padding cell attending to itself only, bool [R, T, T].
tree_allowed = hf_allowed
#: :func:`tree_allowed` as a FlexAttention ``BlockMask`` over (R, 1, T, T).
tree_block_mask = block_mask


def tree_layer_masks(
    batch: TreeBatch,
    kind: str,
    arch: Architecture | None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Any:
    """The ``attention_mask`` argument: one mask, or ``{layer_type: mask}`` per layer type
    (:func:`exactpack.hf.masks.layer_masks`: the masks are the flat ones' with node ends)."""
    return layer_masks(batch, kind, arch, dtype=dtype, device=device)


def tree_inputs(
    batch: TreeBatch,
    attn_implementation: str,
    *,
    config: Any = None,
    arch: Architecture | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    pad_token_id: int = 0,
) -> dict[str, Any]:
    """Keyword arguments for ``model(**kwargs)`` on a tree batch, tensors ``(R, T)``; logits
    come back ``(R, T, V)`` (:func:`exactpack.nn.logprobs.sequence_logprobs`).

    ``config`` (``model.config``, or the model) is required: it runs flat packing's
    capability check (the config and the model's modules) with the tree's refusals
    (``Architecture.check(kind, tree=True)``) and the vocabulary check; ``arch``: an
    architecture already found (``architecture_of(model)``) instead. Either way the batch
    is held to the model's conditions as a flat batch is (``Architecture.check_batch``:
    the longest sequence, its path's depth, and the row's columns)."""
    kind = tree_kind(attn_implementation)
    if arch is None:
        arch = require_config(config, kind, "tree_inputs", tree=True)
        check_vocabulary(getattr(config, "config", config), batch.binding, pad_token_id)
        check_restarts(arch, getattr(config, "config", config))  # hybrids: restart_mixers
    arch.check(kind, tree=True).check_batch(batch.longest, batch.shape[1])
    vocab = batch.binding.vocab_size
    if isinstance(pad_token_id, bool) or not 0 <= int(pad_token_id) < vocab:
        raise InvalidInput(f"pad_token_id {pad_token_id!r} is not a token id in [0, {vocab})")
    pad_token_id = arch.padding_id(pad_token_id, vocab)  # gemma3n: NaN gradients at its pad
    ids = np.where(batch.input_valid, batch.inputs, int(pad_token_id)).astype(np.int64)
    offset = arch.position_offset  # RoBERTa: from padding_idx + 1
    out: dict[str, Any] = {
        "input_ids": torch.as_tensor(ids, device=device),
        "position_ids": torch.as_tensor(batch.position_ids() + offset, device=device),
        "use_cache": False,
    }
    if arch.mixers:  # each node's mixer state starts from its parent's (exactpack.hf.mixers)
        parents = cell_parents(batch.nodes, batch.node_parent, batch.node_col, batch.node_len)
        out[PARENTS] = torch.as_tensor(parents, device=device)
    if attn_implementation in TREE_NAMES:
        register()
        make = flash_plan if attn_implementation == VARLEN_NAME else tree_plan
        return out | {NAME: make(batch, device)}
    masks = tree_layer_masks(batch, kind, arch, dtype, device)
    if not isinstance(masks, dict) or any(m is not None for m in masks.values()):
        out["attention_mask"] = masks  # (Mamba-2: no attention layer, so no mask at all)
    return out


def pack_tree_dataset(
    dataset: Any,
    max_length: int | None = None,
    policy: str | None = None,
    *,
    format: str = "exactpack",
    vocab_size: int | None = None,
    model: Any = None,
    **policy_options: Any,
) -> Any:
    """Tree-pack ``dataset``'s tree columns (``prompt_ids`` + ``completion_ids``, TRL's DPO
    ``prompt_input_ids`` / ``chosen_input_ids`` / ``rejected_input_ids``, or ``input_ids`` +
    ``group``) into a ``datasets.Dataset``, one record per row. ``model=`` (a model or its
    config) is checked as flat ``pack_dataset`` checks it
    (:func:`exactpack.hf.capabilities.check_model`, on tree rows): before reading, then with
    the longest sequence and the vocabulary."""
    import datasets

    from exactpack.hf.streaming import is_stream

    if is_stream(dataset):
        raise InvalidInput(
            f"pack_dataset(..., tree=True) builds its tries from the whole input, so it takes"
            f" a datasets.Dataset, not a stream ({type(dataset).__name__}) — materialise it"
            " first (datasets.Dataset.from_list(list(stream))), or pack files with"
            " exactpack pack --tree"
        )
    if format == "trl":
        raise InvalidInput(
            "format='trl' cannot express a tree: TRL's packed rows hold disjoint sequences"
            " (seq_lengths, restarting position_ids) and no node/parent columns — use the"
            " default format with tree=True"
        )
    if max_length is None:
        raise InvalidInput("pack_dataset(..., tree=True) needs max_length= (cells per row)")
    if model is not None:  # before any read, as flat pack_dataset
        check_model(model, None, None, 0, max_length, tree=True)
    wanted = {name for names in TREE_COLUMNS for name in names}
    columns = {n: dataset[n] if n in wanted else [] for n in dataset.column_names}
    vocab = vocab_size or 1 + max(
        (max_id(columns[n]) for n in columns if n in wanted and n != "group"), default=0
    )
    groups, index = groups_from_columns(
        columns, Binding(int(vocab), "pretokenized", "tree-dataset")
    )
    if model is not None:
        longest = int(groups.lengths.max()) if len(groups) else 0
        check_model(model, groups.binding, None, longest, max_length, tree=True)
    epoch = pack_tree(groups, max_length, policy=policy or "best-fit-decreasing", **policy_options)
    (batch,) = epoch.batches  # sequences named by their index in the input
    batch = dataclasses.replace(batch, seq_index=index[batch.seq_index])
    return datasets.Dataset.from_list(tree_records(batch))


@dataclass
class TreeCollator:
    """``DataLoader`` collate function for tree records (:func:`pack_tree_dataset`,
    ``load_packed(...).records()``): ``{"inputs": tree_inputs(...), "batch": TreeBatch}``;
    call ``model(**out["inputs"])`` and take the loss or the per-sequence views from
    ``out["batch"]`` (:mod:`exactpack.nn.logprobs`). ``config`` (``model.config``, or
    the model) is required."""

    max_length: int
    vocab_size: int
    attn_implementation: str = NAME
    config: Any = None  # required (a field with a default only to keep the order above)
    dtype: Any = None
    pad_token_id: int = 0
    arch: Architecture | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        # HFCollator's check: config needed by the mask kinds, capability (tree), vocabulary
        self.arch = check_collator(
            "TreeCollator",
            self.attn_implementation,
            tree_kind(self.attn_implementation),
            self.config,
            Binding(self.vocab_size, "tree-records", "tree-records"),
            self.pad_token_id,
            tree=True,
        )

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = tree_batch_from_rows(list(features), self.max_length, self.vocab_size)
        inputs = tree_inputs(  # every batch held to the model's conditions
            batch,
            self.attn_implementation,
            arch=self.arch,
            dtype=self.dtype or torch.float32,
            pad_token_id=self.pad_token_id,
        )
        return {"inputs": inputs, "batch": batch}


__all__ = [
    "NAME",
    "TREE_NAMES",
    "VARLEN_NAME",
    "TreeCollator",
    "pack_tree_dataset",
    "tree_allowed",
    "tree_batch_from_rows",
    "tree_block_mask",
    "tree_inputs",
    "tree_layer_masks",
]
