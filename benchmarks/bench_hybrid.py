"""Hybrid models on packed rows: what the boundary-aware mixers cost, and what packing buys.

A tiny Qwen3.5 (gated delta rule + attention, 3:1 as the real model; width 256, 4 layers,
vocabulary 4096, float32, one thread, CPU, transformers' torch fallbacks) trains on examples
of W1-like lengths (W1 in the design notes: lognormal, median ~212, mean ~350, clipped to
the capacity 2048), random ids. Two ratios, measured in one process, medians of ``--repeats``
forward + backward steps each, the steps taken in turn and timed in CPU seconds
(``time.process_time``: one thread, so a shared machine's load moves them little):

(a) **boundary cost** = packed rows (``restart_mixers`` + ``hf_inputs``; ``--attn``
    ``exactpack_varlen``: the valid cells flattened, SDPA per example; ``sdpa``: one dense
    block mask a row) / the same examples run unpacked, one call each (``(1, L)``, no
    padding): the price of keeping the examples apart on the same tokens. Target <= 1.3.
(b) **packed / padded real tokens/s**: the same examples as padded rows (one example a row,
    micro-batches of ``--padded-rows`` padded to their longest, no restarts needed: padding
    sits after each example) against the packed rows. Target >= 1.5.
(c) with ``--tree``: DPO-like tries on tree rows against each sequence alone
    (:func:`tree_ratio`).

    PYTHONPATH=src .venv/bin/python benchmarks/bench_hybrid.py [--rows 4] [--repeats 3]
        [--attn exactpack_varlen|sdpa] [--tree] [--profile]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

CAPACITY = 2048


def w1_lengths(total_cells: int, capacity: int = CAPACITY, seed: int = 20240601) -> np.ndarray:
    """W1's first lengths (prediction pairs), clipped to ``capacity``, up to ``total_cells``."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.rint(rng.lognormal(np.log(350) - 0.5, 1.0, 10_000)), 8, capacity)
    keep = np.cumsum(lengths) <= total_cells
    return lengths[keep].astype(np.int64)


def tiny_qwen3_5():
    import transformers

    config = transformers.Qwen3_5TextConfig(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        linear_conv_kernel_dim=4,
        max_position_embeddings=CAPACITY,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.Qwen3_5ForCausalLM(config).train()


def timed(steps: dict, repeats: int) -> dict[str, float]:
    """Median CPU seconds (this process's, one thread: steady on a shared machine where wall
    time is not) of each step, the steps taken in turn ``repeats`` times after a warm-up."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for i in range(repeats + 1):
        for name, step in steps.items():
            start = time.process_time()
            step()
            if i:
                times[name].append(time.process_time() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def tree_ratio(model, repeats: int) -> dict:
    """(c) four DPO-like groups (prompt 600, chosen and rejected 150 tokens) as tree rows
    (``exactpack_tree``: each branch's mixer state forked from the prompt's) against each
    sequence run alone: the shared prompt computed once instead of twice."""
    from exactpack.core.loss import token_weighted_loss
    from exactpack.core.tree import pack_tree
    from exactpack.hf import hf_inputs
    from exactpack.verify.models import tree_groups

    groups = tree_groups([(600, (150, 150))] * 4, model.config.vocab_size, 0)
    (batch,) = pack_tree(groups, CAPACITY).batches
    model.set_attn_implementation("exactpack_tree")
    inputs = hf_inputs(batch, "exactpack_tree", config=model.config)
    seqs = [
        torch.as_tensor(groups.sequence(i)[:-1].astype(np.int64))[None] for i in range(len(groups))
    ]

    def step_tree():
        model.zero_grad(set_to_none=True)
        token_weighted_loss(model(**inputs).logits, batch).mean.backward()

    def step_alone():
        model.zero_grad(set_to_none=True)
        for x in seqs:
            model(input_ids=x, labels=x, use_cache=False).loss.backward()

    t = timed({"tree": step_tree, "alone": step_alone}, repeats)
    t_tree, t_alone = t["tree"], t["alone"]
    return {
        "tree": {"rows": batch.shape[0], "cells": int(batch.input_valid.sum()),
                 "sequence_tokens": int(sum(x.shape[1] for x in seqs)),
                 "seconds": {"tree": t_tree, "alone": t_alone}},
        "tree_speedup_over_sequences_alone": t_alone / t_tree,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4, help="packed rows of 2048 to fill")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--padded-rows", type=int, default=4, help="examples a padded call")
    parser.add_argument("--attn", default="exactpack_varlen", help="the packed rows' kind")
    parser.add_argument("--profile", action="store_true", help="the packed step's top ops")
    parser.add_argument(
        "--tree", action="store_true", help="(c): DPO-like tries on tree rows vs each alone"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    import transformers

    from exactpack import PackConfig, pack_examples
    from exactpack.hf.adapter import hf_inputs
    from exactpack.hf.mixers import restart_mixers
    from exactpack.verify.models import VerifyCase, verification_examples

    transformers.logging.set_verbosity_error()
    model = restart_mixers(tiny_qwen3_5())
    if args.attn != "sdpa":
        model.set_attn_implementation(args.attn)
    lengths = w1_lengths(int(args.rows * CAPACITY * 0.97))
    examples = verification_examples(4096, 0, layout=VerifyCase(tuple(lengths), CAPACITY))
    config = PackConfig(CAPACITY, len(examples))
    epoch = pack_examples(
        "train", examples, examples[0].binding, config, policy="best-fit-decreasing"
    )
    (batch,) = epoch.batches
    packed = hf_inputs(batch, args.attn, config=model.config)
    ids = [torch.as_tensor(e.inputs.astype(np.int64))[None] for e in examples]  # (1, L) each

    def step_packed():
        model.zero_grad(set_to_none=True)
        model(**packed).loss.backward()  # sdpa / the unpacked calls: the layers' own attention

    def step_unpacked():
        model.zero_grad(set_to_none=True)
        for x in ids:
            model(input_ids=x, labels=x, use_cache=False).loss.backward()

    def step_padded():
        model.zero_grad(set_to_none=True)
        for i in range(0, len(ids), args.padded_rows):
            group = ids[i : i + args.padded_rows]
            width = max(x.shape[1] for x in group)
            x = torch.zeros(len(group), width, dtype=torch.int64)
            mask = torch.zeros_like(x)
            for r, g in enumerate(group):
                x[r, : g.shape[1]], mask[r, : g.shape[1]] = g[0], 1
            labels = x.masked_fill(mask == 0, -100)
            model(input_ids=x, attention_mask=mask, labels=labels, use_cache=False).loss.backward()

    if args.profile:
        from torch.profiler import profile

        step_packed()
        with profile() as prof:
            step_packed()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    t = timed(
        {"packed": step_packed, "unpacked": step_unpacked, "padded": step_padded}, args.repeats
    )
    t_packed, t_unpacked, t_padded = t["packed"], t["unpacked"], t["padded"]
    tokens = int(sum(x.shape[1] for x in ids))
    padded_cells = sum(
        len(ids[i : i + args.padded_rows]) * max(x.shape[1] for x in ids[i : i + args.padded_rows])
        for i in range(0, len(ids), args.padded_rows)
    )
    tree = tree_ratio(model, args.repeats) if args.tree else {}
    print(
        json.dumps(
            {
                "model": "tiny Qwen3.5 (width 256, 4 layers: 3 gated delta rule + 1 attention)",
                "examples": len(ids),
                "tokens": tokens,
                "packed_rows": batch.shape[0],
                "padded_cells": padded_cells,
                "seconds": {"packed": t_packed, "unpacked": t_unpacked, "padded": t_padded},
                "boundary_cost_packed_over_unpacked": t_packed / t_unpacked,
                "packed_over_padded_tokens_per_s": t_padded / t_packed,
                **tree,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
