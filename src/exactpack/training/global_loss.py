"""Token-weighted loss across gradient-accumulation micro-batches and data-parallel ranks.

A step of ``K`` micro-batches on each of ``R`` ranks has the mean
``L = (Σ_{r,m} S_{r,m}) / N``: ``S_{r,m}`` a micro-batch's raw NLL sum, ``N`` the whole
step's eligible targets, known before the forward pass (:attr:`Slot.step_eligible`, the
collator's ``num_items_in_batch``). Each micro-batch back-propagates

    loss_{r,m} = S_{r,m} * c / N,    c = R  when gradients are averaged over ranks
                                     c = 1  when they are summed

(DDP averages: ``grad_reduction="mean"``, the default), so the reduced gradient is
exactly ``∇L``, and a rank's ``K`` losses summed, averaged over ranks, are ``L``.
Fixture (N = 9): micro-batch 0 = row ``[A A A B B .]`` (5 targets), 1 = ``[C C C C . .]``
(4): ``S_0/9 + S_1/9``; the per-micro-batch mean ``(S_0/5 + S_1/4)/2`` would weigh A's and
B's targets 1/10 and C's 1/8.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import torch
import torch.nn.functional as F

from exactpack.core.batch import IGNORE_INDEX
from exactpack.core.errors import EmptyObjective, InvalidInput
from exactpack.core.loss import LossSum

GradReduction = Literal["mean", "sum"]


def loss_factor(
    denominator: int, world_size: int = 1, grad_reduction: GradReduction = "mean"
) -> float:
    """``c / N``, a micro-batch's raw sum's factor (module docstring); N = 0:
    :class:`~exactpack.EmptyObjective` (skip the step)."""
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
    logits: torch.Tensor,
    labels: torch.Tensor,
    ignore_index: int = IGNORE_INDEX,
    weights: torch.Tensor | None = None,
) -> LossSum:
    """Raw NLL sum over cells whose label (``[...]``, aligned with ``logits`` [..., V]) is
    not ``ignore_index``; other cells are dropped first, so their NaN logits never count.
    ``weights`` (aligned with ``labels``; tree rows: the sequences that supervise a cell's
    target): ``Σ weight·nll`` over ``Σ weight`` targets; None: every weight 1."""
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
    if weights is None:
        return LossSum(nll.sum(), int(cells.shape[0]))
    w = weights.reshape(-1).to(nll.device).index_select(0, cells)
    return LossSum((nll * w.to(nll.dtype)).sum(), int(w.sum()))


def normalize(
    raw_sum: torch.Tensor,
    denominator: int,
    *,
    world_size: int = 1,
    grad_reduction: GradReduction = "mean",
    parameters: Iterable[torch.nn.Parameter] | None = None,
) -> torch.Tensor:
    """``raw_sum * c / N`` for one micro-batch (module docstring). ``parameters`` (for an
    empty micro-batch under DDP) adds ``0 * Σ p.sum()``, so every parameter gets an exactly
    zero gradient and DDP's reducer fires for all of them."""
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

    ``features``: a :class:`~exactpack.training.packed_data.PackedCollator` dict (its
    ``shift_labels`` select the cells, ``weights`` of tree rows weigh them,
    ``num_items_in_batch`` is the denominator)::

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
    labels = features["shift_labels"].to(logits.device)
    total = labels_nll_sum(logits, labels, ignore_index, features.get("weights"))
    return normalize(
        total.sum,
        features["num_items_in_batch"],
        world_size=world_size,
        grad_reduction=grad_reduction,
        parameters=parameters if total.count == 0 else None,
    )


__all__ = ["GradReduction", "labels_nll_sum", "loss_factor", "micro_batch_loss", "normalize"]
