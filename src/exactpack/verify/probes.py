"""Isolation probes: does any change in one example reach another's logits?

:func:`isolation_probe` perturbs the residual stream outside one example and checks that
its outputs do not move; :func:`first_query_probe` checks an example's first query sees
only itself. :func:`unguarded_causal_attention` is the control that joins examples.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from exactpack.core.batch import PackedBatch
from exactpack.core.errors import InvalidInput
from exactpack.core.loss import masked_nll_sum
from exactpack.nn.attention import AttentionLayout, Backend
from exactpack.verify.tolerances import SEED_TOLERANCE, compare


def unguarded_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout, scale: float
) -> torch.Tensor:
    """The **wrong** mask, for controls only: key ``k <= q`` in storage order, ignoring
    segments and validity (B's queries see A). Not registered as a backend."""
    T = q.shape[-2]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    scores = (q @ k.transpose(-2, -1) * scale).masked_fill(~causal, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v  # (R, H, T, D)


def _probe_setup(
    model: torch.nn.Module, batch: PackedBatch, segment: int, attention: str | Backend | None
) -> tuple:
    """``(own cells, deltas, forward)``: ``segment``'s cells (R, T), one zero (R, T, W) leaf
    per residual-stream site (each block's input and the final norm's), and
    ``forward(ds)``, the logits with ``ds[i]`` added to the activations entering site ``i``."""
    cells = batch.input_valid & (batch.segments == segment)
    if not cells.any():
        raise InvalidInput(f"segment {segment} has no cell in this batch")
    ids, layout = model.inputs_of(batch)
    weight = model.embed.weight
    shape = (*batch.shape, model.config.width)
    deltas = [
        torch.zeros(shape, dtype=weight.dtype, device=weight.device, requires_grad=True)
        for _ in range(len(model.blocks) + 1)
    ]

    def forward(ds: list[torch.Tensor]) -> torch.Tensor:
        def adder(delta: torch.Tensor):
            return lambda _module, args: (args[0] + delta, *args[1:])

        sites = [*model.blocks, model.norm]
        handles = [m.register_forward_pre_hook(adder(d)) for m, d in zip(sites, ds, strict=True)]
        try:
            return model(ids, layout, attention=attention)
        finally:
            for h in handles:
                h.remove()

    return cells, deltas, forward


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

    ``segment``'s logits, its raw NLL sum and all parameter gradients must stay within
    tolerance; that loss's derivative into every other cell, at every site, must be 0.
    """
    own, deltas, forward = _probe_setup(model, batch, segment, attention)
    other = ~own
    own_t, other_t = (torch.as_tensor(m, device=deltas[0].device) for m in (own, other))
    params = [p for p in model.parameters() if p.requires_grad]

    def run(ds: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple]:
        """Logits, ``segment``'s loss, its parameter gradients (flat) and its sites' ones."""
        logits = forward(ds)
        loss = masked_nll_sum(logits, batch.targets, batch.loss_mask & own).sum
        grads = torch.autograd.grad(loss, params + ds, materialize_grads=True)
        flat = torch.cat([g.reshape(-1) for g in grads[: len(params)]])
        return logits, loss, flat, grads[len(params) :]

    base_logits, base_loss, base_grads, base_sites = run(deltas)
    gen = torch.Generator().manual_seed(seed)
    noise = [
        torch.randn(d.shape, generator=gen, dtype=torch.float64).to(d) * scale * other_t[..., None]
        for d in deltas
    ]
    logits, loss, grads, _ = run([n.detach().requires_grad_(True) for n in noise])
    into = torch.stack(base_sites).abs().amax(dim=-1)  # (sites, R, T)
    compared = {
        "logits": compare(base_logits[own_t], logits[own_t], SEED_TOLERANCE),
        "loss": compare(base_loss, loss, SEED_TOLERANCE),
        "gradients": compare(base_grads, grads, SEED_TOLERANCE),
    }
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
    """Derivatives of ``segment``'s first query's loss into every site's activations: its
    future cells, padding and other segments must get exactly zero."""
    own, deltas, forward = _probe_setup(model, batch, segment, attention)
    first = own & (batch.positions == 0)
    row, col = (int(x[0]) for x in np.nonzero(first))
    logits = forward(deltas)
    target = int(batch.targets[row, col])
    loss = -torch.log_softmax(logits[row, col], dim=-1)[target]
    grads = torch.stack(torch.autograd.grad(loss, deltas)).abs().amax(dim=-1)  # (sites, R, T)
    d = {
        "own_cell": _largest(grads, first),
        "future": _largest(grads, own & ~first),
        "padding": _largest(grads, ~batch.input_valid),
        "other_segments": _largest(grads, batch.input_valid & ~own),
    }
    passed = d["future"] == 0 and d["padding"] == 0 and d["other_segments"] == 0
    return {"segment": int(segment), "query": [row, col], "max_abs_derivative": d, "passed": passed}
