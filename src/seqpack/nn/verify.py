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
``named_parameters()``; :class:`~seqpack.nn.decoder.TinyDecoder` has them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from seqpack.core.batch import PackConfig, PackedBatch, pack_examples
from seqpack.core.errors import InvalidInput
from seqpack.core.examples import SequenceExample
from seqpack.core.loss import masked_nll_sum
from seqpack.nn.attention import AttentionLayout, Backend

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


def unguarded_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout, scale: float
) -> torch.Tensor:
    """The **wrong** mask, for controls only: plain causal over storage columns.

    Key ``k <= q`` in storage order, ignoring segments and validity, so B's
    queries see A. Not registered as a backend.
    """
    T = q.shape[-2]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    scores = (q @ k.transpose(-2, -1) * scale).masked_fill(~causal, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v  # (R, H, T, D)


def _residual_probes(model: torch.nn.Module, shape: tuple[int, int, int]) -> list[torch.Tensor]:
    """One zero (R, T, W) leaf per residual-stream site: each block's input and the final norm's."""
    dtype, device = model.embed.weight.dtype, model.embed.weight.device
    sites = len(model.blocks) + 1
    return [
        torch.zeros(shape, dtype=dtype, device=device, requires_grad=True) for _ in range(sites)
    ]


def _forward_with(
    model: torch.nn.Module,
    ids: torch.Tensor,
    layout: AttentionLayout,
    deltas: list[torch.Tensor],
    attention: str | Backend | None,
) -> torch.Tensor:
    """Forward with ``deltas[i]`` added to the activations entering site ``i``."""

    def adder(delta: torch.Tensor):
        return lambda _module, args: (args[0] + delta, *args[1:])

    modules = [*model.blocks, model.norm]
    handles = [m.register_forward_pre_hook(adder(d)) for m, d in zip(modules, deltas, strict=True)]
    try:
        return model(ids, layout, attention=attention)
    finally:
        for h in handles:
            h.remove()


def _segment_cells(batch: PackedBatch, segment: int) -> np.ndarray:
    cells = batch.input_valid & (batch.segments == segment)
    if not cells.any():
        raise InvalidInput(f"segment {segment} has no cell in this batch")
    return cells


def isolation_probe(
    model: torch.nn.Module,
    batch: PackedBatch,
    segment: int,
    *,
    attention: str | Backend | None = None,
    scale: float = 3.0,
    seed: int = 0,
) -> dict[str, Any]:
    """Perturb every activation outside ``segment`` (other examples and padding).

    Objective: the raw NLL sum of ``segment``'s eligible targets only. The
    segment's logits, that loss and all parameter gradients must stay within
    tolerance, and the derivative of the loss into every other cell's
    activations, at every residual site, must be exactly zero.
    """
    ids, layout = model.inputs_of(batch)
    own = _segment_cells(batch, segment)
    other = ~own
    own_t = torch.as_tensor(own, device=ids.device)
    deltas = _residual_probes(model, (*batch.shape, model.config.width))
    params = [p for p in model.parameters() if p.requires_grad]

    def run(ds: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        logits = _forward_with(model, ids, layout, ds, attention)
        loss = masked_nll_sum(logits, batch.targets, batch.loss_mask & own).sum
        leaves = params + ds
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        return (
            logits,
            loss,
            [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads, strict=True)],
        )

    base_logits, base_loss, base_grads = run(deltas)
    gen = torch.Generator().manual_seed(seed)
    other_t = torch.as_tensor(other, device=ids.device)
    perturbed = [
        (torch.randn(d.shape, generator=gen, dtype=torch.float64).to(d) * scale)
        .mul(other_t[..., None])
        .detach()
        .requires_grad_(True)
        for d in deltas
    ]
    logits, loss, grads = run(perturbed)
    n = len(params)
    into = torch.stack(base_grads[n:]).abs().amax(dim=-1)  # (sites, R, T)
    compared = compare_tensors(
        {
            "logits": (base_logits[own_t].detach(), logits[own_t].detach()),
            "loss": (base_loss.detach().reshape(1), loss.detach().reshape(1)),
            "gradients": (
                torch.cat([g.reshape(-1) for g in base_grads[:n]]),
                torch.cat([g.reshape(-1) for g in grads[:n]]),
            ),
        }
    )
    derivative = {
        "other_segments": _largest(into, batch.input_valid & other),
        "padding": _largest(into, ~batch.input_valid),
    }
    changed = (logits - base_logits).detach()[other_t]
    return {
        "segment": int(segment),
        "perturbed_cells": int(other.sum()),
        "sites": len(deltas),
        "compared": compared,
        "max_abs_derivative_into": derivative,
        "others_changed_by": float(changed.abs().max()) if changed.numel() else 0.0,
        "passed": not any(c["failures"] for c in compared.values())
        and not any(derivative.values()),
    }


def _largest(values: torch.Tensor, mask: np.ndarray) -> float:
    """Max of ``values`` (sites, R, T) over the cells of ``mask`` (R, T); 0 when empty."""
    if not mask.any():
        return 0.0
    return float(values[:, torch.as_tensor(mask, device=values.device)].max())


def first_query_probe(
    model: torch.nn.Module,
    batch: PackedBatch,
    segment: int,
    *,
    attention: str | Backend | None = None,
) -> dict[str, Any]:
    """Derivatives of ``segment``'s first query's loss into the activations of every site.

    Its own cell may matter; its future cells, padding and other segments
    must get exactly zero derivative at every residual site.
    """
    ids, layout = model.inputs_of(batch)
    own = _segment_cells(batch, segment)
    first = own & (batch.positions == 0)
    row, col = (int(x[0]) for x in np.nonzero(first))
    deltas = _residual_probes(model, (*batch.shape, model.config.width))
    logits = _forward_with(model, ids, layout, deltas, attention)
    target = int(batch.targets[row, col])
    loss = -torch.log_softmax(logits[row, col], dim=-1)[target]
    grads = torch.stack(torch.autograd.grad(loss, deltas)).abs().amax(dim=-1)  # (sites, R, T)
    future = own & ~first
    padding = ~batch.input_valid
    others = batch.input_valid & ~own

    report = {
        "segment": int(segment),
        "query": [row, col],
        "max_abs_derivative": {
            "own_cell": _largest(grads, first),
            "future": _largest(grads, future),
            "padding": _largest(grads, padding),
            "other_segments": _largest(grads, others),
        },
    }
    d = report["max_abs_derivative"]
    report["passed"] = d["future"] == 0 and d["padding"] == 0 and d["other_segments"] == 0
    return report


__all__ = [
    "ATOL",
    "RTOL",
    "LayoutRun",
    "compare_runs",
    "compare_tensors",
    "describe",
    "first_query_probe",
    "isolation_probe",
    "occurrence_cells",
    "run_packed",
    "run_padded",
    "run_separate",
    "three_way",
    "unguarded_causal_attention",
    "within_tolerance",
]
