"""Token-weighted loss across gradient-accumulation micro-batches and data-parallel ranks.

An optimizer step covers ``K`` micro-batches on each of ``R`` ranks. Its
token-weighted mean is ``L = (Σ_{r,m} S_{r,m}) / N``, where ``S_{r,m}`` is a
micro-batch's raw NLL sum and ``N`` the eligible targets of the **whole
step**. ``N`` is known before the forward pass: the schedule fixes every
row of the step (:attr:`Slot.step_eligible`, the collator's
``num_items_in_batch``). So each micro-batch back-propagates

    loss_{r,m} = S_{r,m} * c / N,    c = R  when gradients are averaged over ranks
                                     c = 1  when they are summed

``DistributedDataParallel`` *averages* (all-reduce, then divide by ``R``),
hence ``c = R`` (``grad_reduction="mean"``, the default); a loop that
all-reduces with ``SUM`` itself, or one process (``R = 1``), uses ``c = 1``.
Accumulating the ``K`` backward passes and reducing over ranks then gives
exactly ``∇L``, the gradient of the single-batch token-weighted mean — not
the mean of per-micro-batch means, which weighs a target in a short
micro-batch more than one in a long one.

Logging: the sum of a rank's ``K`` returned losses, averaged over ranks,
is ``L`` itself.

Worked example on the fixture (N = 9): micro-batch 0 = row ``[A A A B B .]``
(5 targets), micro-batch 1 = row ``[C C C C . .]`` (4), one rank. Correct:
``S_0/9 + S_1/9``. The per-micro-batch mean ``(S_0/5 + S_1/4)/2`` gives A's
and B's targets weight 1/10 and C's 1/8 instead of 1/9 each.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import torch
import torch.nn.functional as F

from seqpack.core.batch import IGNORE_INDEX
from seqpack.core.errors import EmptyObjective, InvalidInput
from seqpack.core.loss import LossSum

GradReduction = Literal["mean", "sum"]


def loss_factor(
    denominator: int, world_size: int = 1, grad_reduction: GradReduction = "mean"
) -> float:
    """``c / N``: what a micro-batch's raw sum is multiplied by (see the module docstring).

    ``denominator`` N = 0 means the whole step has no eligible target:
    :class:`~seqpack.EmptyObjective` (skip the step).
    """
    if grad_reduction not in ("mean", "sum"):
        raise InvalidInput(f"grad_reduction must be 'mean' or 'sum', got {grad_reduction!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise InvalidInput(f"world_size must be a positive integer, got {world_size!r}")
    n = int(denominator)
    if n < 0:
        raise InvalidInput(f"the step's eligible count must be >= 0, got {n}")
    if n == 0:
        raise EmptyObjective(
            "this optimizer step has 0 loss-eligible targets across all ranks and micro-batches,"
            " so its token-weighted mean has no denominator — skip the step"
        )
    return (world_size if grad_reduction == "mean" else 1) / n


def labels_nll_sum(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = IGNORE_INDEX
) -> LossSum:
    """Raw NLL sum over cells whose label is not ``ignore_index`` (gathered first).

    ``logits`` [..., V], ``labels`` [...] aligned with them (the collator's
    ``labels``: already shifted). Excluded cells are dropped before any
    arithmetic, so a NaN logit there never reaches the sum.
    """
    if tuple(logits.shape[:-1]) != tuple(labels.shape):
        raise InvalidInput(
            f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} disagree"
            " — one vocabulary row per labelled cell"
        )
    width = logits.shape[-1]
    flat = labels.reshape(-1)
    cells = torch.nonzero(flat != ignore_index).squeeze(1)  # (N,)
    gold = flat.index_select(0, cells)
    if gold.numel() and (int(gold.min()) < 0 or int(gold.max()) >= width):
        raise InvalidInput(
            f"a label lies outside the logits' vocabulary [0, {width})"
            f" — use {ignore_index} for cells outside the loss"
        )
    rows = logits.reshape(-1, width).index_select(0, cells)  # (N, V)
    if rows.dtype in (torch.float16, torch.bfloat16):
        rows = rows.float()
    nll = F.cross_entropy(rows, gold, reduction="none")
    return LossSum(nll.sum(), int(cells.shape[0]))


def normalize(
    raw_sum: torch.Tensor,
    denominator: int,
    *,
    world_size: int = 1,
    grad_reduction: GradReduction = "mean",
    parameters: Iterable[torch.nn.Parameter] | None = None,
) -> torch.Tensor:
    """``raw_sum * c / N`` for one micro-batch (see the module docstring).

    ``parameters``: give the model's parameters when a micro-batch may be
    empty (a short last step's explicit empty slot) under DDP. Its loss then
    also adds ``0 * Σ p.sum()``, so every parameter receives an (exactly
    zero) gradient and DDP's reducer fires for all of them, whatever the
    attention backend did with 0 rows.
    """
    loss_factor(denominator, world_size, grad_reduction)  # validates
    loss = raw_sum * (world_size if grad_reduction == "mean" else 1) / int(denominator)
    if parameters is not None:
        loss = loss + sum(p.sum() for p in parameters) * 0.0
    return loss


def micro_batch_loss(
    logits: torch.Tensor,
    features: dict[str, Any],
    *,
    world_size: int = 1,
    grad_reduction: GradReduction = "mean",
    parameters: Iterable[torch.nn.Parameter] | None = None,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """The loss to back-propagate for one collated micro-batch.

    ``features``: a :class:`~seqpack.training.packed_data.PackedCollator` dict;
    its ``shift_labels`` (pre-shifted targets) select the eligible cells of ``logits`` and its
    ``num_items_in_batch`` (the step's global count) is the denominator::

        for features in step_micro_batches:              # K per rank
            logits = model(*decoder_inputs(features, device))
            loss = micro_batch_loss(logits, features, world_size=R,
                                    parameters=model.parameters())
            loss.backward()                              # DDP: no_sync() but the last
        optimizer.step()
    """
    if "shift_labels" not in features:
        raise InvalidInput(
            "micro_batch_loss needs the pre-shifted targets under 'shift_labels' (a PackedCollator"
            " dict); 'labels' are transformers' unshifted labels and would be scored one cell off"
        )
    total = labels_nll_sum(logits, features["shift_labels"].to(logits.device), ignore_index)
    return normalize(
        total.sum,
        features["num_items_in_batch"],
        world_size=world_size,
        grad_reduction=grad_reduction,
        parameters=parameters if total.count == 0 else None,
    )


__all__ = ["GradReduction", "labels_nll_sum", "loss_factor", "micro_batch_loss", "normalize"]
