"""Run ``verify --tree-lengths`` on every model type that packs exactly flat.

Usage::

    PYTHONPATH=src nice -n 10 .venv/bin/python scripts/sweep_tree.py \
        [--out .cache/sweep_tree.json] [--types llama,mistral,...] [--merge] [--no-docs]

The types are those with a ``PASS`` cell in the flat sweep's table
(``scripts/sweep_architectures.py``, ``docs/transformers.md``), built from
the same tiny configs (``tests/support/architecture_tiny.py``: width 16,
2 layers, window 4 where the model has one). Each type runs
:func:`exactpack.verify.models.verify_hf` in float64 on eager, sdpa,
``exactpack_tree`` and ``exactpack_tree_varlen`` (the flash path, through its
plain-torch reference on CPU), and the naive control on eager (it must
FAIL), with the groups ``"30:5,8,12;10:4,4"`` (scaled down
where the model is exact only up to an example length). A cell is ``PASS``,
``FAIL`` (branches mixed), ``refused`` (up front, with the reason), ``n/a``
(no such implementation for the type) or ``crash``. Writes the JSON result
and, unless ``--no-docs``, the table of ``docs/tree.md`` (with ``--merge --types ...``
only those types' rows, the rest kept; ``--types hybrids``: the hybrid types).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_architectures import DOCS as FLAT_DOCS
from sweep_architectures import (
    HYBRIDS,
    ROOT,
    TimedOut,
    _alarm,
    _line,
    _runs_alone,
    run_sweep,
    sweep_args,
)

ATTNS = ("eager", "sdpa", "exactpack_tree", "exactpack_tree_varlen")
#: The control: ``--mode naive`` on eager (siblings see each other), which must FAIL.
NAIVE = "naive"
SPEC = "30:5,8,12;10:4,4"
DOCS = ROOT / "docs" / "tree.md"
BEGIN, END = "<!-- sweep-tree:begin -->", "<!-- sweep-tree:end -->"


def flat_passing() -> list[str]:
    """The model types with at least one ``PASS`` cell in the flat sweep's table."""
    rows = re.findall(r"^\| `([^`]+)` \|(.*)$", FLAT_DOCS.read_text(), re.M)
    return [t for t, rest in rows if "| PASS" in rest]


def spec_for(limit: int | None) -> list[tuple[int, tuple[int, ...]]]:
    """:data:`SPEC`, or groups whose sequences stay within ``limit`` pairs."""
    from exactpack.cli.verify import parse_tree_lengths

    if limit is None or limit >= 42:
        return parse_tree_lengths(SPEC, "--tree-lengths")
    p = max(1, limit // 2)
    return [(p, (limit - p, max(1, limit - p - 1), 2)), (max(1, p - 1), (2, 2))]


def run_one(attn: str, config, mode: str = "adapter") -> dict:
    """One cell: ``{"status", ...}`` of the tree verification on ``attn`` in ``mode``."""
    import torch

    from exactpack.core.errors import InvalidInput, NotAvailable
    from exactpack.hf.architectures import UnsupportedArchitecture
    from exactpack.hf.capabilities import capability
    from exactpack.hf.kinds import tree_kind
    from exactpack.verify.models import tree_groups, verify_hf

    from support.architecture_tiny import tree_model

    try:
        arch = capability(config).check(tree_kind(attn), tree=True)
    except (UnsupportedArchitecture, NotAvailable) as err:
        return {"status": "refused", "detail": str(err)}
    try:
        model = tree_model(config, attn)
    except Exception as err:  # transformers has no such implementation for this type
        return {"status": "n/a", "detail": _line(err)}
    cell = {}
    why = _runs_alone(model)
    if why is not None:  # the model's own float64 forward fails (xglm): check in float32
        model = model.to(torch.float32)
        if _runs_alone(model) is not None:
            return {"status": "crash", "detail": why}
        cell = {"dtype": "float32", "float64": why}
    limits = [c.limit for c in arch.conditions if c.what == "example"]
    text = model.config.get_text_config()
    try:
        groups = tree_groups(spec_for(min(limits) if limits else None), text.vocab_size, 0)
        report = verify_hf(model, groups, mode=mode)
    except (UnsupportedArchitecture, NotAvailable, InvalidInput) as err:  # up front or at layer 0
        return {"status": "refused", "detail": _line(err).split(": ", 1)[1]}
    except Exception as err:
        return {"status": "crash", "detail": _line(err)}
    diff = report["max_abs_diff"]
    return cell | {
        "status": "PASS" if report["pass"] else "FAIL",
        "logits": diff["logits"],
        "gradients": diff["gradients"],
        "tolerance": report["tolerance"]["why"],
        "widened": report.get("widened", []),
        "detail": report.get("hint", ""),
    }


def sweep_type(model_type: str, budget: int = 240) -> dict:
    """The cells of one model type, within ``budget`` seconds."""
    import signal

    from support.architecture_tiny import tiny_config

    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(budget)
    try:
        config = tiny_config(model_type)
        cells = {attn: run_one(attn, config) for attn in ATTNS}
        return {"cells": cells | {NAIVE: run_one("eager", config, "naive")}}
    except TimedOut as err:
        return {"cells": {}, "note": f"timed out: {err}"}
    except Exception as err:
        return {"cells": {}, "note": f"no tiny config: {_line(err)}"}
    finally:
        signal.alarm(0)


def cell_text(cell: dict) -> str:
    status = cell.get("status", "—")
    if status in ("PASS", "FAIL"):
        dtype = " (float32)" if cell.get("dtype") == "float32" else ""
        return f"{status} {cell['logits']:.0e} / {cell['gradients']:.0e}{dtype}"
    return status


HEAD = (
    "| model type | eager | sdpa | exactpack_tree | exactpack_tree_varlen | naive (eager) |"
    " why refused |\n|---|---|---|---|---|---|---|\n"
)


def rows(results: dict) -> dict[str, str]:
    """Model type -> its table row."""
    out = {}
    for model_type, r in results.items():
        cells = [cell_text(r["cells"].get(a, {})) for a in (*ATTNS, NAIVE)]
        why = {  # the reason after the model's name; n/a needs none
            c["detail"].split(": ", 1)[-1][:200]
            for c in r["cells"].values()
            if c["status"] in ("refused", "crash")
        }
        note = "; ".join(sorted(why | ({r["note"]} if "note" in r else set())))
        out[model_type] = f"| `{model_type}` | {' | '.join(cells)} | {note.replace('|', '/')} |"
    return out


def counts(results: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in results.values():
        for attn, cell in r["cells"].items():
            key = f"{attn} {cell['status']}" if attn == NAIVE else cell["status"]
            out[key] = out.get(key, 0) + 1
    return out


def table_counts(lines: list[str]) -> dict[str, int]:
    """:func:`counts` read back from table rows (each cell's first word)."""
    out: dict[str, int] = {}
    for line in lines:
        cells = [c.strip() for c in line.split("|")[2:-2]]
        for attn, cell in zip((*ATTNS, NAIVE), cells, strict=True):
            status = cell.split(" ")[0]
            if status != "—":
                key = f"{attn} {status}" if attn == NAIVE else status
                out[key] = out.get(key, 0) + 1
    return out


def write_docs(results: dict) -> None:
    """The table of ``docs/tree.md`` with ``results``' rows put in (a ``--merge`` run of some
    types keeps the other types' rows), sorted by model type, and the stamp recounted."""
    import torch
    import transformers

    text = DOCS.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    old = pattern.search(text)
    kept = re.findall(r"^(\| `([^`]+)` \|.*)$", old.group(0) if old else "", re.M)
    merged = {t: line for line, t in kept} | rows(results)
    lines = [merged[t] for t in sorted(merged)]
    total = ", ".join(f"{k} {v}" for k, v in sorted(table_counts(lines).items()))
    stamp = (
        f"*Generated by `scripts/sweep_tree.py`: the {len(lines)} types that pass flat, on"
        f" transformers {transformers.__version__}, torch {torch.__version__}, float64 on CPU,"
        f" groups `{SPEC}`; a cell is the status and the largest logit / gradient difference;"
        f" cells: {total}.*\n\n"
    )
    block = f"{BEGIN}\n{stamp}{HEAD}" + "\n".join(lines) + f"\n{END}"
    DOCS.write_text(pattern.sub(lambda _: block, text) if old else text + block + "\n")


def main() -> None:
    args = sweep_args(
        __doc__.splitlines()[0], str(ROOT / ".cache" / "sweep_tree.json"),
        "comma-separated model types (default: flat PASS ones)",
    )  # fmt: skip
    every = flat_passing()
    if args.merge and args.types:  # the docs' table keeps the other types' rows
        every = list(HYBRIDS) if args.types == "hybrids" else args.types.split(",")
    run_sweep(args, every, sweep_type, counts, write_docs)


if __name__ == "__main__":
    main()
