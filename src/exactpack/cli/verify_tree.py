"""``exactpack pack --tree``, ``stats --tree``: the tree packing commands."""

from __future__ import annotations

import argparse
import json
from typing import Any

from exactpack.core.errors import InvalidInput


def cmd_stats_tree(args: argparse.Namespace) -> int:
    """``exactpack stats --tree``: tokens stored and rows, tree vs flat, one policy."""
    from exactpack.cli.flags import from_arguments
    from exactpack.pipeline.pack_tree import tree_stats

    options = from_arguments(args, "stats")
    policy = (args.policies or ["best-fit-decreasing"])[0]
    source = args.input[0] if len(args.input) == 1 else list(args.input)
    r = tree_stats(source, options, policy, options.load_tokenizer())
    if args.json:
        print(json.dumps(r))
        return 0
    print(
        f"{r['groups']:,} groups, {r['sequences']:,} sequences, capacity {r['capacity']},"
        f" {r['policy']}: tree stores {r['tokens_stored']:,} cells in {r['rows_tree']:,} rows;"
        f" flat {r['tokens_flat']:,} in {r['rows_flat']:,} rows ({r['stored_over_flat']:.3f}x)"
    )
    return 0


def cmd_pack_tree(args: argparse.Namespace, options: Any) -> int:
    """``exactpack pack --tree``: tries written as a version-3 packed directory."""
    if args.engine != "local":
        raise InvalidInput("--tree packs on the local engine: drop --engine ray")
    from exactpack.pipeline.pack_tree import pack_tree_path

    s = pack_tree_path(args.input, args.out, options)
    if args.json:
        print(json.dumps(s))
        return 0
    print(
        f"tree-packed {s['sequences']:,} sequences in {s['groups']:,} groups as {s['tries']:,}"
        f" tries with {s['policy']} into {s['rows']:,} rows of {s['capacity']}:"
        f" {s['tokens_stored']:,} cells stored for {s['tokens_flat']:,} flat"
        f" ({s['stored_over_flat']:.3f}x), {s['seconds']:.2f} s"
    )
    print(f"wrote {s['out']}: {s['shards']} shard(s), format version 3 (tree rows)")
    return 0
