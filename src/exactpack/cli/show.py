"""``exactpack show DIR --row N [--figure PATH]``: one packed row's occupants (segment,
columns, pairs, supervised targets, source id and range) and, with ``--figure``, its drawing.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from exactpack.core.errors import InvalidInput, path_argument
from exactpack.pipeline.progress import printable


def add_show(p: argparse.ArgumentParser) -> None:
    p.add_argument("packed", help="a packed folder (exactpack pack --out)")
    p.add_argument("--row", type=int, default=0, help="the row to show (default 0)")
    p.add_argument("--figure", metavar="PATH", help="also draw the row (PNG or SVG)")
    p.add_argument("--json", action="store_true", help="print the row as JSON")


def load_row(packed: Any, row: int) -> Any:
    """Row ``row`` of the packed folder ``packed`` as a one-row :class:`PackedBatch`."""
    from exactpack.io.store import load_packed

    store = load_packed(path_argument("packed", packed))
    if not 0 <= row < store.num_rows:
        raise InvalidInput(
            f"{store.path} has rows 0..{store.num_rows - 1}; --row {row} is outside them"
        )
    firsts = np.array([int(s["first_row"]) for s in store.shards], dtype=np.int64)
    k = int(np.searchsorted(firsts, row, "right") - 1)
    rows = store.shard_rows(k)
    local = row - rows.first_row
    return store, rows.slice_rows(local, local + 1).to_batch()


def row_record(batch: Any) -> dict[str, Any]:
    """What :func:`cmd_show` prints: the row's cells and its occupants."""
    occ = batch.occurrences
    used = int(batch.input_valid[0].sum())
    return {
        "row": batch.first_row,
        "cells": int(batch.shape[1]),
        "used": used,
        "examples": [
            {
                "segment": int(occ.segment[i]),
                "columns": [int(occ.col_start[i]), int(occ.col_end[i])],
                "pairs": int(occ.col_end[i] - occ.col_start[i]),
                "supervised": int(batch.loss_mask[0, occ.col_start[i] : occ.col_end[i]].sum()),
                "source_id": str(occ.source_ids[i]),
                "example_id": str(occ.example_ids[i]),
                "range": [int(occ.range_starts[i]), int(occ.range_ends[i])],
            }
            for i in range(len(occ))
        ],
    }


def cmd_show(args: argparse.Namespace) -> int:
    store, batch = load_row(args.packed, args.row)
    record = row_record(batch)
    if args.figure:
        from exactpack.verify.figure import draw_row

        title = f"{store.path} row {args.row} of {store.num_rows}"
        record["figure"] = str(draw_row(batch, args.figure, title=printable(title)))
    if args.json:
        print(json.dumps(record))
        return 0
    cells, used = record["cells"], record["used"]
    print(
        f"{printable(str(store.path))} row {args.row} of {store.num_rows:,}: {cells:,} cells,"
        f" {used:,} used ({used / cells:.1%}), {len(record['examples'])} example(s)"
    )
    print(f"{'segment':>8} {'columns':>13} {'pairs':>7} {'supervised':>10}  source [range]")
    for e in record["examples"]:
        a, b = e["columns"]
        print(
            f"{e['segment']:>8} {f'{a}..{b - 1}':>13} {e['pairs']:>7,} {e['supervised']:>10,}"
            f"  {printable(repr(e['source_id']))}[{e['range'][0]}:{e['range'][1]}]"
        )
    if used < cells:
        print(f"{'padding':>8} {f'{used}..{cells - 1}':>13}")
    if "figure" in record:
        print(f"figure: {printable(record['figure'])}")
    return 0
