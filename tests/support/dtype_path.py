"""Tolerances observed from a float64 model's real dtype path (for the transformers tests)."""

from __future__ import annotations

import torch

from exactpack.verify.tolerances import observe, tolerance


def observed_tolerance(model, kwargs) -> tuple[float, float]:
    """``(atol, rtol)`` of a comparison of ``model(**kwargs)`` outputs.

    float64 throughout keeps the seed's ``1e-10 + 1e-9*max``; a float32 reduction on
    float64 data (an island: eager's ``softmax(dtype=float32)``, or ``ForCausalLMLoss``'s
    ``logits.float()`` when ``kwargs`` carry labels) takes float32's
    (:mod:`exactpack.verify.tolerances`, which follows the data through one forward and backward).
    """
    islands, _ = observe(lambda: model(**kwargs)[0].sum().backward())
    model.zero_grad(set_to_none=True)
    tol = tolerance(torch.float64, islands)
    return tol["abs"], tol["rel"]


def unlabelled(kwargs) -> dict:
    """``kwargs`` without labels: the model returns logits and computes no loss."""
    return {k: v for k, v in kwargs.items() if k not in ("labels", "shift_labels")}
