"""Tree-packed rows in ``transformers``: inputs per attention kind, ``exactpack_tree``, datasets.

:func:`tree_inputs` gives a causal LM on tree-packed rows
(:class:`~exactpack.core.tree.TreeBatch`) what makes it compute each sequence as alone:
``input_ids`` (``pad_token_id`` on padding), depth ``position_ids``, ``use_cache=False``,
and by kind: the masks of :mod:`exactpack.hf.masks` (``eager`` / ``sdpa`` /
``flex_attention``, with the tree's node ends), or for ``exactpack_tree`` /
``exactpack_tree_varlen`` no mask and the plan as the keyword ``exactpack_tree``
(:func:`~exactpack.nn.tree_attention.tree_attention` /
:func:`~exactpack.nn.tree_attention.tree_flash_attention`). The flattened kinds are refused.
:func:`pack_tree_dataset` (``pack_dataset(..., tree=True)``) packs a ``Dataset``'s groups
into one record per row; :class:`TreeCollator` turns records into a model call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from exactpack.core.binding import Binding
from exactpack.core.errors import InvalidInput, NotAvailable
from exactpack.core.tree import TREE_COLUMNS, TreeBatch, groups_from_columns, pack_tree
from exactpack.hf.architectures import Architecture, UnsupportedArchitecture
from exactpack.hf.capabilities import capability_once, check_vocabulary
from exactpack.hf.kinds import FLATTENED_KINDS, attention_kind
from exactpack.hf.masks import block_mask, hf_allowed, layer_masks
from exactpack.io.tree_store import max_id, tree_batch_from_rows, tree_records
from exactpack.nn.tree_attention import (
    FlashPlan,
    TreePlan,
    flash_plan,
    tree_attention,
    tree_flash_attention,
    tree_plan,
)

NAME = "exactpack_tree"
#: The same rows through a varlen kernel
#: (:func:`~exactpack.nn.tree_attention.tree_flash_attention`).
VARLEN_NAME = "exactpack_tree_varlen"  # ("flash" in a name sends transformers to the hub)
TREE_NAMES = (NAME, VARLEN_NAME)
#: Models that apply their sliding window themselves, as a band over the row's columns.
COLUMN_WINDOWS = {"gpt_neo": "its local layers apply window_size as a band over the row's columns"}


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


def check_tree(arch: Architecture, attn_implementation: str) -> Architecture:
    """``arch`` if tree rows on ``attn_implementation`` are exact, else why not: flat
    packing's refusals, positions read from the row's columns, and :data:`TREE_NAMES` where
    ``exactpack_varlen`` is refused."""
    ours = attn_implementation in TREE_NAMES
    arch.check(None if ours else attention_kind(attn_implementation))
    if ours and arch.varlen_refusal is not None:
        raise UnsupportedArchitecture(
            f"{arch.model_type} cannot run attn_implementation='{attn_implementation}', which"
            f" runs where exactpack_varlen runs (the plan rides the same attention kwargs):"
            f" {arch.varlen_refusal.removeprefix(arch.model_type + ': ')}"
        )
    why = COLUMN_WINDOWS.get(arch.model_type)
    if arch.positions in ("relative", "none") or arch.mask_from_positions:
        why = {
            "relative": "its rotary tables are indexed by column",
            "none": "it takes no position_ids, so any position it uses (mpt's ALiBi) is the column",
        }.get(arch.positions, "its ALiBi bias is built from the row's columns")
    if why is not None:
        raise UnsupportedArchitecture(
            f"{arch.model_type} cannot run tree-packed rows: {why}, and a branch's columns do"
            " not continue its parent's positions"
        )
    return arch


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
    come back ``(R, T, V)`` (:func:`exactpack.nn.tree_attention.sequence_logprobs`).
    ``config`` (``model.config``, or the model) is required: it decides windows and refusals
    (``arch``: a capability already checked with :func:`check_tree` instead)."""
    if arch is None:
        if config is None:
            raise InvalidInput(
                "tree_inputs needs the model's config to know its sliding windows and refusals"
                " — pass tree_inputs(..., config=model.config)"
            )
        arch = check_tree(capability_once(config), attn_implementation)
        check_vocabulary(getattr(config, "config", config), batch.binding, pad_token_id)
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
    if attn_implementation in TREE_NAMES:
        register(attn_implementation)
        make = flash_plan if attn_implementation == VARLEN_NAME else tree_plan
        return out | {NAME: make(batch, device)}
    kind = attention_kind(attn_implementation)
    if kind in FLATTENED_KINDS:
        raise NotAvailable(
            f"{attn_implementation} reads cu_seqlens, which describe disjoint intervals and"
            " cannot say 'this key is my ancestor', so it cannot run tree-packed rows — use"
            f" attn_implementation='{NAME}', 'sdpa', 'eager' or 'flex_attention'"
        )
    return out | {"attention_mask": tree_layer_masks(batch, kind, arch, dtype, device)}


def exactpack_tree_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``transformers`` attention over tree rows: ``query`` (R, H, T, D) -> (R, T, H, Dv)."""
    from exactpack.hf.attention_impl import refuse_mask, refuse_unexpressible, run_on_tokens

    name = type(module).__name__
    refuse_unexpressible(NAME, name, softcap, s_aux, " with tree_inputs")
    refuse_mask(NAME, name, attention_mask, f"tree_inputs(batch, '{NAME}', config=model.config)")
    plan = kwargs.get(NAME)
    rows, _, width, _ = query.shape
    feed = f"feed the model tree_inputs(batch, '{NAME}', config=model.config)"
    if plan is None:  # no tree: each row is one sequence (e.g. a sequence run alone)
        pos = kwargs.get("position_ids")
        if pos is not None and not bool(
            (pos == pos[..., :1] + torch.arange(width, device=pos.device)).all()
        ):
            raise InvalidInput(
                f"{NAME}: {name} got position_ids that are not one sequence per row but no tree"
                f" plan — {feed}"
            )
        index = torch.arange(rows * width, device=query.device)  # one root node per row
        plan = TreePlan(((rows, width, width, index, index),), index + 1, rows * width, 0)
    if not isinstance(plan, (TreePlan, FlashPlan)) or rows * width != plan.cells:
        raise InvalidInput(f"{NAME}: {name} got a tree plan that is not this call's — {feed}")
    run = tree_flash_attention if isinstance(plan, FlashPlan) else tree_attention
    return run_on_tokens(
        run, module, query, key, value, plan, dropout, scaling, sliding_window
    ), None


def register(name: str = NAME) -> str:
    """Register ``name`` (one of :data:`TREE_NAMES`) with ``transformers.AttentionInterface``
    and ``AttentionMaskInterface`` (idempotent); return it. Both run
    :func:`exactpack_tree_attention`; the plan decides."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from exactpack.hf.attention_impl import padding_mask

    AttentionInterface.register(name, exactpack_tree_attention)
    AttentionMaskInterface.register(name, padding_mask)
    return name


def pack_tree_dataset(
    dataset: Any,
    max_length: int | None = None,
    policy: str | None = None,
    *,
    format: str = "exactpack",
    vocab_size: int | None = None,
    **policy_options: Any,
) -> Any:
    """Tree-pack ``dataset``'s tree columns (``prompt_ids`` + ``completion_ids``, TRL's DPO
    ``prompt_input_ids`` / ``chosen_input_ids`` / ``rejected_input_ids``, or ``input_ids`` +
    ``group``) into a ``datasets.Dataset``, one record per row."""
    import datasets

    if format == "trl":
        raise InvalidInput(
            "format='trl' cannot express a tree: TRL's packed rows hold disjoint sequences"
            " (seq_lengths, restarting position_ids) and no node/parent columns — use the"
            " default format with tree=True"
        )
    if max_length is None:
        raise InvalidInput("pack_dataset(..., tree=True) needs capacity= (cells per row)")
    wanted = {name for names in TREE_COLUMNS for name in names}
    columns = {n: dataset[n] if n in wanted else [] for n in dataset.column_names}
    vocab = vocab_size or 1 + max(
        (max_id(columns[n]) for n in columns if n in wanted and n != "group"), default=0
    )
    groups = groups_from_columns(columns, Binding(int(vocab), "pretokenized", "tree-dataset"))
    epoch = pack_tree(groups, max_length, policy=policy or "best-fit-decreasing", **policy_options)
    (batch,) = epoch.batches
    return datasets.Dataset.from_list(tree_records(batch))


@dataclass
class TreeCollator:
    """``DataLoader`` collate function for tree records (:func:`pack_tree_dataset`,
    ``load_packed(...).records()``): ``{"inputs": tree_inputs(...), "batch": TreeBatch}``;
    call ``model(**out["inputs"])`` and take the loss or the per-sequence views from
    ``out["batch"]`` (:mod:`exactpack.nn.tree_attention`). ``config`` (``model.config``, or
    the model) is required."""

    capacity: int
    vocab_size: int
    attn_implementation: str = NAME
    config: Any = None  # required (a field with a default only to keep the order above)
    dtype: Any = None
    pad_token_id: int = 0

    def __post_init__(self) -> None:
        if self.config is None:
            raise InvalidInput(
                "TreeCollator needs the model's config to know its sliding windows and refusals"
                " — pass TreeCollator(..., config=model.config)"
            )
        check_tree(capability_once(self.config), self.attn_implementation)

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = tree_batch_from_rows(list(features), self.capacity, self.vocab_size)
        inputs = tree_inputs(
            batch,
            self.attn_implementation,
            config=self.config,
            dtype=self.dtype or torch.float32,
            pad_token_id=self.pad_token_id,
        )
        return {"inputs": inputs, "batch": batch}


__all__ = [
    "NAME",
    "VARLEN_NAME",
    "TreeCollator",
    "check_tree",
    "exactpack_tree_attention",
    "pack_tree_dataset",
    "register",
    "tree_allowed",
    "tree_batch_from_rows",
    "tree_block_mask",
    "tree_inputs",
    "tree_layer_masks",
]
