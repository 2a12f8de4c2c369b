"""A GRPO-style step on tree-packed rows: a group's prompt stored once for all its rollouts.

Per token of each completion, with group-normalised advantages ``A`` and
the sampling policy's log-probs ``old``::

    ratio = exp(logp - old)
    loss  = Σ_tokens -min(ratio·A, clip(ratio, 1-ε, 1+ε)·A) / (completion tokens)

:func:`exactpack.nn.logprobs.token_logprobs` gives every original sequence's
per-token log-probabilities from **one** forward over the tree-packed rows;
:func:`unpacked_grpo` computes the same from each rollout run alone. The
``old`` log-probs are the current ones detached plus a fixed seeded offset,
so clipping is exercised.

    .venv/bin/python examples/tree_grpo.py
"""

from __future__ import annotations

import numpy as np
import torch

from exactpack.core.binding import Binding
from exactpack.core.tree import SequenceGroups, pack_tree
from exactpack.hf import hf_inputs
from exactpack.nn.logprobs import token_logprobs


def rollout_groups(n: int, size: int, vocab: int, seed: int) -> tuple[SequenceGroups, np.ndarray]:
    """``n`` prompts with ``size`` completions each (some share first tokens), and rewards."""
    rng = np.random.default_rng(seed)
    prompts, completions = [], []
    for _ in range(n):
        prompts.append(rng.integers(0, vocab, rng.integers(8, 24)))
        comps = [rng.integers(0, vocab, rng.integers(2, 10)) for _ in range(size)]
        for j in range(1, size, 2):
            comps[j][:1] = comps[j - 1][:1]  # two rollouts that start alike
        completions.append(comps)
    groups = SequenceGroups.from_prompt_completions(
        prompts, completions, Binding(vocab, "ids", "grpo")
    )
    return groups, rng.normal(size=(n, size))


def advantages(rewards: np.ndarray) -> np.ndarray:
    centred = rewards - rewards.mean(axis=1, keepdims=True)
    return (centred / (rewards.std(axis=1, keepdims=True) + 1e-4)).reshape(-1)


def clipped_loss(
    per_token: list[torch.Tensor], masks: list[np.ndarray], adv: np.ndarray, eps: float = 0.2
) -> torch.Tensor:
    """Per-token clipped surrogate over every completion token, in supplied sequence order."""
    total, count = 0, 0
    rng = np.random.default_rng(7)
    for lp, mask, a in zip(per_token, masks, adv, strict=True):
        lp = lp[torch.as_tensor(mask)]
        old = lp.detach() + torch.as_tensor(rng.normal(scale=0.3, size=lp.shape[0]))
        ratio = torch.exp(lp - old)
        total = total - torch.minimum(ratio * a, ratio.clamp(1 - eps, 1 + eps) * a).sum()
        count += lp.shape[0]
    return total / count


def tree_grpo(model, groups, rewards, capacity=512) -> torch.Tensor:
    (batch,) = pack_tree(groups, capacity).batches
    dtype = next(model.parameters()).dtype
    logits = model(**hf_inputs(batch, "exactpack_tree", config=model.config, dtype=dtype)).logits
    per_seq = token_logprobs(logits, batch)
    by_index = {int(s): i for i, s in enumerate(batch.seq_index)}
    ordered = [per_seq[by_index[i]] for i in range(len(groups))]
    masks = [groups.pair_mask(np.array([i])) for i in range(len(groups))]
    return clipped_loss(ordered, masks, advantages(rewards))


def unpacked_grpo(model, groups, rewards) -> torch.Tensor:
    per_seq = []
    for i in range(len(groups)):
        seq = torch.as_tensor(groups.sequence(i).astype(np.int64))
        logits = model(input_ids=seq[None, :-1], use_cache=False).logits[0]
        per_seq.append(logits.log_softmax(-1).gather(1, seq[1:, None])[:, 0])
    masks = [groups.pair_mask(np.array([i])) for i in range(len(groups))]
    return clipped_loss(per_seq, masks, advantages(rewards))


def main() -> None:
    from tree_dpo import tiny_models  # the same tiny float64 GPT-2 and attention

    torch.set_num_threads(1)
    model, _ = tiny_models()
    groups, rewards = rollout_groups(3, 4, 266, seed=0)
    params = list(model.parameters())
    tree = tree_grpo(model, groups, rewards)
    g_tree = torch.autograd.grad(tree, params)
    flat = unpacked_grpo(model, groups, rewards)
    g_flat = torch.autograd.grad(flat, params)
    diff = max(float((a - b).abs().max()) for a, b in zip(g_tree, g_flat, strict=True))
    print(
        f"GRPO loss tree {float(tree.detach()):.15f} unpacked {float(flat.detach()):.15f};"
        f" max gradient diff {diff:.2e}"
    )


if __name__ == "__main__":
    main()
