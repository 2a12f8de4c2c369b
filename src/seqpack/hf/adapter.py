"""Hugging Face ``transformers``: the keyword arguments that make a causal LM honour packing.

A ``transformers`` causal LM fed a packed row the way most code does —
``model(input_ids, position_ids=...)`` — attends **across** the examples of
the row: with the default ``use_cache=True`` a cache object exists, and
``transformers`` (5.x) looks for packed ``position_ids`` only when there is
no cache (some older versions never look). The eager implementation also *adds*
a boolean 4-D mask to the scores as numbers. :func:`hf_inputs` gives the
arguments that are right on each implementation:

* ``eager``, ``sdpa``: ``attention_mask``, a float additive ``(R, 1, T, T)``
  mask in the model's dtype — 0 where :func:`hf_allowed` permits, the
  dtype's most negative value elsewhere (never boolean);
* ``flex_attention``: ``attention_mask``, a FlexAttention ``BlockMask`` of
  the same predicate;
* ``flash_attention_2``: the valid cells flattened into one row ``(1, N)``
  (padding dropped) with ``cu_seq_lens_q/k`` = the batch's ``cu_seqlens``
  and ``max_length_q/k`` = its ``max_seqlen`` (``transformers`` infers
  boundaries from ``position_ids`` only for a batch of one row);

and always ``input_ids`` (padding cells hold ``pad_token_id``, a real id
no real query ever sees), local ``position_ids`` and ``use_cache=False``.

Labels: seqpack's targets are already shifted (cell ``c`` predicts
``targets[c]``; an example's last target, e.g. its EOS, is no input of
the row), so they cannot be given to ``transformers`` as unshifted
``labels``. The adapter passes ``labels`` *and* ``shift_labels``, both the
per-cell targets with ``-100`` where the target is not loss-eligible:
``ForCausalLMLoss`` uses ``shift_labels`` as they are and never shifts
again, and ``Trainer`` counts ``num_items_in_batch`` from ``shift_labels``,
so its loss is the raw sum over eligible targets divided once by their count
across gradient-accumulation micro-batches (and ranks, with
``average_tokens_across_devices``). ``transformers`` computes that loss in
float32; :func:`hf_loss` computes it from the logits with
:mod:`seqpack.loss` in the logits' dtype.

Fixture row 0 (A = columns 0-2, B = 3-4, padding at 5) for ``sdpa``::

    input_ids     [ 0, 99, 100,    0,  101, 0]      pad_token_id 0 at column 5
    position_ids  [ 0,  1,   2,    0,    1, 0]
    labels        [99, 100,  1,  101,    1, -100]   = shift_labels
    attention_mask[0, 0]: 0 on A's 3x3 and B's 2x2 causal blocks and on (5, 5),
                          finfo.min elsewhere
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from seqpack.core.batch import IGNORE_INDEX, PackedBatch
from seqpack.core.errors import InvalidInput
from seqpack.core.loss import LossResult, LossSum, divide, masked_nll_sum
from seqpack.nn.flex import permission_mod

#: Attention implementations :func:`hf_inputs` knows how to serve.
IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention", "flash_attention_2")


def check_implementation(attn_implementation: str) -> str:
    if attn_implementation not in IMPLEMENTATIONS:
        raise InvalidInput(
            f"attention implementation {attn_implementation!r} is not supported by the packed"
            f" adapter; choose one of {', '.join(IMPLEMENTATIONS)}"
        )
    return attn_implementation


def hf_allowed(batch: PackedBatch) -> np.ndarray:
    """The permission plus each padding cell attending to itself only, bool ``[R, T, T]``.

    Every query then has at least one key, so no implementation meets a
    fully masked row (no NaN, no uniform average over the row); no real
    query ever sees a padding key, and padding logits never reach the loss.
    """
    allowed = batch.dense_mask()
    pad_r, pad_c = np.nonzero(~batch.input_valid)
    allowed[pad_r, pad_c, pad_c] = True
    return allowed


def additive_mask(
    batch: PackedBatch, dtype: torch.dtype, device: torch.device | str | None = None
) -> torch.Tensor:
    """:func:`hf_allowed` as a float additive mask ``(R, 1, T, T)``: 0 or ``finfo(dtype).min``."""
    if not dtype.is_floating_point:
        raise InvalidInput(f"an additive mask needs a floating dtype (the model's), got {dtype}")
    allowed = torch.as_tensor(hf_allowed(batch), device=device)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def block_mask(batch: PackedBatch, device: torch.device | str | None = None) -> Any:
    """:func:`hf_allowed` as a FlexAttention ``BlockMask`` over ``(R, 1, T, T)``."""
    from torch.nn.attention.flex_attention import create_block_mask

    def t(a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(a, device=device)

    valid = t(batch.input_valid)
    allowed = permission_mod(valid, t(batch.segments), t(batch.positions))

    def permitted(b: Any, h: Any, q: Any, k: Any) -> Any:
        return allowed(b, h, q, k) | (~valid[b, q] & (q == k))

    rows, width = batch.shape
    return create_block_mask(permitted, rows, None, width, width, device=valid.device)


def hf_labels(batch: PackedBatch) -> np.ndarray:
    """Per-cell targets where loss-eligible, else ``-100``; int64 ``[R, T]``, already shifted."""
    return np.where(batch.loss_mask, batch.targets, IGNORE_INDEX).astype(np.int64)


def hf_inputs(
    batch: PackedBatch,
    attn_implementation: str,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    pad_token_id: int = 0,
    labels: bool = True,
    num_items_in_batch: int | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``model(**kwargs)`` that keep ``batch``'s examples apart.

    ``dtype`` is the model's (the additive mask must match it for ``sdpa``).
    With ``labels`` the dict has ``labels`` and ``shift_labels`` (see the
    module docstring) so ``model(**kwargs).loss`` is token-weighted;
    ``num_items_in_batch`` (the optimizer step's global eligible count, known
    from the plan) makes it the raw sum divided by that count instead of by
    this batch's. Tensors are ``(R, T)`` except for ``flash_attention_2``,
    where they are ``(1, N)`` over the valid cells in row-major order
    (:func:`cell_logits` puts logits back into cells).
    """
    check_implementation(attn_implementation)
    vocab = batch.binding.vocab_size
    if isinstance(pad_token_id, bool) or not 0 <= int(pad_token_id) < vocab:
        raise InvalidInput(
            f"pad_token_id {pad_token_id!r} is not a token id of the batch's vocabulary"
            f" [0, {vocab}) — pass any real id (padding cells are never seen by real queries)"
        )
    ids = np.where(batch.input_valid, batch.inputs, int(pad_token_id)).astype(np.int64)
    columns = {"input_ids": ids, "position_ids": batch.position_ids()}
    if labels:
        columns["labels"] = hf_labels(batch)
    out: dict[str, Any] = {}
    if attn_implementation == "flash_attention_2":
        cu = batch.cu_seqlens()
        for name, value in columns.items():
            out[name] = torch.as_tensor(value.reshape(-1)[cu.valid_index][None], device=device)
        cu_seqlens = torch.as_tensor(cu.cu_seqlens, dtype=torch.int32, device=device)
        out |= {
            "cu_seq_lens_q": cu_seqlens,
            "cu_seq_lens_k": cu_seqlens,
            "max_length_q": cu.max_seqlen,
            "max_length_k": cu.max_seqlen,
        }
    else:
        out = {name: torch.as_tensor(value, device=device) for name, value in columns.items()}
        if attn_implementation == "flex_attention":
            out["attention_mask"] = block_mask(batch, device)
        else:
            out["attention_mask"] = additive_mask(batch, dtype, device)
    if labels:
        out["shift_labels"] = out["labels"]
        if num_items_in_batch is not None:
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
    "IGNORE_INDEX",
    "IMPLEMENTATIONS",
    "additive_mask",
    "block_mask",
    "cell_logits",
    "hf_allowed",
    "hf_inputs",
    "hf_labels",
    "hf_loss",
    "hf_loss_sum",
]
