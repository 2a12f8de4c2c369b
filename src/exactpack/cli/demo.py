"""``exactpack demo``: the seed's fixture as a JSON trace (and, optionally, its figure)."""

from __future__ import annotations

import argparse
import json


def add_demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--figure", metavar="PATH", help="also draw the layout (PNG or SVG)")
    p.add_argument("--compact", action="store_true", help="print the JSON on one line")


def cmd_demo(args: argparse.Namespace) -> int:
    from exactpack.verify.trace import demo_trace

    trace = demo_trace()
    if args.figure:
        from exactpack.verify.figure import draw_fixture

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
    nested = (dict, list)
    if isinstance(value, list) and any(isinstance(v, nested) for v in value):
        rows = all(isinstance(v, list) and not any(isinstance(x, nested) for x in v) for v in value)
        if rows and len(json.dumps(value)) <= 100:  # rows of cells: one line
            return json.dumps(value)
        items = [f"{inner}{format_json(v, indent + 1)}" for v in value]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    return json.dumps(value)
