"""Token-weighted loss over a packed batch, and the seed's constructed loss probe.

The raw NLL sum over eligible cells is divided **once** by their count ``N``. On the
fixture (A, B, C hold 3, 2, 4 targets)::

    loss_mask  [[T, T, T, T, T, F],      N = 9
                [T, T, T, T, F, F]]
    mean = (sum over the 9 eligible cells) / 9

Eligible cells are gathered first (a NaN logit in padding never counts). Logits are
NumPy (float64) or a ``torch.Tensor`` (autograd kept; torch imported only when given).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from exactpack.core.errors import EmptyObjective, InvalidInput

if TYPE_CHECKING:
    from exactpack.core.batch import PackedBatch


@dataclass(frozen=True)
class LossSum:
    """Raw NLL ``sum`` of ``count`` eligible targets, undivided (sum across ranks, divide once)."""

    sum: Any
    count: int


@dataclass(frozen=True)
class LossResult:
    """Token-weighted loss: raw ``sum``, eligible ``count`` (N) and ``mean = sum / N``."""

    sum: Any
    count: int
    mean: Any


def _is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def check_logits(logits: Any, shape: tuple[int, ...], vocab_size: int) -> int:
    if logits.ndim != len(shape) + 1 or tuple(logits.shape[:-1]) != shape:
        raise InvalidInput(
            f"logits have shape {tuple(logits.shape)}; expected {(*shape, 'V')}"
            " — one vocabulary row per cell of the batch"
        )
    width = int(logits.shape[-1])
    if width < vocab_size:
        raise InvalidInput(
            f"logits have {width} vocabulary columns but the batch's binding has"
            f" vocab_size {vocab_size} — use a model whose vocabulary covers the binding"
        )
    return width


def eligible_nll(logits: Any, targets: np.ndarray, loss_mask: np.ndarray) -> tuple[np.ndarray, Any]:
    """``logits`` [..., V], ``targets`` int [...], ``loss_mask`` bool [...] -> ``(cells,
    nll)``: flat eligible cells int64 [N] and their NLL [N] (float64 for NumPy)."""
    mask = np.asarray(loss_mask, dtype=bool)
    cells = np.flatnonzero(mask).astype(np.int64)  # [N]
    width = int(logits.shape[-1])
    gold = np.asarray(targets).reshape(-1)[cells].astype(np.int64)  # convert only eligible
    if gold.size and (int(gold.min()) < 0 or int(gold.max()) >= width):
        bad = int(gold.min()) if int(gold.min()) < 0 else int(gold.max())
        raise InvalidInput(
            f"eligible target {bad} is outside the logits' vocabulary [0, {width})"
            " — a loss-eligible cell must hold a real target id"
        )
    if _is_torch(logits):
        import torch
        import torch.nn.functional as F

        index = torch.as_tensor(cells, device=logits.device)
        rows = logits.reshape(-1, width).index_select(0, index)  # (N, V)
        if rows.dtype in (torch.float16, torch.bfloat16):
            rows = rows.float()
        gold_t = torch.as_tensor(gold, device=logits.device)
        return cells, F.cross_entropy(rows, gold_t, reduction="none")
    rows = np.asarray(logits, dtype=np.float64).reshape(-1, width)[cells]  # (N, V)
    top = rows.max(axis=1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(rows - top).sum(axis=1))
    return cells, log_z - rows[np.arange(cells.shape[0]), gold]


def masked_nll_sum(logits: Any, targets: np.ndarray, loss_mask: np.ndarray) -> LossSum:
    """Raw NLL sum over the cells where ``loss_mask`` is True (``N = 0`` gives sum 0)."""
    check_logits(logits, tuple(np.shape(loss_mask)), 1)
    cells, nll = eligible_nll(logits, targets, loss_mask)
    total = nll.sum() if _is_torch(logits) else float(np.sum(nll))
    return LossSum(total, int(cells.shape[0]))


def token_weighted_sum(logits: Any, batch: PackedBatch | Any) -> LossSum:
    """``Σ weight·nll`` over the cells in the loss and ``N = Σ weight`` (``logits`` [rows,
    capacity, V], NumPy float64 or torch; read only at those cells). A flat batch weighs
    every eligible target 1; forest rows by their ``weights``: the sequences that supervise
    the target. ``LossSum(0, 0)`` when none (in the graph for torch)."""
    check_logits(logits, batch.shape, batch.binding.vocab_size)
    weights = batch.weights  # None on flat rows: the weights are loss_mask
    if weights is None:
        return masked_nll_sum(logits, batch.targets, batch.loss_mask)
    cells, nll = eligible_nll(logits, batch.targets, batch.loss_mask)
    w = weights.reshape(-1)[cells]
    if isinstance(nll, np.ndarray):
        return LossSum(float(np.sum(nll * w)), int(w.sum()))
    return LossSum((nll * nll.new_tensor(w)).sum(), int(w.sum()))


def divide(total: LossSum, count: int | None = None, what: str = "this batch") -> LossResult:
    """``total.sum / count`` (default ``total.count``); ``count == 0`` raises EmptyObjective."""
    n = total.count if count is None else int(count)
    if n == 0:
        raise EmptyObjective(
            f"{what} has 0 loss-eligible targets, so the token-weighted mean has no"
            " denominator — skip it, or accumulate raw sums and divide by a global count"
        )
    return LossResult(total.sum, n, total.sum / n)


def token_weighted_loss(
    logits: Any, batch: PackedBatch | Any, count: int | None = None
) -> LossResult:
    """Token-weighted loss of ``batch``: ``Σ weight·nll`` divided once by N (``count``: the
    global N under accumulation or data parallelism; default: this batch's ``Σ weight``).

    >>> from exactpack.verify.fixture import fixture_batch
    >>> batch = fixture_batch()
    >>> logits = np.zeros((2, 6, 266))          # uniform prediction
    >>> logits[0, 5] = np.nan                   # padding: never read
    >>> result = token_weighted_loss(logits, batch)
    >>> result.count, round(result.mean, 6), round(float(np.log(266)), 6)
    (9, 5.583496, 5.583496)
    """
    rows, width = batch.shape
    total = token_weighted_sum(logits, batch)
    return divide(total, count, what=f"batch of {rows}x{width} cells")


# The constructed probe and the weightings it warns about.


def probe_logits(batch: PackedBatch, gold_probability: np.ndarray) -> np.ndarray:
    """Logits float64 [rows, capacity, V] giving each eligible target probability ``q``
    (``gold_probability`` [rows, capacity] in (0, 1)): gold ``ln((V-1) q / (1-q))``, else 0."""
    vocab = batch.binding.vocab_size
    q = np.asarray(gold_probability, dtype=np.float64)
    cells = np.flatnonzero(batch.loss_mask)
    q_cells = q.reshape(-1)[cells]
    if q_cells.size and not bool(((q_cells > 0) & (q_cells < 1)).all()):
        raise InvalidInput("gold probabilities must lie strictly between 0 and 1")
    logits = np.zeros((*batch.shape, vocab), dtype=np.float64)
    flat = logits.reshape(-1, vocab)
    gold = batch.targets.reshape(-1)[cells].astype(np.int64)
    flat[cells, gold] = np.log((vocab - 1) * q_cells / (1.0 - q_cells))
    return logits


def weighting_report(logits: Any, batch: PackedBatch) -> dict[str, Any]:
    """The token-weighted loss beside ``row_mean`` and ``document_mean`` (the mean of row
    or occurrence means, those with eligible targets)."""
    cells, nll = eligible_nll(np.asarray(logits, dtype=np.float64), batch.targets, batch.loss_mask)
    result = divide(LossSum(float(np.sum(nll)), int(cells.shape[0])), what="the probe batch")
    width = batch.shape[1]

    def mean_of_means(groups: np.ndarray) -> float:
        counts = np.bincount(groups)
        sums = np.bincount(groups, weights=nll)
        used = counts > 0
        return float(np.mean(sums[used] / counts[used]))

    _, occurrence_of_cell = np.unique(batch.segments.reshape(-1)[cells], return_inverse=True)
    return {
        "loss_sum": result.sum,
        "mean": result.mean,
        "row_mean": mean_of_means(cells // width),
        "document_mean": mean_of_means(occurrence_of_cell.reshape(-1)),
        "valid_targets": int(batch.target_valid.sum()),
        "eligible_targets": result.count,
    }


__all__ = [
    "LossResult",
    "LossSum",
    "divide",
    "eligible_nll",
    "masked_nll_sum",
    "probe_logits",
    "token_weighted_loss",
    "token_weighted_sum",
    "weighting_report",
]
