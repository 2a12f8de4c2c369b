"""``seqpack`` command line: thin over the library.

Each subcommand lives in a function ``_cmd_NAME`` registered in
:data:`COMMANDS`; library errors become a one-line message and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Callable, Sequence

from .errors import SeqpackError

Command = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]


def _add_demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--figure", metavar="PATH", help="also draw the layout (PNG or SVG)")
    p.add_argument("--compact", action="store_true", help="print the JSON on one line")


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import demo_trace

    trace = demo_trace()
    if args.figure:
        from .figure import draw_fixture

        trace["figure"] = str(draw_fixture(args.figure))
    print(json.dumps(trace) if args.compact else format_json(trace))
    return 0


def format_json(value: object, indent: int = 0) -> str:
    """Indented JSON whose innermost lists (rows of cells) stay on one line."""
    pad, inner = "  " * indent, "  " * (indent + 1)
    if isinstance(value, dict) and value:
        items = [
            f"{inner}{json.dumps(str(k))}: {format_json(v, indent + 1)}" for k, v in value.items()
        ]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        if (
            all(
                isinstance(v, list) and not any(isinstance(x, (dict, list)) for x in v)
                for v in value
            )
            and len(json.dumps(value)) <= 100
        ):
            return json.dumps(value)
        items = [f"{inner}{format_json(v, indent + 1)}" for v in value]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    return json.dumps(value)


def _add_input(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help=".jsonl/.json, .parquet, a folder of shards or a datasets folder")
    p.add_argument("--capacity", type=int, required=True, help="prediction pairs per row")
    p.add_argument("--tokenizer", help="'bytes' (built-in, 266 ids) or a local tokenizer path")
    p.add_argument("--text-field", default="text", help="text column when there is no input_ids")
    p.add_argument("--partition", default="train", help="train, validation or test")
    p.add_argument("--split-long", action="store_true", help="split sources longer than a row")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON (last line)")


def _add_pack(p: argparse.ArgumentParser) -> None:
    _add_input(p)
    p.add_argument("--policy", default="best-fit-decreasing", help="packing policy")
    p.add_argument("--out", required=True, help="output folder (written atomically)")
    p.add_argument("--vocab-size", type=int, help="vocabulary size of pre-tokenized input")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.add_argument("--max-rows-per-batch", type=int, default=8, help="rows per model call")
    p.add_argument("--tokenizer-id", help="tokenizer identity recorded in the binding")
    p.add_argument("--split-id", help="split-receipt identity (default: digest of the data)")
    p.add_argument(
        "--option", action="append", default=[], metavar="KEY=VALUE", help="policy option"
    )
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local: this process; ray: plan per block on Ray (Parquet shards in)",
    )
    p.add_argument("--ray-address", metavar="ADDR", help="ray: join this cluster (e.g. auto)")
    p.add_argument("--ray-num-cpus", type=int, metavar="N", help="ray: size of a local instance")
    p.add_argument(
        "--block-examples", type=int, metavar="N", help="ray: examples per block (default: a shard)"
    )
    p.add_argument(
        "--max-metadata-bytes",
        type=_byte_size,
        metavar="BYTES",
        help="refuse (before planning) to pack when the plan, rows and one model call need"
        " more memory than this (e.g. 2G; with --engine ray, per block)",
    )


def _byte_size(text: str) -> int:
    """``123``, ``512K``, ``2G`` (powers of 1024) as a byte count."""
    units = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}
    body = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = body[-1:] if body[-1:] in units else ""
    try:
        value = float(body[: len(body) - len(unit)])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a byte size like 512M or 2G") from None
    return int(value * (1 << units[unit]))


def _policy_options(items: list[str]) -> dict[str, object]:
    from .errors import InvalidInput

    options: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidInput(f"--option {item!r} is not KEY=VALUE")
        try:
            options[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            options[key.replace("-", "_")] = value
    return options


def _cmd_pack(args: argparse.Namespace) -> int:
    from .errors import InvalidInput
    from .pipeline import pack_path

    run, engine = pack_path, {}
    if args.engine == "ray":
        from . import ray as ray_engine

        run = ray_engine.pack
        engine = {
            "block_examples": args.block_examples,
            "address": args.ray_address,
            "num_cpus": args.ray_num_cpus,
        }
    elif args.block_examples or args.ray_address or args.ray_num_cpus:
        raise InvalidInput("--block-examples and --ray-* options need --engine ray")
    if args.max_metadata_bytes is not None:
        engine["max_metadata_bytes"] = args.max_metadata_bytes
    stats = run(
        args.input,
        args.out,
        capacity=args.capacity,
        policy=args.policy,
        vocab_size=args.vocab_size,
        tokenizer=args.tokenizer,
        partition=args.partition,
        split_long_sources=args.split_long,
        overwrite=args.overwrite,
        max_rows_per_batch=args.max_rows_per_batch,
        text_field=args.text_field,
        tokenizer_id=args.tokenizer_id,
        split_id=args.split_id,
        policy_options=_policy_options(args.option),
        progress=args.progress,
        **engine,
    )
    _report_input(args.command, stats)
    if args.json:
        print(json.dumps(stats))
        return 0
    print(
        f"packed {stats['examples']:,} examples ({stats['tokens']:,} prediction pairs,"
        f" {stats['split_sources']:,} sources split) with {stats['policy']} into"
        f" {stats['rows']:,} rows of {stats['capacity']}: lower bound {stats['lower_bound']:,},"
        f" efficiency {stats['efficiency']:.2%}, {stats['seconds']:.2f} s"
    )
    print(f"wrote {stats['out']}: {stats['shards']} shard(s), {stats['batches']:,} model call(s)")
    if "blocks" in stats:
        print(
            f"ray: {stats['blocks']:,} block(s); rows / global lower bound"
            f" {stats['rows_over_lower_bound']:.4f} (per-block lower bounds sum to"
            f" {stats['block_lower_bound']:,})"
        )
    return 0


def _report_input(command: str, stats: dict) -> None:
    """Warn on stderr about repeated ids; note hidden folders of killed runs cleaned up."""
    for note in stats.get("recovered", []):
        print(f"seqpack {command}: note: {note}", file=sys.stderr)
    if stats.get("duplicate_ids"):
        first = stats["duplicate_first"]
        print(
            f"seqpack {command}: warning: {stats['duplicate_ids']:,} row(s) repeat an earlier id"
            f" (first: {first['id']!r} at {first['at']}, first seen at {first['first_seen']});"
            " each is packed as its own occurrence — de-duplicate the input if that is not"
            " intended",
            file=sys.stderr,
        )


def _add_stats(p: argparse.ArgumentParser) -> None:
    _add_input(p)
    p.add_argument("--plot", metavar="PATH", help="draw the length histogram and row fill (PNG)")
    p.add_argument("--policy", action="append", help="only these policies (repeatable)")


def _cmd_stats(args: argparse.Namespace) -> int:
    from .pipeline import stats_path

    report = stats_path(
        args.input,
        capacity=args.capacity,
        tokenizer=args.tokenizer,
        partition=args.partition,
        text_field=args.text_field,
        split_long_sources=args.split_long,
        policies=args.policy,
        plot=args.plot,
    )
    _report_input(args.command, report)
    if args.json:
        print(json.dumps(report))
        return 0
    print(
        f"{report['examples']:,} examples ({report['split_sources']:,} sources split),"
        f" {report['tokens']:,} prediction pairs, capacity {report['capacity']},"
        f" lower bound {report['lower_bound']:,} rows"
    )
    print(f"{'policy':<22} {'rows':>12} {'rows/LB':>9} {'efficiency':>11} {'seconds':>9}")
    for r in report["policies"]:
        print(
            f"{r['policy']:<22} {r['rows']:>12,} {r['rows_over_lower_bound']:>9.4f}"
            f" {r['efficiency']:>11.2%} {r['seconds']:>9.3f}"
        )
    if "plot" in report:
        print(f"plot: {report['plot']}")
    return 0


def _add_verify(p: argparse.ArgumentParser) -> None:
    source = p.add_mutually_exclusive_group()
    source.add_argument("--hf-config", metavar="PATH", help="transformers config (file or dir)")
    source.add_argument("--hf-model", metavar="PATH", help="local pretrained transformers dir")
    p.add_argument(
        "--attn",
        help="attention: eager|sdpa|flex_attention|flash_attention_2 (default sdpa) for"
        " transformers; a seqpack backend (default ranges) for the tiny decoder",
    )
    p.add_argument(
        "--mode",
        default="adapter",
        choices=("adapter", "naive", "bool-mask"),
        help="adapter: seqpack's hf_inputs; naive: position_ids only, default settings;"
        " bool-mask: a boolean 4-D mask",
    )
    p.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    p.add_argument("--seed", type=int, default=0, help="weights (from a config) and token ids")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--json", action="store_true", help="print the report as JSON (last line)")


def _cmd_verify(args: argparse.Namespace) -> int:
    import os

    os.environ["HF_HUB_OFFLINE"] = "1"  # never download: configs and weights are local
    from .nn import hf_verify

    if args.hf_config or args.hf_model:
        model = hf_verify.load_model(
            config=args.hf_config,
            model=args.hf_model,
            attn_implementation=args.attn or "sdpa",
            dtype=hf_verify.DTYPES[args.dtype],
            seed=args.seed,
            device=args.device,
        )
        cfg = model.config
        examples = hf_verify.verification_examples(
            cfg.vocab_size, args.seed, getattr(cfg, "max_position_embeddings", None)
        )
        report = hf_verify.verify_hf(model, examples, mode=args.mode)
        report["model"]["source"] = str(args.hf_config or args.hf_model)
    else:
        from .errors import InvalidInput

        if args.dtype != "float64" or args.device != "cpu":
            raise InvalidInput(
                "the tiny decoder is verified in float64 on cpu with the seed's tolerance"
                " — drop --dtype/--device, or pass --hf-config/--hf-model"
            )
        report = hf_verify.verify_tiny(args.attn or "ranges", mode=args.mode, seed=args.seed)
    if args.json:
        print(json.dumps(report))
    else:
        _print_verify(report)
    return 0 if report["pass"] else 1


def _print_verify(report: dict) -> None:
    m = report["model"]
    if report["target"] == "transformers":
        print(
            f"{m['source']}: {m['model_type']} ({m['parameters']:,} parameters, {m['dtype']},"
            f" {m['attn_implementation']}, {m['device']}), mode {report['mode']}:"
            f" {report['examples']} examples packed into {report['rows']} rows of"
            f" {report['capacity']}, {report['targets']} targets"
            f" ({report['eligible_targets']} eligible)"
        )
    else:
        print(
            f"tiny decoder ({m['profile']}, {m['parameters']:,} parameters, float64,"
            f" attention {m['attention']}), mode {report['mode']}: {report['layouts']} layouts,"
            f" {report['examples']} examples, {report['targets']} targets;"
            " separate vs padded vs packed"
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
    if report["pass"]:
        print("PASS: packed rows compute what separate examples compute")
    else:
        print(f"FAIL: packed rows do not compute what separate examples compute: {report['hint']}")


COMMANDS: dict[str, tuple[str, Command]] = {
    "demo": ("pack the seed's A/B/C fixture and print its JSON trace", (_add_demo, _cmd_demo)),
    "pack": ("pack a dataset into Parquet shards of rows + manifest", (_add_pack, _cmd_pack)),
    "stats": ("compare every policy on a dataset without writing rows", (_add_stats, _cmd_stats)),
    "verify": (
        "prove a model computes the same on packed rows as on separate examples",
        (_add_verify, _cmd_verify),
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="seqpack",
        description="Pack tokenized examples into shared rows without joining their contexts.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, (add, _)) in COMMANDS.items():
        add(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def _one_line(err: BaseException) -> str:
    """The message on one line (wrapped third-party messages may hold newlines)."""
    return " ".join(str(err).split())


_TERMINATED: list[int] = []


def _terminated(signum: int, frame: object) -> None:
    # SystemExit unwinds like an exception, so a half-written output is removed.
    # It is remembered too: if it lands inside a third-party import that swallows
    # it, the module is left half-initialised and a later error must still read
    # as the termination it is.
    _TERMINATED.append(signum)
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Library errors: one line, exit 2; other OS errors: one line, exit 1.

    SIGTERM unwinds like Ctrl-C: temporary output is removed before exiting
    (exit code 143, or 130 on Ctrl-C).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    _, (_, run) = COMMANDS[args.command]
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    _TERMINATED.clear()
    try:
        return run(args)
    except SeqpackError as err:
        print(f"seqpack {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except OSError as err:
        print(f"seqpack {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"seqpack {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception:
        if not _TERMINATED:
            raise
        print(f"seqpack {args.command}: terminated", file=sys.stderr)
        return 128 + _TERMINATED[-1]
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
