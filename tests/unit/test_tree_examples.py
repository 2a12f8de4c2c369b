"""examples/tree_dpo.py and examples/tree_grpo.py: tree-packed == unpacked, in float64.

The tiny GPT-2 computes in float64 throughout (LayerNorm, eager-free
softmax via SDPA), so the loss and every gradient coordinate meet the
seed's tolerance ``|a-b| <= 1e-10 + 1e-9*max(|a|,|b|)``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "examples"))

import tree_dpo
import tree_grpo

torch.set_num_threads(1)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach().reshape(-1), b.detach().reshape(-1)
    return bool(((a - b).abs() <= 1e-10 + 1e-9 * torch.maximum(a.abs(), b.abs())).all())


def grads(loss, params):
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)])


def test_dpo_step_equals_unpacked():
    policy, reference = tree_dpo.tiny_models()
    groups = tree_dpo.preference_groups(5, 266, seed=3)
    params = list(policy.parameters())
    tree = tree_dpo.tree_dpo(policy, reference, groups, beta=0.5)
    flat = tree_dpo.unpacked_dpo(policy, reference, groups, beta=0.5)
    assert close(tree, flat)
    assert close(grads(tree, params), grads(flat, params))
    # the reference's log-probs come from the same single tree forward, per sequence
    assert close(
        tree_dpo.tree_logprobs(reference, groups, 256),
        tree_dpo.separate_logprobs(reference, groups),
    )


def test_grpo_clipped_loss_equals_unpacked():
    model, _ = tree_dpo.tiny_models()
    groups, rewards = tree_grpo.rollout_groups(3, 4, 266, seed=5)
    params = list(model.parameters())
    tree = tree_grpo.tree_grpo(model, groups, rewards)
    flat = tree_grpo.unpacked_grpo(model, groups, rewards)
    assert float(tree.detach()) != 0.0
    assert close(tree, flat)
    assert close(grads(tree, params), grads(flat, params))
