"""Compute balancing vs token balancing: the largest slot's FLOPs over the mean slot's.

    .venv/bin/python benchmarks/bench_balance.py            # W1 flat rows and GRPO-like trees

Rows are packed as users pack them (``plan_rows(..., "best-fit-decreasing")``), then
scheduled over 8 ranks × 4 micro-batches by :class:`~exactpack.training.RowSampler`
(flat) or :func:`~exactpack.training.distributed.schedule_rows` (tree rows), once by
tokens (greedy, the default) and once by a :class:`~exactpack.training.balance.CostModel`
(balanced Karmarkar–Karp). A step lasts as long as its slowest slot, so the figure
is ``Σ_steps max slot / Σ_steps mean slot`` of the FLOPs (1.0: no rank waits).
Tree rows: groups of a prompt (256–1024 tokens) and 8 completions (32–512), each
completion scoring ``c·p + c(c+1)/2`` pairs (:func:`~exactpack.training.balance.causal_pairs`).

Online GRPO (``exactpack.trl``'s exchange after generation): each step every rank generates
its own groups (a prompt and 8 completions, lengths drawn from W1), 4 micro-batches of
``--groups-per-micro-batch`` groups a rank. As generated (TRL: each rank trains what it
generated, its micro-batches balanced by compute among themselves) against the ranks
exchanging whole groups — dealt by tokens or by compute
(:func:`~exactpack.training.balance.balanced_groups` over the ranks, then over each rank's
micro-batches, as ``exactpack.trl`` deals them). The figure at the rank (the step waits for
its slowest rank) and at the micro-batch (the 32 slots), in FLOPs and in tokens.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from exactpack import plan_rows
from exactpack.training.balance import CostModel, balanced_groups, causal_pairs
from exactpack.training.distributed import RowSampler, RowStats, schedule_rows
from workloads import w1_sft

CONFIGS = {
    "Llama-3-8B": {
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    },
    "Qwen2.5-0.5B": {
        "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
    },
    "Qwen3-30B-A3B (MoE)": {
        "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
        "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936, "num_experts": 128,
        "num_experts_per_tok": 8, "moe_intermediate_size": 768,
    },
}  # fmt: skip
WORLD, MICRO = 8, 4


def figure(flops: np.ndarray, row_ids: np.ndarray, offsets: np.ndarray, steps: int) -> float:
    per_step = WORLD * MICRO
    loads = np.add.reduceat(np.r_[flops[row_ids], 0.0], offsets[:-1])
    loads = np.where(np.diff(offsets) > 0, loads, 0.0).reshape(steps, per_step)
    return float(loads.max(axis=1).sum() / loads.mean(axis=1).sum())


def flat_rows() -> RowStats:
    w = w1_sft()
    plan = plan_rows(w.lengths, w.capacity, "best-fit-decreasing")
    return RowStats.from_segments(w.lengths, plan.row_of, np.zeros(plan.num_rows, np.int64))


def tree_rows(groups: int = 4000, capacity: int = 16384) -> tuple[np.ndarray, np.ndarray]:
    """Tokens and causal pairs per row of GRPO-like groups, packed by their tokens."""
    rng = np.random.default_rng(7)
    prompt = rng.integers(256, 1025, groups)
    completions = rng.integers(32, 513, (groups, 8))
    tokens = prompt + completions.sum(axis=1)
    pairs = causal_pairs(prompt) + causal_pairs(completions, prompt[:, None]).sum(axis=1)
    plan = plan_rows(tokens, capacity, "best-fit-decreasing")
    row_tokens = np.bincount(plan.row_of, weights=tokens, minlength=plan.num_rows)
    row_pairs = np.bincount(plan.row_of, weights=pairs, minlength=plan.num_rows)
    return row_tokens, row_pairs


def online_grpo(cost: CostModel, per_micro: int, steps: int = 40) -> np.ndarray:
    """``Σ max / Σ mean`` over ``steps`` (float [method, measure, level]): methods as
    generated / exchanged by tokens / by compute; measures FLOPs / tokens; levels rank /
    micro-batch."""
    rng, w1 = np.random.default_rng(11), w1_sft().lengths
    k = per_micro * MICRO  # groups a rank
    sums = np.zeros((3, 2, 2, 2))  # method, measure, level, (max, mean)
    drawn = np.arange(WORLD * k).reshape(WORLD, k)  # each rank's own groups
    for _ in range(steps):
        p, c = rng.choice(w1, WORLD * k), rng.choice(w1, (WORLD * k, 8))
        tokens = (p + c.sum(1)).astype(np.float64)
        flops = cost.costs(tokens, causal_pairs(p) + causal_pairs(c, p[:, None]).sum(1))
        for m, by in enumerate((flops, tokens, flops)):
            shares = drawn if m == 0 else np.array(balanced_groups(by, WORLD, k))
            if by[shares].sum(1).max() >= by[drawn].sum(1).max():
                shares = drawn  # the exchange never makes the largest rank heavier
            slots = [s[g] for s in shares for g in balanced_groups(by[s], MICRO, per_micro)]
            for j, measure in enumerate((flops, tokens)):
                for level, parts in enumerate((shares, slots)):
                    loads = np.array([measure[q].sum() for q in parts])
                    sums[m, j, level] += loads.max(), loads.mean()
    return sums[..., 0] / sums[..., 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows-per-micro-batch", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--groups-per-micro-batch", type=int, nargs="+", default=[1, 2, 4])
    args = ap.parse_args()
    print(f"Online GRPO: {WORLD} ranks x {MICRO} micro-batches, groups of 8 (W1 lengths);"
          " largest share / mean at the rank and at the micro-batch")  # fmt: skip
    print("| model | groups/micro | measured in | as generated | by tokens | by compute |")
    print("|---|---:|---|---:|---:|---:|")
    for name, config in CONFIGS.items():
        for g in args.groups_per_micro_batch:
            fig = online_grpo(CostModel.from_config(config), g)
            for j, measure in enumerate(("FLOPs", "tokens")):
                cells = " | ".join(f"{fig[m, j, 0]:.4f} / {fig[m, j, 1]:.4f}" for m in range(3))
                print(f"| {name} | {g} | {measure} | {cells} |")
    stats = flat_rows()
    tree_tokens, tree_pairs = tree_rows()
    print(f"W1: {len(stats):,} rows of 4096; tree rows: {len(tree_tokens):,} rows of 16384")
    print(f"{WORLD} ranks x {MICRO} micro-batches; largest share / mean (target <= 1.05):"
          " sum over steps of the largest slot's FLOPs / sum of the mean slot's")  # fmt: skip
    print("| model | rows | rows/micro | by tokens | by compute | seconds (compute) |")
    print("|---|---|---:|---:|---:|---:|")
    for name, config in CONFIGS.items():
        cost = CostModel.from_config(config)
        for r in args.rows_per_micro_batch:
            flops = cost.row_costs(stats)
            out = []
            for balance in ("tokens", cost):
                t0 = time.perf_counter()
                s = RowSampler(
                    stats, rows_per_micro_batch=r, micro_batches=MICRO, world_size=WORLD,
                    rank=0, balance=balance,
                )  # fmt: skip
                sch = s.schedule
                out.append((figure(flops, sch.row_ids, sch.slot_offsets, sch.steps),
                            time.perf_counter() - t0))  # fmt: skip
            print(
                f"| {name} | W1 flat | {r} | {out[0][0]:.4f} | {out[1][0]:.4f} | {out[1][1]:.2f} |"
            )
            flops = cost.costs(tree_tokens, tree_pairs)
            out = []
            for loads, method in ((tree_tokens, "greedy"), (flops, "balanced")):
                t0 = time.perf_counter()
                sch = schedule_rows(
                    loads, world_size=WORLD, micro_batches=MICRO, rows_per_micro_batch=r,
                    method=method,
                )  # fmt: skip
                out.append((figure(flops, sch.row_ids, sch.slot_offsets, sch.steps),
                            time.perf_counter() - t0))  # fmt: skip
            row = f"| {name} | GRPO trees | {r} | {out[0][0]:.4f} | {out[1][0]:.4f}"
            print(f"{row} | {out[1][1]:.2f} |")


if __name__ == "__main__":
    main()
