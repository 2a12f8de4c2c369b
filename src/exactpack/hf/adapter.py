"""Hugging Face ``transformers``: the keyword arguments that make a causal LM honour packing.

:func:`hf_inputs` gives what the implementation's kind reads (:mod:`exactpack.hf.kinds`):
the masks of :mod:`exactpack.hf.masks` (eager, sdpa, flex), or for the flattened kinds the
valid cells as ``(1, N)`` with ``cu_seq_lens_q/k``, ``max_length_q/k`` and ``seq_idx``;
and always ``input_ids`` (``pad_token_id`` on padding), local ``position_ids``,
``use_cache=False``, and with ``labels`` both ``labels`` (unshifted) and ``shift_labels``
(:mod:`exactpack.training.labels`). Fixture row 0 (A = columns 0-2, B = 3-4, padding at 5)
for ``sdpa``::

    input_ids     [ 0, 99, 100,    0,  101, 0]      pad_token_id 0 at column 5
    position_ids  [ 0,  1,   2,    0,    1, 0]
    shift_labels  [99, 100,  1,  101,    1, -100]
    labels        [-100, 99, 100, -100, 101, -100]
    attention_mask[0, 0]: 0 on A's 3x3 and B's 2x2 causal blocks and on (5, 5),
                          finfo.min elsewhere
    seq_idx       [ 0,  0,   0,    1,    1, -1]     models with mixers (exactpack.hf.mixers)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from exactpack.core.batch import PackedBatch
from exactpack.core.compact import CompactRows
from exactpack.core.errors import InvalidInput
from exactpack.core.loss import LossResult, LossSum, divide, token_weighted_sum
from exactpack.hf.architectures import Architecture
from exactpack.hf.capabilities import check_config
from exactpack.hf.kinds import FLATTENED_KINDS, TREE, TREE_NAMES, attention_kind, tree_kind
from exactpack.hf.masks import layer_masks
from exactpack.hf.mixers import PARENTS, cell_parents, cell_seq_idx
from exactpack.nn.tree_attention import tree_plan
from exactpack.training.labels import seq_idx
from exactpack.training.rows import PAD_FILL, compact_of, cu_seq_lens, flat_columns, pad_cells

#: The built-in implementations ``exactpack verify`` runs (any registered one is fed by kind).
IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention", "flash_attention_2", "exactpack_varlen")
#: Built-in implementations fed the valid cells flattened into one row, with ``cu_seq_lens``.
FLATTENED = ("flash_attention_2", "exactpack_varlen")


def hf_inputs(
    batch: PackedBatch,
    attn_implementation: str,
    *,
    config: Any,
    kind: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Keyword arguments for ``model(**kwargs)`` that keep ``batch``'s examples apart.

    ``config`` (``model.config``, or the model) is required: it decides windows and
    per-layer-type masks, raises ``UnsupportedArchitecture`` where the model cannot be exact,
    and refuses a vocabulary or pad id its embedding cannot index. ``kind=``: the kind of a
    name exactpack cannot tell (:mod:`exactpack.hf.kinds`). ``options``
    (:func:`build_inputs`): ``dtype`` (default: the model's — its parameters' when
    ``config`` is the model, else ``config.dtype``, else float32), ``device``, ``mask``
    (``"float"``; ``"bool"``: sdpa only), ``pad_token_id`` (0), ``labels`` (True: ``labels`` and
    ``shift_labels``) and ``num_items_in_batch`` (the step's global eligible count). Tensors
    are ``(R, T)``, or ``(1, N)`` of the valid cells for the flattened kinds
    (:func:`cell_logits`).

    Forest rows (``batch.is_tree``, docs/tree.md): depth
    ``position_ids``, the masks with the tree's node ends, or for ``exactpack_tree`` /
    ``exactpack_tree_varlen`` no mask and the attention plan as the keyword
    ``exactpack_tree``; no labels (a target's weight counts its sequences: ``token_weighted_loss``).
    The capability check adds the tree's refusals (``Architecture.check(kind, tree=True)``);
    the flattened kinds refuse it (:func:`~exactpack.hf.kinds.tree_kind`).
    """
    tree = isinstance(batch, PackedBatch) and batch.is_tree
    kind = (tree_kind if tree else attention_kind)(attn_implementation, kind)
    pad = options.get("pad_token_id", 0)
    arch = check_config(config, kind, "hf_inputs", batch.binding, pad, tree=tree)
    if "dtype" not in options:  # the mask in the model's dtype, not float32's
        param = next(config.parameters(), None) if isinstance(config, torch.nn.Module) else None
        model_config = getattr(config, "config", config)
        dtype = param.dtype if param is not None else getattr(model_config, "dtype", None)
        options["dtype"] = dtype if isinstance(dtype, torch.dtype) else torch.float32
    return build_inputs(batch, attn_implementation, arch, kind=kind, **options)


def build_inputs(
    batch: PackedBatch | CompactRows,
    attn_implementation: str,
    arch: Architecture | None,
    *,
    mask: str = "float",
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    pad_token_id: int = 0,
    labels: bool = True,
    num_items_in_batch: int | None = None,
    kind: str | None = None,
) -> dict[str, Any]:
    """:func:`hf_inputs` for a checked architecture; its batch conditions are checked on
    every batch (a tree's with its refusals). Padded cells and masks are made only for the
    kinds that read a mask."""
    tree = isinstance(batch, PackedBatch) and batch.is_tree
    kind = (tree_kind if tree else attention_kind)(attn_implementation, kind)
    rows = batch if tree else compact_of(batch)
    flat = kind in FLATTENED_KINDS and not tree  # one flattened row of every valid cell
    longest = batch.longest if tree else int(rows.lengths.max()) if len(rows) else 0
    width = batch.shape[1] if tree else int(rows.lengths.sum()) if flat else rows.capacity
    if arch is not None:  # every batch: a tree's refusals, then the conditions
        if tree:
            arch.check(kind, tree=True)
        arch.check_batch(longest, width)
    vocab = rows.binding.vocab_size
    if isinstance(pad_token_id, bool) or not 0 <= int(pad_token_id) < vocab:
        raise InvalidInput(
            f"pad_token_id {pad_token_id!r} is not a token id of the batch's vocabulary"
            f" [0, {vocab}) — pass any real id (padding cells are never seen by real queries)"
        )
    offset = 0 if arch is None else arch.position_offset  # RoBERTa family: padding_idx + 1
    if arch is not None:  # gemma3n: its pad id's zero embedding row gives NaN gradients
        pad_token_id = arch.padding_id(pad_token_id, vocab)
    out = (
        _tree_cells(batch, int(pad_token_id), offset, device)
        if tree
        else _flat_cells(rows, flat, labels, int(pad_token_id), offset, device)
    )
    index = out.pop("valid_index", None)  # flat rows' valid cells (NumPy)
    mixers = arch is not None and bool(arch.mixers)
    if tree and mixers:  # each node's mixer state starts from its parent's
        occ = batch.occurrences
        parents = cell_parents(batch.segments, batch.node_parent, occ.col_start, occ.lengths)
        out[PARENTS] = torch.as_tensor(parents, device=device)
    if tree and attn_implementation in TREE_NAMES:  # no mask: the plan, by keyword
        flash = attn_implementation != TREE  # exactpack_tree_varlen: a varlen kernel
        out[TREE] = dataclasses.replace(tree_plan(batch, device), flash=flash)
    elif flat:
        cu = cu_seq_lens(rows)
        cu_t = torch.as_tensor(cu, device=device)
        out |= {"cu_seq_lens_q": cu_t, "cu_seq_lens_k": cu_t}
        out |= {"max_length_q": longest, "max_length_k": longest}
        out["seq_idx"] = torch.as_tensor(seq_idx(cu), device=device)
    elif mixers and not tree:  # each cell's example: where mixers restart
        ids = cell_seq_idx(rows.lengths, index, (rows.num_rows, rows.capacity))
        out["seq_idx"] = torch.as_tensor(ids, device=device)
    if not flat and TREE not in out and (arch is None or not arch.mask_from_positions):
        # (falcon's ALiBi builds its own mask from the restarting position_ids)
        padded = batch if isinstance(batch, PackedBatch) else rows.to_batch()
        masks = layer_masks(padded, kind, arch, mask=mask, dtype=dtype, device=device)
        if not isinstance(masks, dict) or any(m is not None for m in masks.values()):
            out["attention_mask"] = masks  # (Mamba: no attention layer, so no mask at all)
    if labels and not tree and num_items_in_batch is not None:
        out["num_items_in_batch"] = int(num_items_in_batch)
    out["use_cache"] = False
    return out


def _flat_cells(
    rows: CompactRows, flat: bool, labels: bool, pad_token_id: int, offset: int, device: Any
) -> dict[str, Any]:
    """``input_ids``, ``position_ids`` (+ ``labels``, ``shift_labels``) of flat rows, padded to
    ``(R, T)`` or ``(1, N)`` (``flat``), and their ``valid_index`` (NumPy)."""
    cells = flat_columns(rows)
    index = cells.pop("valid_index")
    cells["position_ids"] = cells["position_ids"] + offset
    names = ("input_ids", "position_ids") + (("labels", "shift_labels") if labels else ())
    shape = (rows.num_rows, rows.capacity)
    fill = PAD_FILL | {"input_ids": pad_token_id} | ({"position_ids": offset} if offset else {})
    out: dict[str, Any] = {"valid_index": index}
    for name in names:
        value = cells[name][None] if flat else pad_cells(cells[name], index, shape, fill[name])
        out[name] = torch.as_tensor(value, device=device)
    return out


def _tree_cells(batch: PackedBatch, pad_token_id: int, offset: int, device: Any) -> dict[str, Any]:
    """``input_ids`` and depth ``position_ids`` of tree rows, ``(R, T)``."""
    ids = np.where(batch.input_valid, batch.inputs, pad_token_id).astype(np.int64)
    return {
        "input_ids": torch.as_tensor(ids, device=device),
        "position_ids": torch.as_tensor(batch.position_ids() + offset, device=device),
    }


def cell_logits(logits: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """Logits as the batch's cells, ``(R, T, V)``: a padded call's as they are, a flattened
    call's ``(1, N, V)`` scattered back by ``valid_index`` (zeros at padding cells)."""
    rows, width = batch.shape
    if logits.ndim == 3 and tuple(logits.shape[:2]) == (rows, width):
        return logits
    cu = batch.cu_seqlens()
    n = int(cu.valid_index.shape[0])
    if logits.ndim != 3 or tuple(logits.shape[:2]) != (1, n):
        raise InvalidInput(
            f"logits of shape {tuple(logits.shape)} fit neither the batch's cells"
            f" ({rows}, {width}, V) nor its {n} flattened valid cells (1, {n}, V)"
        )
    out = logits.new_zeros((rows * width, logits.shape[-1]))
    index = torch.as_tensor(cu.valid_index, device=logits.device)
    return out.index_copy(0, index, logits[0]).reshape(rows, width, -1)


def hf_loss_sum(logits: torch.Tensor, batch: PackedBatch) -> LossSum:
    """Raw NLL sum over the eligible targets and their count, from a model's logits (refused
    when they cover less than the batch's vocabulary)."""
    return token_weighted_sum(cell_logits(logits, batch), batch)


def hf_loss(logits: torch.Tensor, batch: PackedBatch, count: int | None = None) -> LossResult:
    """Token-weighted loss from a model's logits: raw sum / ``count`` (default: this batch's N;
    pass the step's global eligible count under accumulation or data parallelism)."""
    return divide(hf_loss_sum(logits, batch), count)
