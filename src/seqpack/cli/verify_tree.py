"""``seqpack verify --tree-lengths``: tree-packed rows against each sequence run alone."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from seqpack.core.errors import InvalidInput

#: Implementations the tree verification feeds (the flattened kinds cannot express a tree).
TREE_IMPLEMENTATIONS = ("eager", "sdpa", "seqpack_tree")


def cmd_verify_tree(args: argparse.Namespace) -> int:
    os.environ["HF_HUB_OFFLINE"] = "1"  # never download: configs and weights are local
    if not (args.hf_config or args.hf_model):
        raise InvalidInput(
            "--tree-lengths verifies a transformers model: pass --hf-config or --hf-model"
        )
    if args.lengths:
        raise InvalidInput("--tree-lengths and --lengths are two layouts: pass one of them")
    attn = args.attn or "sdpa"
    if attn not in TREE_IMPLEMENTATIONS:
        raise InvalidInput(
            f"--attn {attn!r} cannot run tree-packed rows here; choose one of"
            f" {', '.join(TREE_IMPLEMENTATIONS)} (cu_seqlens kinds cannot express a tree;"
            " FlexAttention has no CPU backward)"
        )
    if args.mode not in ("adapter", "naive"):
        raise InvalidInput(
            f"--mode {args.mode} does not apply to --tree-lengths: use adapter or naive"
        )
    from seqpack.verify import tree_models as tree_verify
    from seqpack.verify.models import DTYPES, load_model

    spec = tree_verify.parse_tree_lengths(args.tree_lengths)
    model = load_model(
        config=args.hf_config,
        model=args.hf_model,
        attn_implementation="eager" if attn == "eager" else "sdpa",
        dtype=DTYPES[args.dtype],
        seed=args.seed,
        device=args.device,
    )
    if attn == "seqpack_tree":
        tree_verify.use_tree_attention(model)
    cfg = model.config.get_text_config()
    groups = tree_verify.tree_groups(spec, cfg.vocab_size, args.seed)
    limit = getattr(cfg, "max_position_embeddings", None)
    if limit is not None and int(groups.lengths.max()) > limit:
        raise InvalidInput(
            f"a sequence of {int(groups.lengths.max())} pairs is longer than the model's"
            f" max_position_embeddings {limit} — shorten --tree-lengths"
        )
    report = tree_verify.verify_tree(model, groups, mode=args.mode, capacity=args.capacity)
    report["model"]["source"] = str(args.hf_config or args.hf_model)
    if args.json:
        print(json.dumps(report))
    else:
        _print(report)
    return 0 if report["pass"] else 1


def _print(report: dict) -> None:
    m = report["model"]
    print(
        f"{m['source']}: {m['model_type']} ({m['parameters']:,} parameters, {m['dtype']},"
        f" {m['attn_implementation']}, {m['device']}), mode {report['mode']}: {report['groups']}"
        f" groups, {report['sequences']} sequences of {report['lengths']} pairs as tries of"
        f" {report['nodes']} nodes: {report['tokens_stored']} cells stored for"
        f" {report['tokens_flat']} flat, {report['rows']} row(s) of {report['capacity']}"
    )
    tol = report["tolerance"]
    diffs = ", ".join(f"{k} {v:.2e}" for k, v in report["max_abs_diff"].items())
    fails = ", ".join(
        f"{k} {v:,}/{report['comparisons'][k]:,}" for k, v in report["failures"].items()
    )
    print(f"max abs diff vs separate: {diffs}")
    print(
        f"out of tolerance: {fails} (|a-b| <= {tol['abs']:g} + {tol['rel']:g}*max(|a|,|b|);"
        f" {tol['why']})"
    )
    g = report["gradient_tolerance"]
    if g != tol:
        print(f"gradients: |a-b| <= {g['abs']:g} + {g['rel']:g}*max(|a|,|b|) ({g['why']})")
    if report["pass"]:
        print("PASS: tree-packed rows compute what each sequence computes alone")
    else:
        print(f"FAIL: {report['hint']}")


def cmd_stats_tree(args: argparse.Namespace) -> int:
    """``seqpack stats --tree``: tokens stored and rows, tree vs flat, one policy."""
    from seqpack.cli.flags import from_arguments
    from seqpack.io.tree_files import tree_file_groups, tree_stats
    from seqpack.pipeline.tree_options import TreeOptions

    topts = from_arguments(args, "stats", TreeOptions)
    if len(args.input) != 1:
        raise InvalidInput("--tree reads one .jsonl/.json or .parquet file")
    policy = (args.policies or ["best-fit-decreasing"])[0]
    groups = tree_file_groups(
        args.input[0],
        mode=topts.tree or "on",
        prefix=topts.tree_prefix,
        window=topts.tree_window,
        tokenizer=(options := from_arguments(args, "stats")).load_tokenizer(),
    )
    report = tree_stats(groups, options.capacity, policy)
    if args.json:
        print(json.dumps(report))
        return 0
    print(
        f"{report['groups']:,} groups, {report['sequences']:,} sequences, capacity"
        f" {report['capacity']}, {report['policy']}: tree stores {report['tokens_stored']:,}"
        f" cells in {report['rows_tree']:,} rows; flat {report['tokens_flat']:,} in"
        f" {report['rows_flat']:,} rows ({report['stored_over_flat']:.3f}x)"
    )
    return 0


def cmd_pack_tree(args: argparse.Namespace, options: Any, tree: Any) -> int:
    """``seqpack pack --tree``: tries written as a version-3 packed directory."""
    if args.engine != "local":
        raise InvalidInput("--tree packs on the local engine: drop --engine ray")
    if isinstance(args.input, list):
        raise InvalidInput("--tree reads one .jsonl/.json or .parquet file, not several")
    from seqpack.pipeline.pack_tree import pack_tree_path

    stats = pack_tree_path(args.input, args.out, options, tree)
    if args.json:
        print(json.dumps(stats))
        return 0
    print(
        f"tree-packed {stats['sequences']:,} sequences in {stats['groups']:,} groups as"
        f" {stats['tries']:,} tries with {stats['policy']} into {stats['rows']:,} rows of"
        f" {stats['capacity']}: {stats['tokens_stored']:,} cells stored for"
        f" {stats['tokens_flat']:,} flat ({stats['stored_over_flat']:.3f}x),"
        f" {stats['seconds']:.2f} s"
    )
    print(f"wrote {stats['out']}: {stats['shards']} shard(s), format version 3 (tree rows)")
    return 0
