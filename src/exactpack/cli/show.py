"""``exactpack show DIR --row N [--figure PATH] [--text]``: one packed row's occupants
(segment, columns, pairs, supervised targets, source id and range), with ``--figure`` its
drawing, with ``--text`` each example as text, its supervised tokens between ``[[`` and
``]]``. A TRL-format folder (``--format trl``) shows the same way (no ids: TRL's rows keep
none).
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
    p.add_argument(
        "--text",
        action="store_true",
        help="print each example's tokens as text, the supervised ones between [[ and ]]",
    )
    p.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="decode --text with this tokenizer ('bytes' or a local path; default: ids)",
    )


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


def _example(segment: int, columns: list[int], text: dict, ids: tuple, span: list[int]) -> dict:
    """One occupant as :func:`cmd_show` prints it; ``text``: its tokens and whether each is
    a supervised target (the first never is), ``ids``: its source and example id."""
    pairs, supervised = len(text["tokens"]) - 1, sum(text["supervised"])
    return {"segment": segment, "columns": columns, "pairs": pairs, "supervised": supervised,
            "source_id": ids[0], "example_id": ids[1], "range": span}  # fmt: skip


def row_record(batch: Any) -> tuple[dict[str, Any], list[dict]]:
    """What :func:`cmd_show` prints of a one-row batch: its cells and occupants, and each
    occupant's window tokens (inputs, then the last target) with their supervised flags."""
    occ, examples, texts = batch.occurrences, [], []
    for i, (a, b) in enumerate(zip(occ.col_start.tolist(), occ.col_end.tolist(), strict=True)):
        tokens = [*batch.inputs[0, a:b].tolist(), int(batch.targets[0, b - 1])]
        texts.append({"tokens": tokens, "supervised": [False, *batch.loss_mask[0, a:b].tolist()]})
        ids = (str(occ.source_ids[i]), str(occ.example_ids[i]))
        span = [int(occ.range_starts[i]), int(occ.range_ends[i])]
        examples.append(_example(int(occ.segment[i]), [a, b], texts[-1], ids, span))
    used = int(batch.input_valid[0].sum())
    record = {"row": batch.first_row, "cells": int(batch.shape[1]), "used": used}
    return record | {"examples": examples}, texts


def trl_row(folder: Any, row: int) -> tuple[str, int, dict[str, Any], list[dict]]:
    """Row ``row`` of a TRL-format folder: its folder, row count and :func:`row_record`'s
    two parts. The manifest is checked, and the one shard the row is in as ``load_trl``
    checks every shard (its sha256, its decoded contents)."""
    import pyarrow.parquet as pq

    from exactpack.io.integrity import check_checksums, check_manifest, read_manifest
    from exactpack.io.trl_schema import check_trl_contents

    path = path_argument("packed", folder)
    manifest = read_manifest(path)
    check_manifest(manifest, path)
    total = sum(int(e["rows"]) for e in manifest["shards"])
    if not 0 <= row < total:
        raise InvalidInput(f"{path} has rows 0..{total - 1}; --row {row} is outside them")
    local = row
    for entry in manifest["shards"]:
        if local < int(entry["rows"]):
            break
        local -= int(entry["rows"])
    one = {**manifest, "shards": [entry]}  # only the shard shown is read
    check_checksums(one, path)
    check_trl_contents(one, path)
    table = pq.read_table(path / entry["file"]).slice(local, 1).to_pylist()[0]
    ids, lengths, labels = table["input_ids"], table["seq_lengths"], table.get("labels")
    examples, texts, start = [], [], 0
    for k, n in enumerate(lengths):
        flags = [j > 0 and (labels is None or labels[start + j] != -100) for j in range(n)]
        texts.append({"tokens": ids[start : start + n], "supervised": flags})
        examples.append(_example(k, [start, start + n], texts[-1], ("-", "-"), [0, n]))
        start += n
    cells = int(manifest["config"]["capacity"])
    record = {"row": row, "cells": cells, "used": start, "examples": examples}
    return str(path), total, record, texts


def marked_text(tokens: list[int], supervised: list[bool], tokenizer: Any) -> str:
    """The tokens as text (or ids), each run of supervised tokens between ``[[`` and ``]]``."""
    parts, start = [], 0
    for end in range(1, len(tokens) + 1):
        if end == len(tokens) or supervised[end] != supervised[start]:
            run = tokens[start:end]
            text = tokenizer.decode(run) if tokenizer is not None else " ".join(map(str, run))
            parts.append(f"[[{text}]]" if supervised[start] else text)
            start = end
    return ("" if tokenizer is not None else " ").join(parts)


def cmd_show(args: argparse.Namespace) -> int:
    from exactpack.io.integrity import read_manifest
    from exactpack.io.trl_schema import is_trl

    tokenizer = None
    if args.tokenizer is not None:
        from exactpack.io.tokenizers import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer)
    folder = path_argument("packed", args.packed)
    try:
        trl = is_trl(read_manifest(folder))
    except (OSError, InvalidInput):
        trl = False  # load_packed names what is wrong with the folder
    if trl:
        if args.figure:
            raise InvalidInput("--figure draws exactpack-format rows; drop it for a TRL folder")
        where, total, record, texts = trl_row(folder, args.row)
    else:
        store, batch = load_row(folder, args.row)
        (where, total), (record, texts) = (str(store.path), store.num_rows), row_record(batch)
    if args.text:
        for e, t in zip(record["examples"], texts, strict=True):
            e["text"] = marked_text(t["tokens"], t["supervised"], tokenizer)
    if args.figure:
        from exactpack.verify.figure import draw_row

        title = f"{where} row {args.row} of {total}"
        record["figure"] = str(draw_row(batch, args.figure, title=printable(title)))
    if args.json:
        print(json.dumps(record))
        return 0
    cells, used = record["cells"], record["used"]
    print(
        f"{printable(where)} row {args.row} of {total:,}: {cells:,} cells,"
        f" {used:,} used ({used / cells:.1%}), {len(record['examples'])} example(s)"
    )
    print(f"{'segment':>8} {'columns':>13} {'pairs':>7} {'supervised':>10}  source [range]")
    for e in record["examples"]:
        a, b = e["columns"]
        print(
            f"{e['segment']:>8} {f'{a}..{b - 1}':>13} {e['pairs']:>7,} {e['supervised']:>10,}"
            f"  {printable(repr(e['source_id']))}[{e['range'][0]}:{e['range'][1]}]"
        )
        if "text" in e:
            print(f"{'':>8} {printable(e['text'])}")
    if used < cells:
        print(f"{'padding':>8} {f'{used}..{cells - 1}':>13}")
    if "figure" in record:
        print(f"figure: {printable(record['figure'])}")
    return 0
