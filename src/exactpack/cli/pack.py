"""``exactpack pack`` and ``exactpack stats``: the option classes' flags
(:mod:`exactpack.cli.flags`) plus the input, ``--out``, ``--engine`` and ``--json``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from exactpack.cli.flags import add_arguments, from_arguments, in_flags
from exactpack.core.errors import InvalidInput
from exactpack.pipeline.progress import printable


def _add_common(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument(
        "input",
        nargs="+",
        help=".jsonl/.json (or .jsonl.gz/.zst/.bz2/.xz), .parquet, .txt (one document per line),"
        " a folder of shards, a glob, a datasets folder, or - for standard input; several are"
        " read in order",
    )
    add_arguments(p, command)
    p.add_argument("--json", action="store_true", help="print the statistics as JSON (last line)")


def add_pack(p: argparse.ArgumentParser) -> None:
    from exactpack.ray.ray_options import RayOptions

    _add_common(p, "pack")
    p.add_argument("--out", required=True, help="output folder (written atomically)")
    p.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local: this process; ray: read, tokenize and plan per block on Ray",
    )
    add_arguments(p, "pack", RayOptions)


class _WritesNothing(argparse.Action):
    """``stats --out``: refused, since stats only reads (``pack`` writes)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        parser.error(
            "--out: stats writes nothing, it compares the policies — run exactpack pack with"
            " the same arguments to write the rows there, or drop --out"
        )


def add_stats(p: argparse.ArgumentParser) -> None:
    _add_common(p, "stats")
    p.add_argument("--out", action=_WritesNothing, help=argparse.SUPPRESS)
    p.add_argument("--plot", metavar="PATH", help="draw the length histogram and row fill (PNG)")
    p.add_argument(
        "--policy", dest="policies", action="append", help="only these policies (repeatable)"
    )


def _checked(args: argparse.Namespace) -> Any:
    """The input (a path, or the list of several), with the tree flags checked."""
    if args.tree != "auto" and args.tree_prefix is not None:
        raise InvalidInput("--tree-prefix groups documents for --tree auto: add it")
    if args.tree is None and args.tree_block is not None:
        raise InvalidInput("--tree-block bounds the blocks of tree packing: add --tree")
    return args.input[0] if len(args.input) == 1 else list(args.input)


def _unit(options: Any) -> str:
    """What example lengths count: prediction pairs, or tokens with --format trl."""
    return "tokens" if options.format == "trl" else "prediction pairs"


def cmd_pack(args: argparse.Namespace) -> int:
    args.input = _checked(args)
    options = from_arguments(args, "pack")
    if args.engine == "ray":
        from exactpack import ray as ray_engine
        from exactpack.ray.ray_options import RayOptions

        engine = from_arguments(args, "pack", RayOptions)
        stats = ray_engine.pack(args.input, args.out, options, engine)
    else:
        if (args.block_examples, args.address, args.num_cpus) != (None, None, None):
            raise InvalidInput("--block-examples and --ray-* options need --engine ray")
        from exactpack.pipeline.local import pack_path

        stats = pack_path(args.input, args.out, options)
    report_input(args.command, stats)
    if args.json:
        print(json.dumps(stats))
        return 0
    if args.tree is not None:
        _print_tree(stats)
        return 0
    cut = stats.get("truncated_sources", 0)
    cut = f", {cut:,} truncated ({stats['truncated_tokens']:,} tokens left out)" if cut else ""
    print(
        f"packed {stats['examples']:,} examples ({stats['tokens']:,} {_unit(options)},"
        f" {stats['split_sources']:,} sources split{cut}) with {stats['policy']} into"
        f" {stats['rows']:,} rows of {stats['capacity']} tokens:"
        f" lower bound {stats['lower_bound']:,}, efficiency {stats['efficiency']:.2%},"
        f" {stats['seconds']:.2f} s"
    )
    print(
        f"wrote {printable(stats['out'])}: {stats['shards']} shard(s),"
        f" {stats['batches']:,} model call(s)"
    )
    if "blocks" in stats:
        print(
            f"ray: {stats['blocks']:,} block(s) on {stats['nodes']} node(s); rows / global lower"
            f" bound {stats['rows_over_lower_bound']:.4f} (per-block lower bounds sum to"
            f" {stats['block_lower_bound']:,})"
        )
    return 0


def _print_tree(s: dict) -> None:
    print(
        f"tree-packed {s['sequences']:,} sequences in {s['groups']:,} groups as {s['tries']:,}"
        f" tries with {s['policy']} into {s['rows']:,} rows of {s['capacity']}:"
        f" {s['tokens_stored']:,} cells stored for {s['tokens_flat']:,} flat"
        f" ({s['stored_over_flat']:.3f}x), {s['seconds']:.2f} s\nwrote {printable(s['out'])}:"
        f" {s['shards']} shard(s), {s['batches']:,} model call(s), forest rows (node columns)"
    )


def report_input(command: str, stats: dict) -> None:
    """Warn on stderr about repeated ids; note hidden folders of killed runs cleaned up."""
    for note in stats.get("recovered", []):
        print(f"exactpack {command}: note: {printable(note)}", file=sys.stderr)
    if stats.get("duplicate_ids"):
        first = stats["duplicate_first"]
        print(
            printable(
                f"exactpack {command}: warning: {stats['duplicate_ids']:,} row(s) repeat an"
                f" earlier id (first: {first['id']!r} at {first['at']}, first seen at"
                f" {first['first_seen']}); each is packed as its own occurrence — de-duplicate"
                " the input if that is not intended"
            ),
            file=sys.stderr,
        )


def cmd_stats(args: argparse.Namespace) -> int:
    source = _checked(args)
    from exactpack.pipeline.stats import oversized_line, stats_path

    options = from_arguments(args, "stats")
    report = stats_path(source, options, policies=args.policies, plot=args.plot)
    if args.tree and not args.json:  # tree vs flat under one policy
        r = report
        print(
            f"{r['groups']:,} groups, {r['sequences']:,} sequences, capacity {r['capacity']},"
            f" {r['policy']}: tree stores {r['tokens_stored']:,} cells in {r['rows_tree']:,}"
            f" rows; flat {r['tokens_flat']:,} in {r['rows_flat']:,} rows"
            f" ({r['stored_over_flat']:.3f}x)"
        )
        return 0
    report_input(args.command, report)
    over = report.get("oversized")
    if over is not None:
        line = in_flags(oversized_line(over, report["capacity"]))
        print(f"exactpack stats: warning: {printable(line)}", file=sys.stderr)
    if args.json:
        print(json.dumps(report))
        return 0
    left_out = f", {over['examples']:,} too long left out" if over is not None else ""
    print(
        f"{report['examples']:,} examples ({report['split_sources']:,} sources split{left_out}),"
        f" {report['tokens']:,} {_unit(options)}, max length {report['capacity']},"
        f" lower bound {report['lower_bound']:,} rows"
    )
    print(f"{'policy':<22} {'rows':>12} {'rows/LB':>9} {'efficiency':>11} {'seconds':>9}")
    for r in report["policies"]:
        print(
            f"{r['policy']:<22} {r['rows']:>12,} {r['rows_over_lower_bound']:>9.4f}"
            f" {r['efficiency']:>11.2%} {r['seconds']:>9.3f}"
        )
    if "plot" in report:
        print(f"plot: {printable(report['plot'])}")
    return 0
