"""``seqpack`` command line: thin over the library.

Each subcommand lives in a function ``_cmd_NAME`` registered in
:data:`COMMANDS`; library errors become a one-line message and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
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


COMMANDS: dict[str, tuple[str, Command]] = {
    "demo": ("pack the seed's A/B/C fixture and print its JSON trace", (_add_demo, _cmd_demo)),
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _, (_, run) = COMMANDS[args.command]
    try:
        return run(args)
    except SeqpackError as err:
        print(f"seqpack {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
