"""Prove that a model computes the same thing on separate, padded and packed layouts.

:func:`three_way` runs one set of examples three ways with the same parameters:

    separate  one example per model call, a row of exactly its length
    padded    one example per row, right padding (policy "padded")
    packed    several examples per row (next-fit by default)

and compares, against separate execution, every vocabulary logit at every
valid cell, the raw token-summed loss and every named parameter-gradient
coordinate of that loss, each with the seed's float64 tolerance
``|a-b| <= 1e-10 + 1e-9*max(|a|,|b|)``. On the A/B/C fixture with the large
profile that is 2 x 2394 logit and 2 x 3448 gradient comparisons.

:func:`isolation_probe` and :func:`first_query_probe` are the seed's two
activation tests; run with :func:`unguarded_causal_attention` (a plain
causal mask over storage columns) they are the control that shows the tests
can fail.

The model is duck-typed: ``forward_separate(example) -> (L, V)``,
``forward_padded(batch)`` / ``forward_packed(batch) -> (R, T, V)`` and
``named_parameters()``; :class:`~seqpack.verify.decoder.TinyDecoder` has them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from seqpack.core.batch import PackedBatch
from seqpack.core.compact import pack_examples
from seqpack.core.config import PackConfig
from seqpack.core.errors import InvalidInput
from seqpack.core.examples import SequenceExample
from seqpack.core.loss import masked_nll_sum

ATOL = 1e-10
RTOL = 1e-9


def within_tolerance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise ``|a-b| <= ATOL + RTOL*max(|a|,|b|)`` (bool, same shape)."""
    return (a - b).abs() <= ATOL + RTOL * torch.maximum(a.abs(), b.abs())


@dataclass(eq=False)
class LayoutRun:
    """One layout's results: ``logits`` (Σlen, V) in example order, ``loss_sum``, ``grads``."""

    logits: torch.Tensor
    loss_sum: torch.Tensor
    grads: dict[str, torch.Tensor]


def _grads(model: torch.nn.Module, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    return {
        n: torch.zeros_like(p) if g is None else g for (n, p), g in zip(named, grads, strict=True)
    }


def run_separate(model: torch.nn.Module, examples: Sequence[SequenceExample]) -> LayoutRun:
    """Each example in its own model call; loss = Σ per-example raw NLL sums."""
    logits, sums = [], []
    for ex in examples:
        out = model.forward_separate(ex)  # (L, V)
        logits.append(out)
        sums.append(masked_nll_sum(out, ex.targets, ex.loss_mask).sum)
    total = torch.stack(sums).sum()
    return LayoutRun(torch.cat(logits).detach(), total.detach(), _grads(model, total))


def _run_epoch(
    model: torch.nn.Module, examples: Sequence[SequenceExample], config: PackConfig, policy: str
) -> LayoutRun:
    first = examples[0]
    epoch = pack_examples(first.partition, examples, first.binding, config, policy=policy)
    forward = model.forward_padded if policy == "padded" else model.forward_packed
    chunks, ordinals, sums = [], [], []
    for batch in epoch.batches:
        out = forward(batch)  # (R, T, V)
        sums.append(masked_nll_sum(out, batch.targets, batch.loss_mask).sum)
        cells = torch.as_tensor(occurrence_cells(batch), device=out.device)
        chunks.append(out.reshape(-1, out.shape[-1]).index_select(0, cells))
        occ = batch.occurrences
        ordinals.append(np.repeat(occ.ordinal, occ.col_end - occ.col_start))
    total = torch.stack(sums).sum()
    order = torch.as_tensor(np.argsort(np.concatenate(ordinals), kind="stable"))
    logits = torch.cat(chunks).detach().index_select(0, order.to(chunks[0].device))
    return LayoutRun(logits, total.detach(), _grads(model, total))


def occurrence_cells(batch: PackedBatch) -> np.ndarray:
    """Flat cell indices of every occurrence's cells, occurrence by occurrence, int64."""
    occ = batch.occurrences
    lengths = occ.col_end - occ.col_start
    first = occ.row * batch.shape[1] + occ.col_start
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.repeat(first, lengths) + np.arange(int(lengths.sum())) - starts


def run_padded(
    model: torch.nn.Module, examples: Sequence[SequenceExample], capacity: int | None = None
) -> LayoutRun:
    """One example per row, right padding, width ``capacity`` (default: the longest)."""
    width = capacity or max(len(ex) for ex in examples)
    return _run_epoch(model, examples, PackConfig(width, len(examples)), "padded")


def run_packed(
    model: torch.nn.Module,
    examples: Sequence[SequenceExample],
    capacity: int,
    max_rows_per_batch: int | None = None,
    policy: str = "next-fit",
) -> LayoutRun:
    """Examples packed at ``capacity`` by ``policy``, in calls of ``max_rows_per_batch`` rows."""
    rows = max_rows_per_batch or len(examples)
    return _run_epoch(model, examples, PackConfig(capacity, rows), policy)


def compare_runs(reference: LayoutRun, other: LayoutRun) -> dict[str, dict[str, Any]]:
    """Per quantity (logits, loss_sum, gradients): comparisons, failures, max_abs_diff."""
    return compare_tensors(
        {
            "logits": (reference.logits, other.logits),
            "loss_sum": (reference.loss_sum.reshape(1), other.loss_sum.reshape(1)),
            "gradients": (
                torch.cat([g.reshape(-1) for g in reference.grads.values()]),
                torch.cat([other.grads[n].reshape(-1) for n in reference.grads]),
            ),
        }
    )


def compare_tensors(
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]],
) -> dict[str, dict[str, Any]]:
    """For each named pair: element comparisons, tolerance failures and the max abs diff."""
    report = {}
    for name, (a, b) in pairs.items():
        if a.shape != b.shape:
            raise InvalidInput(f"{name}: shapes {tuple(a.shape)} and {tuple(b.shape)} differ")
        ok = within_tolerance(a, b)
        report[name] = {
            "comparisons": int(ok.numel()),
            "failures": int((~ok).sum()),
            "max_abs_diff": float((a - b).abs().max()) if a.numel() else 0.0,
        }
    return report


def three_way(
    model: torch.nn.Module,
    examples: Sequence[SequenceExample],
    capacity: int,
    *,
    padded_capacity: int | None = None,
    max_rows_per_batch: int | None = None,
    policy: str = "next-fit",
) -> dict[str, Any]:
    """Separate vs padded vs packed: loss sums, max abs diffs, comparison counts, pass/fail.

    ``examples`` share one partition and binding; the packed layout uses
    ``capacity`` (and ``policy``), the padded one ``padded_capacity``
    (default: the longest example).
    """
    if not examples:
        raise InvalidInput("three_way needs at least one example")
    runs = {
        "separate": run_separate(model, examples),
        "padded": run_padded(model, examples, padded_capacity),
        "packed": run_packed(model, examples, capacity, max_rows_per_batch, policy),
    }
    pairs = {name: compare_runs(runs["separate"], runs[name]) for name in ("padded", "packed")}
    quantities = ("logits", "loss_sum", "gradients")
    total = {
        key: {q: sum(p[q][key] for p in pairs.values()) for q in quantities}
        for key in ("comparisons", "failures")
    }
    return {
        "examples": len(examples),
        "targets": int(sum(len(ex) for ex in examples)),
        "eligible_targets": int(sum(int(ex.loss_mask.sum()) for ex in examples)),
        "tolerance": {"abs": ATOL, "rel": RTOL},
        "loss_sum": {name: float(run.loss_sum) for name, run in runs.items()},
        "max_abs_diff": {q: max(p[q]["max_abs_diff"] for p in pairs.values()) for q in quantities},
        "comparisons": total["comparisons"],
        "failures": total["failures"],
        "against_separate": pairs,
        "passed": not any(total["failures"].values()),
    }


def describe(model: torch.nn.Module) -> dict[str, Any]:
    """Profile, parameter count, seed, dtype and attention backend of a TinyDecoder."""
    attention = model.attention
    return {
        "profile": getattr(model, "profile", type(model).__name__),
        "parameters": sum(p.numel() for p in model.parameters()),
        "seed": getattr(model, "seed", None),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "attention": attention if isinstance(attention, str) else attention.__name__,
    }


# The seed's activation tests and their control.


__all__ = [
    "ATOL",
    "RTOL",
    "LayoutRun",
    "compare_runs",
    "compare_tensors",
    "describe",
    "occurrence_cells",
    "run_packed",
    "run_padded",
    "run_separate",
    "three_way",
    "within_tolerance",
]
