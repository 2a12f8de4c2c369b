"""Write the architecture table of docs/transformers.md from tests/support/architecture_cases.py.

Usage: ``.venv/bin/python tests/gen_architectures.py [--no-flex]``

Runs every case the way ``tests/integration/test_architectures.py`` does (tiny random
config, float64, default verification examples: the longest ``2*window+3``
pairs), on each implementation the case lists, and records the largest
logit and gradient differences from separate runs; the naive control
(``input_ids`` + ``position_ids``, default ``use_cache=True``) for windowed
cases and hybrids (their mixers then run across the row); for refused cases
the measured leak when run anyway. ``--no-flex``
keeps the FlexAttention cells already in the table instead of measuring them
again (float32, forward only, compiled on CPU in a fresh process per case:
about a minute each on a quiet machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from exactpack.verify.models import ModelCrashed

from support.architecture_cases import CASES, STANDARD, Case, run

DOCS = Path(__file__).parent.parent / "docs" / "transformers.md"
BEGIN, END = "<!-- architectures:begin -->", "<!-- architectures:end -->"
FLEX_SCRIPT = (
    "import json, sys, torch; sys.path.insert(0, 'tests'); torch.set_num_threads(1)\n"
    "from support.architecture_cases import CASES, run\n"
    "case = next(c for c in CASES if c.name == sys.argv[1])\n"
    "r = run(case, 'flex_attention', dtype=torch.float32, gradients=False)\n"
    "print(json.dumps({'pass': r['pass'], 'logits': r['max_abs_diff']['logits']}))\n"
)


def cell(report: dict) -> str:
    diff = report["max_abs_diff"]
    grads = f" / {diff['gradients']:.0e}" if "gradients" in diff else ""
    return f"{'exact' if report['pass'] else 'FAIL'} {diff['logits']:.0e}{grads}"


def flex_cell(case: Case) -> str:
    done = subprocess.run(
        [sys.executable, "-c", FLEX_SCRIPT, case.name],
        cwd=Path(__file__).parent.parent,
        capture_output=True,
        text=True,
        timeout=900,
        env=os.environ | {"HF_HUB_OFFLINE": "1"},
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return f"error: {last[:60]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return f"{'exact' if result['pass'] else 'FAIL'} {result['logits']:.0e} (fp32 fwd)"


def islands_text(report: dict) -> str:
    islands = report["tolerance"]["islands"]
    if not islands:
        return "float64 throughout"
    return "; ".join(
        f"{m}: {', '.join(o.split(' ')[0] for o in ops)}" for m, ops in islands.items()
    )


def previous_flex(case: Case) -> str:
    """The flex cell of ``case`` in the current table (``--no-flex`` keeps what was measured)."""
    for line in DOCS.read_text().splitlines():
        if line.startswith(f"| {case.name} |"):
            return line.split(" | ")[6].strip()
    return "—"


def exact_row(case: Case, flex: bool) -> tuple[list[str], str]:
    reports = {attn: run(case, attn) for attn in STANDARD if attn in case.attns}
    cells = [cell(reports[attn]) if attn in reports else "—" for attn in STANDARD]
    if case.flex:
        cells.append(flex_cell(case) if flex else previous_flex(case))
    else:
        cells.append("—")
    naive = "—"
    if case.windowed or case.restarts:
        control = run(case, case.attns[0], mode="naive")
        naive = (
            f"{'FAIL' if not control['pass'] else 'pass'} {control['max_abs_diff']['logits']:.0e}"
        )
    shown = reports.get("sdpa") or next(iter(reports.values()))  # eager adds its softmax
    return [*cells, naive], islands_text(shown)


def refused_row(case: Case) -> tuple[list[str], str]:
    try:
        report = run(case, case.attns[0], allow_unsupported=True)
        where = report.get("first_divergence") or {}
        measured = f"leaks {report['max_abs_diff']['logits']:.0e} in {where.get('class', '?')}"
    except ModelCrashed:
        measured = "crashes on a block mask"
    return [measured, "—", "—", "—", "—"], ""


def table(flex: bool) -> str:
    head = (
        "| case | model type | verdict | eager | sdpa | exactpack_varlen | flex_attention (CPU)"
        " | naive control | float32 islands (float64 model); notes |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for case in CASES:
        started = time.perf_counter()
        if case.refused is None:
            cells, tol = exact_row(case, flex)
            verdict = "exact"
        else:
            cells, tol = refused_row(case)
            verdict = f"refused ({case.refused})"
        note = f" {case.note}." if case.note else ""
        rows.append(
            f"| {case.name} | `{case.model_type}` | {verdict} | {' | '.join(cells)} | {tol}{note} |"
        )
        print(f"{case.name}: {time.perf_counter() - started:.1f}s", file=sys.stderr)
    return head + "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--no-flex", action="store_true", help="keep the FlexAttention cells already measured"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    import transformers

    body = table(flex=not args.no_flex)
    stamp = (
        f"*Generated by `.venv/bin/python tests/gen_architectures.py` on"
        f" {platform.machine()}, torch {torch.__version__},"
        f" transformers {transformers.__version__}. Cells: verdict, largest logit / gradient"
        " difference from separate runs (float64; `flex_attention`: float32 forward).*\n\n"
    )
    text = DOCS.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    DOCS.write_text(pattern.sub(lambda _: f"{BEGIN}\n{stamp}{body}{END}", text))
    print(f"wrote {DOCS}", file=sys.stderr)


if __name__ == "__main__":
    main()
