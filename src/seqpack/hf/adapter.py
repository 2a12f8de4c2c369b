"""Hugging Face ``transformers``: the keyword arguments that make a causal LM honour packing.

A ``transformers`` causal LM fed a packed row the way most code does —
``model(input_ids, position_ids=...)`` — attends **across** the examples of
the row: with the default ``use_cache=True`` a cache object exists, and
``transformers`` (5.x) looks for packed ``position_ids`` only when there is
no cache (some older versions never look). The eager implementation also *adds*
a boolean 4-D mask to the scores as numbers. :func:`hf_inputs` gives the
arguments that are right on each implementation:

arguments that are right on each implementation, by its kind
(:mod:`seqpack.hf.kinds`: any name registered in ``AttentionInterface``,
hub kernels included, is accepted by what it reads):

* ``eager``, ``sdpa``: ``attention_mask``, a float additive ``(R, 1, T, T)``
  mask in the model's dtype — 0 where :func:`hf_allowed` permits, the
  dtype's most negative value elsewhere (``mask="bool"``: a boolean mask,
  for the ``sdpa`` kind only);
* ``flex``: ``attention_mask``, a FlexAttention ``BlockMask`` of the same
  predicate;
* ``flash`` (``flash_attention_2/3/4``, ``kernels-community/flash-attn2``
  ...) and ``seqpack_varlen`` (:mod:`seqpack.hf.attention_impl`), no mask at all:
  the valid cells flattened into one row ``(1, N)`` (padding dropped) with
  ``cu_seq_lens_q/k`` = the batch's ``cu_seqlens``, ``max_length_q/k`` = its
  ``max_seqlen`` and ``seq_idx`` (int32, 0-based; ``transformers`` infers
  boundaries from ``position_ids`` only for a batch of one row);

and always ``input_ids`` (padding cells hold ``pad_token_id``, a real id
no real query ever sees), local ``position_ids`` and ``use_cache=False``.

Pass the model's ``config``: its sliding windows and layer types decide
the masks (``{"full_attention": ..., "sliding_attention": ...}`` for a
model with ``layer_types``; a windowed single mask for Mistral-style
configs; the flash kernels and ``seqpack_varlen`` take the window from
the layer), and architectures that cannot be made exact are refused
(:mod:`seqpack.hf.architectures`). Without a config every layer gets the
plain block-causal mask, which is right only for models without windows.

Labels (:mod:`seqpack.training.labels`): seqpack's targets are already
shifted (cell ``c`` predicts ``targets[c]``; an example's last target, e.g.
its EOS, is no input of the row). The adapter passes them as
``shift_labels``, which ``ForCausalLMLoss`` uses as they are, and
``labels`` with ``transformers``' own meaning (unshifted, ``-100`` at each
example's first cell), which a model needs to compute a loss at all and
which never puts pre-shifted targets under that name. ``Trainer`` counts
``num_items_in_batch`` from ``shift_labels``, so its loss is the raw sum
over eligible targets divided once by their count across
gradient-accumulation micro-batches (and ranks, with
``average_tokens_across_devices``). ``transformers`` computes that loss in
float32; :func:`hf_loss` computes it from the logits with
:mod:`seqpack.loss` in the logits' dtype.

Fixture row 0 (A = columns 0-2, B = 3-4, padding at 5) for ``sdpa``::

    input_ids     [ 0, 99, 100,    0,  101, 0]      pad_token_id 0 at column 5
    position_ids  [ 0,  1,   2,    0,    1, 0]
    shift_labels  [99, 100,  1,  101,    1, -100]
    labels        [-100, 99, 100, -100, 101, -100]   transformers' unshifted labels
    attention_mask[0, 0]: 0 on A's 3x3 and B's 2x2 causal blocks and on (5, 5),
                          finfo.min elsewhere
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from seqpack.core.batch import IGNORE_INDEX, PackedBatch
from seqpack.core.errors import InvalidInput
from seqpack.core.loss import LossResult, LossSum, divide, masked_nll_sum
from seqpack.hf.architectures import Architecture
from seqpack.hf.capability import capability
from seqpack.hf.kinds import FLATTENED_KINDS, attention_kind
from seqpack.hf.masks import additive_mask, block_mask, bool_mask, hf_allowed, layer_masks
from seqpack.training.labels import model_labels, seq_idx, shift_labels

#: The built-in implementations ``seqpack verify`` runs (any registered one is fed by kind).
IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention", "flash_attention_2", "seqpack_varlen")
#: Built-in implementations fed the valid cells flattened into one row, with ``cu_seq_lens``.
FLATTENED = ("flash_attention_2", "seqpack_varlen")


def check_implementation(attn_implementation: str, kind: str | None = None) -> str:
    """The kind of ``attn_implementation`` (:func:`seqpack.hf.kinds.attention_kind`)."""
    return attention_kind(attn_implementation, kind)


def hf_labels(batch: PackedBatch) -> np.ndarray:
    """Deprecated: the pre-shifted targets, now :func:`seqpack.training.labels.shift_labels`."""
    warnings.warn(
        "hf_labels gives pre-shifted targets, which transformers reads as 'shift_labels', not"
        " 'labels'; call seqpack.training.labels.shift_labels (or model_labels for transformers'"
        " unshifted labels)",
        DeprecationWarning,
        stacklevel=2,
    )
    return shift_labels(batch)


def hf_inputs(
    batch: PackedBatch,
    attn_implementation: str,
    *,
    config: Any = None,
    mask: str = "float",
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    pad_token_id: int = 0,
    labels: bool = True,
    num_items_in_batch: int | None = None,
    kind: str | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``model(**kwargs)`` that keep ``batch``'s examples apart.

    ``config`` is the model's (``model.config``): windows and per-layer-type
    masks follow it, and an architecture seqpack cannot make exact raises
    :class:`~seqpack.hf.architectures.UnsupportedArchitecture`. ``dtype`` is
    the model's (the additive mask must match it for ``sdpa``); ``mask``:
    ``"float"`` or ``"bool"`` (``sdpa`` kind only). ``attn_implementation``
    is any name ``transformers`` accepts whose kind seqpack can tell
    (``kind=`` states it otherwise; :mod:`seqpack.hf.kinds`). With
    ``labels`` the dict has ``labels`` and ``shift_labels`` (see the module
    docstring) so ``model(**kwargs).loss`` is token-weighted; ``num_items_in_batch`` (the
    optimizer step's global eligible count, known from the plan) makes it the
    raw sum divided by that count instead of by this batch's. Tensors are
    ``(R, T)`` except for the flattened implementations, where they are
    ``(1, N)`` over the valid cells in row-major order (:func:`cell_logits`
    puts logits back into cells).
    """
    kind = attention_kind(attn_implementation, kind)
    arch = None if config is None else capability(config).check(kind)
    return build_inputs(
        batch,
        attn_implementation,
        arch,
        mask=mask,
        dtype=dtype,
        device=device,
        pad_token_id=pad_token_id,
        labels=labels,
        num_items_in_batch=num_items_in_batch,
        kind=kind,
    )


def build_inputs(
    batch: PackedBatch,
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
    """:func:`hf_inputs` for an already checked architecture (:func:`capability`).

    The architecture's batch conditions (longest example, row width) are
    checked here, on every batch, and its position offset applied.
    """
    kind = attention_kind(attn_implementation, kind)
    if arch is not None:
        occ = batch.occurrences
        longest = int((occ.col_end - occ.col_start).max()) if len(occ.col_end) else 0
        flat = kind in FLATTENED_KINDS  # one flattened row of every valid cell
        arch.check_batch(longest, int(batch.input_valid.sum()) if flat else batch.shape[1])
    vocab = batch.binding.vocab_size
    if isinstance(pad_token_id, bool) or not 0 <= int(pad_token_id) < vocab:
        raise InvalidInput(
            f"pad_token_id {pad_token_id!r} is not a token id of the batch's vocabulary"
            f" [0, {vocab}) — pass any real id (padding cells are never seen by real queries)"
        )
    ids = np.where(batch.input_valid, batch.inputs, int(pad_token_id)).astype(np.int64)
    positions = batch.position_ids()
    if arch is not None and arch.position_offset:  # RoBERTa family: from padding_idx + 1
        positions = positions + arch.position_offset
    columns = {"input_ids": ids, "position_ids": positions}
    if labels:
        columns |= {"labels": model_labels(batch), "shift_labels": shift_labels(batch)}
    out: dict[str, Any] = {}
    if kind in FLATTENED_KINDS:
        if attn_implementation == "seqpack_varlen":
            from seqpack.hf.attention_impl import register

            register()
        cu = batch.cu_seqlens()
        for name, value in columns.items():
            out[name] = torch.as_tensor(value.reshape(-1)[cu.valid_index][None], device=device)
        cu_seqlens = torch.as_tensor(cu.cu_seqlens, dtype=torch.int32, device=device)
        out |= {
            "cu_seq_lens_q": cu_seqlens,
            "cu_seq_lens_k": cu_seqlens,
            "max_length_q": cu.max_seqlen,
            "max_length_k": cu.max_seqlen,
            "seq_idx": torch.as_tensor(seq_idx(cu.cu_seqlens), device=device),
        }
    elif arch is not None and arch.mask_from_positions:
        # falcon's ALiBi needs its own 2-D mask; transformers (use_cache=False) finds the
        # examples from the restarting position_ids and builds the block-causal mask
        out = {name: torch.as_tensor(value, device=device) for name, value in columns.items()}
    else:
        out = {name: torch.as_tensor(value, device=device) for name, value in columns.items()}
        out["attention_mask"] = layer_masks(
            batch, kind, arch, mask=mask, dtype=dtype, device=device
        )
    if labels and num_items_in_batch is not None:
        out["num_items_in_batch"] = int(num_items_in_batch)
    out["use_cache"] = False
    return out


def cell_logits(logits: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """Logits laid out as the batch's cells, ``(R, T, V)``.

    Accepts the ``(R, T, V)`` output of a padded-row call (returned as is) or
    the ``(1, N, V)`` output of a flattened (``flash_attention_2``) call,
    scattered back by ``valid_index`` with zeros at padding cells.
    """
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
    """Raw NLL sum over the eligible targets and their count, from a model's logits."""
    cells = cell_logits(logits, batch)
    if cells.shape[-1] < batch.binding.vocab_size:
        raise InvalidInput(
            f"the model has {cells.shape[-1]} vocabulary logits but the batch's binding has"
            f" vocab_size {batch.binding.vocab_size} — use a model whose vocabulary covers it"
        )
    return masked_nll_sum(cells, batch.targets, batch.loss_mask)


def hf_loss(logits: torch.Tensor, batch: PackedBatch, count: int | None = None) -> LossResult:
    """Token-weighted loss from a model's logits: raw sum / ``count`` (default: this batch's N).

    Pass the optimizer step's global eligible count as ``count`` under
    gradient accumulation or data parallelism.
    """
    return divide(hf_loss_sum(logits, batch), count)


__all__ = [
    "FLATTENED",
    "IGNORE_INDEX",
    "IMPLEMENTATIONS",
    "additive_mask",
    "block_mask",
    "bool_mask",
    "build_inputs",
    "cell_logits",
    "hf_allowed",
    "hf_inputs",
    "hf_labels",
    "hf_loss",
    "hf_loss_sum",
    "model_labels",
    "shift_labels",
]
