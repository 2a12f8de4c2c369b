"""Tree-packed rows in ``transformers``: inputs per attention kind, and ``seqpack_tree``.

:func:`tree_inputs` gives the keyword arguments that make a causal LM
compute, on tree-packed rows (:class:`~seqpack.core.tree.TreeBatch`), what
each original sequence computes alone:

* ``input_ids`` (padding holds ``pad_token_id``), ``position_ids`` = the
  depth along the path (a branch continues from its parent's last
  position), ``use_cache=False``;
* ``eager`` / ``sdpa``: ``attention_mask``, float additive ``(R, 1, T, T)``
  masks of :func:`~seqpack.core.permission.permitted` (ancestor-or-self
  nodes, causal, windowed along the path), one per layer type for models
  with ``layer_types`` (a padding cell attends to itself only, as in
  :mod:`seqpack.hf.masks`);
* ``flex_attention``: a ``BlockMask`` of the same predicate;
* ``seqpack_tree`` (registered here in ``AttentionInterface``): no mask at
  all; the keyword ``seqpack_tree`` carries the batch's
  :class:`~seqpack.nn.tree_attention.TreePlan` to every layer, whose attention is
  :func:`~seqpack.nn.tree_attention.tree_attention` (``Σ node × path`` score cells)
  with the layer's own window.

Refused with the reason: the flattened kinds (``flash_attention_*``,
``seqpack_varlen``), whose ``cu_seqlens`` describe disjoint intervals and
cannot say "this key is my ancestor" — use ``seqpack_tree``, ``sdpa`` or
``flex_attention``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from seqpack.core.errors import InvalidInput, NotAvailable
from seqpack.core.tree import TreeBatch, check_tree_batch
from seqpack.hf.architectures import ATTENTION_LAYERS, Architecture, describe
from seqpack.hf.kinds import FLATTENED_KINDS, FLEX, attention_kind
from seqpack.nn.tree_attention import TreePlan, tree_attention, tree_mask_mod, tree_plan

NAME = "seqpack_tree"


def tree_allowed(batch: TreeBatch, window: int | None = None) -> np.ndarray:
    """The permission plus each padding cell attending to itself only, bool [R, T, T]."""
    allowed = batch.dense_mask(window)
    pad_r, pad_c = np.nonzero(~batch.input_valid)
    allowed[pad_r, pad_c, pad_c] = True
    return allowed


def tree_block_mask(
    batch: TreeBatch, device: torch.device | str | None = None, window: int | None = None
) -> Any:
    """:func:`tree_allowed` as a FlexAttention ``BlockMask`` over (R, 1, T, T)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def t(a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(a, device=device)

    valid = t(batch.input_valid)
    allowed = tree_mask_mod(valid, t(batch.nodes), t(batch.node_ends), t(batch.positions), window)

    def mask_mod(b: Any, h: Any, q: Any, k: Any) -> Any:
        return allowed(b, h, q, k) | (~valid[b, q] & (q == k))

    rows, width = batch.shape
    return create_block_mask(mask_mod, rows, None, width, width, device=valid.device)


def tree_layer_masks(
    batch: TreeBatch,
    kind: str,
    arch: Architecture | None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Any:
    """The ``attention_mask`` argument: one mask, or ``{layer_type: mask}`` per layer type."""

    def one(window: int | None) -> Any:
        if kind == FLEX:
            return tree_block_mask(batch, device, window)
        allowed = torch.as_tensor(tree_allowed(batch, window), device=device)[:, None]
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
        return mask.masked_fill_(~allowed, torch.finfo(dtype).min)

    if arch is None:
        return one(None)
    if not arch.mask_types:
        return one(arch.window)
    built: dict[int | None, Any] = {}
    out = {}
    for name, window in arch.windows.items():
        if name not in ATTENTION_LAYERS:
            out[name] = None
            continue
        if window not in built:
            built[window] = one(window)
        out[name] = built[window]
    return out


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
    """Keyword arguments for ``model(**kwargs)`` on a tree batch (see the module docstring).

    Tensors are ``(R, T)``; the logits come back ``(R, T, V)``, one per cell:
    :func:`seqpack.nn.tree_attention.sequence_logprobs` and friends unpack them.
    """
    batch = check_tree_batch(batch)
    if arch is None and config is not None:
        arch = describe(config).check()
    vocab = batch.binding.vocab_size
    if isinstance(pad_token_id, bool) or not 0 <= int(pad_token_id) < vocab:
        raise InvalidInput(f"pad_token_id {pad_token_id!r} is not a token id in [0, {vocab})")
    ids = np.where(batch.input_valid, batch.inputs, int(pad_token_id)).astype(np.int64)
    out: dict[str, Any] = {
        "input_ids": torch.as_tensor(ids, device=device),
        "position_ids": torch.as_tensor(batch.position_ids(), device=device),
        "use_cache": False,
    }
    if attn_implementation == NAME:
        register()
        out[NAME] = tree_plan(batch, device)
        return out
    kind = attention_kind(attn_implementation)
    if kind in FLATTENED_KINDS:
        raise NotAvailable(
            f"{attn_implementation} reads cu_seqlens, which describe disjoint intervals and"
            " cannot say 'this key is my ancestor', so it cannot run tree-packed rows — use"
            f" attn_implementation='{NAME}', 'sdpa', 'eager' or 'flex_attention'"
        )
    out["attention_mask"] = tree_layer_masks(batch, kind, arch, dtype, device)
    return out


def seqpack_tree_attention(
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
    from seqpack.hf.attention_impl import refuse_unexpressible, run_on_tokens

    name = type(module).__name__
    refuse_unexpressible(NAME, name, softcap, s_aux, " with tree_inputs")
    plan = kwargs.get(NAME)
    rows, _, width, _ = query.shape
    if plan is None:  # no tree: each row is one sequence (e.g. a sequence run alone)
        _check_unpacked(kwargs.get("position_ids"), name)
        plan = _row_plan(rows, width, query.device)
    if not isinstance(plan, TreePlan):
        raise InvalidInput(
            f"{NAME}: {name} got {type(plan).__name__} as its tree plan — feed the model"
            f" tree_inputs(batch, '{NAME}', config=model.config)"
        )
    if rows * width != plan.cells:
        raise InvalidInput(
            f"{NAME}: the tree plan covers {plan.cells} cells, the call has {rows}x{width}"
        )
    out = run_on_tokens(
        tree_attention, module, query, key, value, plan, dropout, scaling, sliding_window
    )
    return out, None


def _check_unpacked(position_ids: torch.Tensor | None, name: str) -> None:
    if position_ids is None:
        return
    steps = torch.arange(position_ids.shape[-1], device=position_ids.device)
    if not bool((position_ids == position_ids[..., :1] + steps).all()):
        raise InvalidInput(
            f"{NAME}: {name} got position_ids that are not one sequence per row but no tree"
            f" plan — feed the model tree_inputs(batch, '{NAME}', config=model.config)"
        )


def _row_plan(rows: int, width: int, device: torch.device) -> TreePlan:
    """One root node per row: plain causal attention over each row."""
    index = torch.arange(rows * width, device=device)
    scatter = index + 1
    return TreePlan(((rows, width, width, index, index),), scatter, rows * width, 0, {})


def register() -> str:
    """Register :data:`NAME` with ``transformers.AttentionInterface`` (idempotent); return it."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, seqpack_tree_attention)
    return NAME


__all__ = [
    "NAME",
    "register",
    "seqpack_tree_attention",
    "tree_allowed",
    "tree_block_mask",
    "tree_inputs",
    "tree_layer_masks",
]
