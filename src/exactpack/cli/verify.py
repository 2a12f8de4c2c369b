"""``exactpack verify``: packed rows compute what separate examples compute, or where not."""

from __future__ import annotations

import argparse
import json
from typing import Any

from exactpack.cli.flags import argparse_type, parse_byte_size, parse_count, parse_int
from exactpack.core.errors import InvalidInput

#: Seeds numpy and torch both take.
MAX_SEED = 2**63 - 1


def add_verify(p: argparse.ArgumentParser) -> None:
    source = p.add_mutually_exclusive_group()
    source.add_argument("--hf-config", metavar="PATH", help="transformers config (file or dir)")
    source.add_argument("--hf-model", metavar="PATH", help="local pretrained transformers dir")
    p.add_argument(
        "--attn",
        help="attention: eager|sdpa|flex_attention|flash_attention_2|exactpack_varlen (default"
        " sdpa) for transformers; a exactpack backend (default ranges) for the tiny decoder",
    )
    layout = p.add_mutually_exclusive_group()
    layout.add_argument(
        "--lengths",
        metavar="N,N,...",
        type=_lengths,
        help="prediction pairs of the examples to pack (default: six examples, the longest"
        " 2*window+3 for a model with a sliding window)",
    )
    p.add_argument(
        "--max-length",
        dest="capacity",
        type=argparse_type(parse_count, "--max-length"),
        metavar="N",
        help="tokens per row (default 12, or the sum of --lengths where the model allows it)",
    )
    p.add_argument(
        "--mode",
        default="adapter",
        choices=("adapter", "naive", "bool-mask"),
        help="adapter: exactpack's hf_inputs; naive: position_ids only, default settings;"
        " bool-mask: a boolean 4-D mask",
    )
    p.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    p.add_argument(
        "--seed",
        type=argparse_type(lambda text, flag: parse_int(text, flag, 0, MAX_SEED), "--seed"),
        default=0,
        help="weights (from a config) and token ids",
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument(
        "--max-model-bytes",
        type=argparse_type(parse_byte_size, "--max-model-bytes"),
        metavar="B",
        help="refuse a model whose parameters x dtype bytes, estimated from its config,"
        " exceed B before building it (default 2G: max_model_bytes of load_model)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON (last line)")
    layout.add_argument(
        "--tree-lengths",
        metavar="P:C,C;...",
        type=argparse_type(parse_tree_lengths, "--tree-lengths"),
        help="verify tree packing instead: groups as prompt length : completion lengths"
        ' (e.g. "30:5,8,12;10:4,4"); --attn eager|sdpa|exactpack_tree|exactpack_tree_varlen'
        " (docs/tree.md)",
    )


def _lengths(text: str) -> tuple[int, ...]:
    try:
        lengths = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of ints"
        ) from None
    if min(lengths) < 1:  # split gives at least one part
        raise argparse.ArgumentTypeError(f"{text!r}: every length must be a positive int")
    return lengths


def parse_tree_lengths(text: str, flag: str) -> list[tuple[int, tuple[int, ...]]]:
    """``"30:5,8,12;10:4,4"`` -> ``[(30, (5, 8, 12)), (10, (4, 4))]`` (positive ints)."""
    groups = []
    for part in text.split(";"):
        prompt, sep, rest = part.partition(":")
        try:
            p, comps = int(prompt), tuple(int(c) for c in rest.split(","))
        except ValueError:
            comps, p = (), 0
        if not sep or p < 1 or not comps or min(comps) < 1:
            raise InvalidInput(
                f"{flag} {text!r}: each group is PROMPT:COMPLETION,COMPLETION,... with"
                ' positive token counts, groups separated by ";" (e.g. "30:5,8,12;10:4,4")'
            )
        groups.append((p, comps))
    return groups


def cmd_verify(args: argparse.Namespace) -> int:
    """Exit 0: packed == separate; 1: the model mixed examples. A refusal, bad input or a
    crash anywhere (loading, the model, exactpack) is one line and exit 2."""
    from exactpack.verify.diagnose import guarded

    return guarded(None, "", lambda: finish_verify(args, _run_verify(args)))


def _run_verify(args: argparse.Namespace) -> dict:
    import os

    os.environ["HF_HUB_OFFLINE"] = "1"  # never download: configs and weights are local
    tree = args.tree_lengths is not None  # groups of sequences (flat: groups of one)
    if not (args.hf_config or args.hf_model):
        if tree:
            raise InvalidInput(
                "--tree-lengths verifies a transformers model: pass --hf-config or --hf-model"
            )
        if args.dtype != "float64" or args.device != "cpu":
            raise InvalidInput(
                "the tiny decoder is verified in float64 on cpu with the seed's tolerance"
                " — drop --dtype/--device, or pass --hf-config/--hf-model"
            )
        if args.lengths or args.capacity:
            raise InvalidInput(
                "--lengths/--max-length apply to transformers models (--hf-config/--hf-model);"
                " the tiny decoder runs the fixture and random layouts"
            )
        from exactpack.verify.layouts import verify_tiny

        return verify_tiny(args.attn or "ranges", mode=args.mode, seed=args.seed)
    from exactpack.hf.capabilities import capability
    from exactpack.verify import models

    attn = args.attn or "sdpa"
    if tree and attn not in TREE_IMPLEMENTATIONS:
        raise InvalidInput(
            f"--attn {attn!r} cannot run tree-packed rows here; choose one of"
            f" {', '.join(TREE_IMPLEMENTATIONS)} (cu_seqlens kinds cannot express a tree;"
            " FlexAttention has no CPU backward)"
        )
    if tree:  # the budget, before the model is built
        models.check_verify_tokens(sum(p + sum(c) for p, c in args.tree_lengths), "--tree-lengths")
    elif args.lengths:
        models.check_verify_tokens(sum(n + 1 for n in args.lengths), "--lengths")
    built = ("sdpa" if attn == "sdpa" else "eager") if tree else attn
    where = {"config": args.hf_config, "model": args.hf_model, "device": args.device}
    if args.max_model_bytes is not None:  # else load_model's default
        where["max_model_bytes"] = args.max_model_bytes
    dtype, refuse = models.DTYPES[args.dtype], args.mode == "adapter" or tree
    model = models.load_model(
        attn_implementation=built, dtype=dtype, seed=args.seed, refuse=refuse, **where
    )
    if attn != built:  # the tree implementations, on top of eager
        model.set_attn_implementation(attn)
    cfg = model.config.get_text_config()
    positions = getattr(cfg, "max_position_embeddings", None)
    arch = capability(model)
    if tree:
        examples = models.tree_groups(args.tree_lengths, cfg.vocab_size, args.seed, positions)
        capacity = args.capacity
    else:  # verify_hf refuses the model's own capability (adapter mode) before it runs
        limits = [c.limit for c in arch.conditions if c.what == "example"]
        layout = models.verification_layout(
            arch.window, positions, args.lengths, args.capacity, min(limits, default=None)
        )
        examples = models.verification_examples(cfg.vocab_size, args.seed, layout=layout)
        capacity = layout.capacity
    report = models.verify_hf(model, examples, mode=args.mode, max_length=capacity)
    report["architecture"]["condition_checks"] = condition_checks(
        arch.conditions,
        max(report["lengths"]),
        report["capacity"],
        None if args.capacity else positions,
    )
    report["model"]["source"] = str(args.hf_config or args.hf_model)
    return report


#: Implementations the tree verification feeds (the flattened kinds cannot express a tree).
TREE_IMPLEMENTATIONS = ("eager", "sdpa", "exactpack_tree", "exactpack_tree_varlen")


def condition_checks(
    conditions: Any, longest: int, max_length: int, positions: int | None
) -> list[str]:
    """One line per condition a PASS depends on: what this run checked, and whether the
    ``max_length`` asked for (else any up to the model's ``positions``) could break it."""
    out = []
    for c in conditions:
        example = c.what == "example"
        size = f"{longest} pairs" if example else f"{max_length} columns"
        line = f"PASS holds while {c.text()}; checked here at {size}"
        reach = max_length if max_length > c.limit else None
        if reach is None and positions is not None and positions > c.limit:
            reach = positions
        if reach is not None:
            what = "an example longer" if example else "a row wider"
            line += (
                f"; at max_length {reach:,} {what} than {c.limit:,} breaks it — each batch is"
                f" checked and such a batch refused: pack with --max-length {c.limit:,} or less"
                + (" (or pre-split the longer examples)" if example else "")
            )
        out.append(line)
    return out


def finish_verify(args: argparse.Namespace, report: dict) -> int:
    """Print a verify report (flat, tree or tiny decoder; ``--json``: one line) and give its
    exit code: 0 pass, 1 mixed; the model's own loss alone disagreeing is exit 2, one line."""
    if args.json:
        print(json.dumps(report))
    else:
        _print_verify(report)
    if report["pass"]:
        return 0
    if report.get("mixed", True):
        return 1
    raise InvalidInput(report["hint"])


def _print_verify(r: dict) -> None:
    m, tree = r["model"], r.get("layout") == "tree"
    if r["target"] == "transformers":  # flat or tree (groups of one or more sequences)
        run = (
            f"{m['source']}: {m['model_type']} ({m['parameters']:,} parameters, {m['dtype']},"
            f" {m['attn_implementation']}, {m['device']}), mode {r['mode']}:"
        )
        rows = f"{r['rows']} row(s) of {r['capacity']}"
        print(
            f"{run} {r['groups']} groups, {r['sequences']} sequences of {r['lengths']} pairs as"
            f" tries of {r['nodes']} nodes: {r['tokens_stored']} cells stored for"
            f" {r['tokens_flat']} flat, {rows}"
            if tree
            else f"{run} {r['examples']} examples of {r['lengths']} pairs packed into {rows},"
            f" {r['targets']} targets ({r['eligible_targets']} eligible)"
        )
        arch = r["architecture"]
        windows = ", ".join(f"{k} {v or 'unbounded'}" for k, v in arch["windows"].items())
        exercised = "" if arch["window_exercised"] else " (no example is longer: not exercised)"
        print(f"attention windows: {windows}{exercised}")
        for line in arch.get("condition_checks", ()):
            print(line)
    else:
        print(
            f"tiny decoder ({m['profile']}, {m['parameters']:,} parameters, float64,"
            f" attention {m['attention']}), mode {r['mode']}: {r['layouts']} layouts,"
            f" {r['examples']} examples, {r['targets']} targets; separate vs padded vs packed"
        )
    tol = r["tolerance"]
    diffs = ", ".join(f"{k} {v:.2e}" for k, v in r["max_abs_diff"].items())
    fails = ", ".join(f"{k} {v:,}/{r['comparisons'][k]:,}" for k, v in r["failures"].items())
    print(f"max abs diff vs separate: {diffs}")
    own = tol.get("model_loss")  # transformers' own loss: float32's tolerance, said so
    own = f"; model_loss: {own['abs']:g} + {own['rel']:g}*max, {own['why']}" if own else ""
    print(
        f"out of tolerance: {fails} (|a-b| <= {tol['abs']:g} + {tol['rel']:g}*max(|a|,|b|);"
        f" {tol['why']}{own})"
    )
    if r.get("widened"):
        print(f"float32 islands run in float64 for the check (casts: {', '.join(r['widened'])})")
    if r["pass"]:
        alone = "each sequence computes alone" if tree else "separate examples compute"
        print(f"PASS: {'tree-packed' if tree else 'packed'} rows compute what {alone}")
    else:
        print(f"{'FAIL' if r.get('mixed', True) else 'NOT MIXED'}: {r['hint']}")
