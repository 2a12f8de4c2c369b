"""Tree packing vs flat packing vs padding: stored tokens, rows, planning speed, step throughput.

Two seeded workloads (random ids, so completions rarely share first tokens):

* **W_G** (GRPO-like): prompts lognormal in [256, 2048] tokens, 8 completions
  each, lognormal in [32, 1024];
* **W_D** (DPO-like): prompts in [128, 1024], chosen and rejected in [32, 512].

Reported per workload at ``--capacity``: stored cells and rows for padded
(one sequence per row of the longest sequence), flat (best-fit-decreasing)
and tree (best-fit-decreasing over tries); tree planning speed on 1M
sequences (integers only: layout + plan); trie building from tokens; and
the training-step throughput (forward + backward, float32, one thread) of a
small Llama through ``transformers`` on a few groups, flat rows on
``exactpack_varlen`` against tree rows on ``exactpack_tree``, counting tokens as
the flat sequences they represent.

    .venv/bin/python benchmarks/bench_tree.py --groups 2000 --step-groups 2
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from exactpack.core.binding import Binding
from exactpack.core.policies import plan_rows
from exactpack.core.tree import SequenceGroups, build_layout, group_bounds, pack_tree, plan_tries

VOCAB = 32000
#: The step model's vocabulary: small enough that one thread runs a step in seconds.
STEP_VOCAB = 4096


def clipped_lognormal(rng, lo: int, hi: int, n: int) -> np.ndarray:
    mu = np.log(np.sqrt(lo * hi))
    sigma = np.log(hi / lo) / 4  # ±2σ spans [lo, hi]
    return np.clip(np.rint(rng.lognormal(mu, sigma, n)), lo, hi).astype(np.int64)


def workload(name: str, groups: int, seed: int = 20261201):
    """(prompt lengths [G], completion lengths [G, k]) of W_G or W_D."""
    rng = np.random.default_rng(seed if name == "W_G" else seed + 1)
    if name == "W_G":
        return clipped_lognormal(rng, 256, 2048, groups), clipped_lognormal(
            rng, 32, 1024, groups * 8
        ).reshape(groups, 8)
    return rng.integers(128, 1025, groups), rng.integers(32, 513, (groups, 2))


def token_groups(
    prompts: np.ndarray, comps: np.ndarray, seed: int, vocab: int = VOCAB
) -> SequenceGroups:
    rng = np.random.default_rng(seed)
    p_tokens = [rng.integers(0, vocab, p) for p in prompts]
    c_tokens = [[rng.integers(0, vocab, c) for c in row] for row in comps]
    return SequenceGroups.from_prompt_completions(
        p_tokens, c_tokens, Binding(vocab, "ids", "bench")
    )


def storage(name: str, groups: int, capacity: int) -> dict:
    prompts, comps = workload(name, groups)
    data = token_groups(prompts, comps, seed=1)
    t0 = time.perf_counter()
    layout = build_layout(data, capacity)
    build_s = time.perf_counter() - t0
    lengths = data.lengths
    flat = plan_rows(lengths, capacity, "best-fit-decreasing")
    tree = plan_rows(layout.sizes, capacity, "best-fit-decreasing")
    padded = int(lengths.shape[0] * lengths.max())
    out = {
        "workload": name,
        "groups": groups,
        "sequences": int(lengths.shape[0]),
        "capacity": capacity,
        "padded": {"tokens_stored": padded, "rows": int(lengths.shape[0])},
        "flat": {"tokens_stored": int(lengths.sum()), "rows": flat.num_rows},
        "tree": {
            "tokens_stored": int(layout.sizes.sum()),
            "rows": tree.num_rows,
            "tries": int(layout.sizes.shape[0]),
        },
        "build_from_tokens_s": build_s,
        "build_tokens_per_s": int(data.tokens.shape[0] / build_s),
    }
    out["tree_over_flat_tokens"] = out["tree"]["tokens_stored"] / out["flat"]["tokens_stored"]
    out["tree_over_flat_rows"] = out["tree"]["rows"] / out["flat"]["rows"]
    return out


def planning(sequences: int = 1_000_000, capacity: int = 16384) -> dict:
    """Integers-only tree planning of ``sequences`` W_G sequences (groups of 8)."""
    groups = sequences // 8
    prompts, comps = workload("W_G", groups)
    lengths = (prompts[:, None] + comps - 1).reshape(-1)
    lcp = np.repeat(prompts - 1, 8)  # a group shares its prompt: P - 1 cells
    lcp[::8] = 0
    bounds = group_bounds(np.repeat(np.arange(groups), 8))
    plan_rows(np.array([1, 2, 3]), capacity, "best-fit-decreasing")  # compile the kernel first
    t0, c0 = time.perf_counter(), time.process_time()
    layout = plan_tries(lengths, lcp, bounds, capacity)
    plan = plan_rows(layout.sizes, capacity, "best-fit-decreasing")
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    n = int(lengths.shape[0])
    # on a shared machine the wall clock includes other processes' time; CPU time does not
    return {
        "sequences": n,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "sequences_per_s": int(n / seconds),
        "sequences_per_cpu_s": int(n / cpu),
        "rows": plan.num_rows,
        "nodes": int(layout.node_len.shape[0]),
    }


def step_throughput(name: str, groups: int, repeats: int, scale: int) -> dict:
    """Flat (exactpack_varlen) vs tree (exactpack_tree) training steps on ``groups`` groups."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from exactpack.core.compact import pack_examples
    from exactpack.core.config import PackConfig
    from exactpack.core.examples import SequenceExample
    from exactpack.core.loss import token_weighted_loss
    from exactpack.hf.adapter import hf_inputs, hf_loss
    from exactpack.hf.attention_impl import register

    torch.set_num_threads(1)
    register()
    prompts, comps = workload(name, groups, seed=777)
    prompts, comps = np.maximum(prompts // scale, 2), np.maximum(comps // scale, 2)
    data = token_groups(prompts, comps, seed=2, vocab=STEP_VOCAB)
    cfg = LlamaConfig(
        vocab_size=STEP_VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).train()
    capacity = int(max(data.lengths.sum(), 1))
    stored = int(build_layout(data, capacity).sizes.sum())
    (tree_batch,) = pack_tree(
        data, stored
    ).batches  # one row, no padding (as the flattened flat row)
    examples = [
        SequenceExample.from_document(
            data.sequence(i),
            source_id=str(i),
            partition="train",
            binding=data.binding,
            loss_mask=data.pair_mask(np.array([i])),
        )
        for i in range(len(data))
    ]
    (flat_batch,) = pack_examples("train", examples, data.binding, PackConfig(capacity, 1)).batches

    def flat_step():
        model.set_attn_implementation("exactpack_varlen")
        out = model(**hf_inputs(flat_batch, "exactpack_varlen", config=cfg, labels=False))
        hf_loss(out.logits, flat_batch).mean.backward()

    def tree_step():
        model.set_attn_implementation("exactpack_tree")
        out = model(**hf_inputs(tree_batch, "exactpack_tree", config=cfg))
        token_weighted_loss(out.logits, tree_batch).mean.backward()

    times = {}
    for label, step in (("flat", flat_step), ("tree", tree_step)):
        step()  # warm-up
        best = []
        for _ in range(repeats):
            t0 = time.process_time()  # CPU time: a shared machine's other processes excluded
            step()
            best.append(time.process_time() - t0)
        times[label] = float(np.median(best))
    real = int(data.lengths.sum())
    return {
        "workload": name,
        "groups": groups,
        "length_scale": f"1/{scale}",
        "real_tokens": real,
        "flat_cells": flat_batch.eligible_count and int(flat_batch.input_valid.sum()),
        "tree_cells": tree_batch.tokens_stored,
        "flat_tokens_per_s": real / times["flat"],
        "tree_tokens_per_s": real / times["tree"],
        "speedup": times["flat"] / times["tree"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=2000)
    ap.add_argument("--capacity", type=int, default=16384)
    ap.add_argument("--plan-sequences", type=int, default=1_000_000)
    ap.add_argument("--step-groups", type=int, default=2)
    ap.add_argument(
        "--step-scale", type=int, default=1, help="divide lengths for the step (1: full)"
    )
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    report = {
        "storage": [storage(w, args.groups, args.capacity) for w in ("W_G", "W_D")],
        "planning": planning(args.plan_sequences, args.capacity),
        "steps": [
            step_throughput(w, args.step_groups, args.repeats, args.step_scale)
            for w in ("W_G", "W_D")
        ],
    }
    for s in report["storage"]:
        print(
            f"{s['workload']}: {s['sequences']:,} sequences, capacity {s['capacity']}:"
            " stored tokens padded"
            f" {s['padded']['tokens_stored']:,} / flat {s['flat']['tokens_stored']:,} / tree"
            f" {s['tree']['tokens_stored']:,} (tree/flat {s['tree_over_flat_tokens']:.3f}); rows"
            f" {s['padded']['rows']:,} / {s['flat']['rows']:,} / {s['tree']['rows']:,};"
            f" tries from tokens {s['build_tokens_per_s']:,} tokens/s"
        )
    p = report["planning"]
    print(
        f"tree planning: {p['sequences']:,} sequences in {p['seconds']:.3f} s wall"
        f" ({p['cpu_seconds']:.3f} s CPU)"
        f" = {p['sequences_per_s']:,} sequences/s ({p['sequences_per_cpu_s']:,} per CPU second)"
    )
    for s in report["steps"]:
        print(
            f"{s['workload']} step ({s['groups']} groups, lengths {s['length_scale']},"
            f" {s['real_tokens']:,} real tokens): flat {s['flat_tokens_per_s']:,.0f} tok/s,"
            f" tree {s['tree_tokens_per_s']:,.0f} tok/s, speedup {s['speedup']:.2f}x"
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
