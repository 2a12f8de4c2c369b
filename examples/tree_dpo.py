"""A DPO step on tree-packed rows: each prompt stored once for its chosen and rejected answer.

Each model (policy and reference) runs **one** forward over the tree-packed
rows; :func:`exactpack.nn.logprobs.sequence_logprobs` gives every original
sequence's summed completion log-probability, from which the DPO loss is

    loss = -mean_g log σ(β [(π_c - ρ_c) - (π_r - ρ_r)])

(π policy, ρ reference, c chosen, r rejected). :func:`unpacked_dpo` computes
the same from each sequence run alone; ``main`` prints both and the largest
gradient difference. The tests run both in float64.

    .venv/bin/python examples/tree_dpo.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from exactpack.core.binding import Binding
from exactpack.core.tree import SequenceGroups, pack_tree
from exactpack.hf import hf_inputs
from exactpack.nn.logprobs import sequence_logprobs
from exactpack.verify.models import load_model

TINY_GPT2 = {
    "model_type": "gpt2",
    "vocab_size": 266,
    "n_embd": 16,
    "n_layer": 2,
    "n_head": 2,
    "n_positions": 128,
    "initializer_range": 0.2,
    "attn_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "resid_pdrop": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
}


def preference_groups(n: int, vocab: int, seed: int) -> SequenceGroups:
    """``n`` random (prompt, chosen, rejected) triples; group ``g`` = [chosen, rejected]."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, vocab, rng.integers(8, 24)) for _ in range(n)]
    pairs = [[rng.integers(0, vocab, rng.integers(2, 9)) for _ in range(2)] for _ in range(n)]
    return SequenceGroups.from_prompt_completions(prompts, pairs, Binding(vocab, "ids", "dpo"))


def tree_logprobs(model: torch.nn.Module, groups: SequenceGroups, capacity: int) -> torch.Tensor:
    """Summed completion log-probs of every sequence, in supplied order, from one forward."""
    (batch,) = pack_tree(groups, capacity, policy="best-fit-decreasing").batches
    dtype = next(model.parameters()).dtype
    logits = model(**hf_inputs(batch, "exactpack_tree", config=model.config, dtype=dtype)).logits
    sums = sequence_logprobs(logits, batch)
    return sums.new_zeros(len(groups)).index_copy(0, torch.as_tensor(batch.seq_index), sums)


def separate_logprobs(model: torch.nn.Module, groups: SequenceGroups) -> torch.Tensor:
    out = []
    for i in range(len(groups)):
        seq = torch.as_tensor(groups.sequence(i).astype(np.int64))
        logits = model(input_ids=seq[None, :-1], use_cache=False).logits[0]
        lp = logits.log_softmax(-1).gather(1, seq[1:, None])[:, 0]
        out.append((lp * torch.as_tensor(groups.pair_mask(np.array([i])))).sum())
    return torch.stack(out)


def dpo_loss(policy: torch.Tensor, reference: torch.Tensor, beta: float) -> torch.Tensor:
    """Sequence log-probs ordered [chosen_0, rejected_0, chosen_1, ...] -> the DPO loss."""
    margin = (policy[0::2] - reference[0::2]) - (policy[1::2] - reference[1::2])
    return -F.logsigmoid(beta * margin).mean()


def tree_dpo(policy, reference, groups, beta=0.1, capacity=256) -> torch.Tensor:
    with torch.no_grad():
        ref = tree_logprobs(reference, groups, capacity)
    return dpo_loss(tree_logprobs(policy, groups, capacity), ref, beta)


def unpacked_dpo(policy, reference, groups, beta=0.1) -> torch.Tensor:
    with torch.no_grad():
        ref = separate_logprobs(reference, groups)
    return dpo_loss(separate_logprobs(policy, groups), ref, beta)


def tiny_models(config: Path | None = None) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Policy (seed 0) and reference (seed 1), float64, on ``exactpack_tree`` attention."""
    with tempfile.TemporaryDirectory() as tmp:
        path = config or Path(tmp) / "config.json"
        if config is None:
            path.write_text(json.dumps(TINY_GPT2))
        models = tuple(load_model(config=path, dtype=torch.float64, seed=s) for s in (0, 1))
    for m in models:
        m.set_attn_implementation("exactpack_tree")  # registered by exactpack.hf
    return models


def main() -> None:
    torch.set_num_threads(1)
    policy, reference = tiny_models()
    groups = preference_groups(6, 266, seed=0)
    params = list(policy.parameters())
    tree = tree_dpo(policy, reference, groups)
    g_tree = torch.autograd.grad(tree, params)
    flat = unpacked_dpo(policy, reference, groups)
    g_flat = torch.autograd.grad(flat, params)
    diff = max(float((a - b).abs().max()) for a, b in zip(g_tree, g_flat, strict=True))
    (batch,) = pack_tree(groups, 256, policy="best-fit-decreasing").batches
    print(
        f"DPO loss tree {float(tree.detach()):.15f} unpacked {float(flat.detach()):.15f};"
        f" max gradient diff {diff:.2e}"
    )
    print(f"cells stored {batch.tokens_stored} for {batch.tokens_flat} flat")


if __name__ == "__main__":
    main()
