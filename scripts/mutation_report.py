"""Print the mutation results of ``scripts/mutation.sh`` as Markdown (for docs/testing.md).

Usage: ``python scripts/mutation_report.py [GROUP ...]``. Reads
``.cache/mutation/<group>/summary.json`` and ``survivors.txt``; prints the score
table, then every live mutant as one line: its name, the changed source line
before and after.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / ".cache" / "mutation"


def score(stats: dict) -> tuple[int, int, int, float]:
    """``(checked, killed, not checked, percent killed of checked)``; a timeout is a kill."""
    killed = stats["killed"] + stats["timeout"]
    live = stats["survived"] + stats["no_tests"] + stats["suspicious"] + stats["segfault"]
    checked = killed + live
    unchecked = stats["total"] - stats["skipped"] - checked
    return checked, killed, unchecked, (100.0 * killed / checked if checked else 100.0)


def survivors(path: Path) -> list[tuple[str, str, str, str]]:
    """``(name, status, before, after)`` per live mutant (first changed line of its diff)."""
    out = []
    for block in path.read_text().split("## ")[1:]:
        head, _, diff = block.partition("\n")
        match = re.match(r"(\S+) \((.*)\)", head)
        if not match:
            continue
        lines = diff.splitlines()
        minus = [x[1:].strip() for x in lines if x.startswith("-") and not x.startswith("---")]
        plus = [x[1:].strip() for x in lines if x.startswith("+") and not x.startswith("+++")]
        out.append((match[1], match[2], minus[0] if minus else "", plus[0] if plus else ""))
    return out


def kind_of(before: str, after: str) -> str:
    """A first guess at why a live mutant changes nothing (docs/testing.md explains each)."""
    if "copy=" in before and ("copy=" not in after or "copy=None" in after or "copy=True" in after):
        return "copy"
    if "reshape(-2" in after or "reshape(None" in after:
        return "reshape"
    if "device" in before and ("device=None" in after or "device" not in after):
        return "device"
    if ".to(None)" in after:
        return "device"
    dtype_dropped = "dtype=" in before and ("dtype=None" in after or "dtype=" not in after)
    if dtype_dropped or "astype(None" in after or re.search(r"\(0, None\)", after):
        return "dtype"
    return "other"


def main(groups: list[str]) -> None:
    groups = groups or sorted(p.name for p in ROOT.iterdir() if (p / "summary.json").exists())
    print("| group | modules | mutants | checked | killed | survived | not checked | score |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    total_tested = total_killed = 0
    for group in groups:
        stats = json.loads((ROOT / group / "summary.json").read_text())
        checked, killed, unchecked, pct = score(stats)
        total_tested += checked
        total_killed += killed
        modules = _modules(group)
        print(
            f"| {group} | {modules} | {stats['total']} | {checked} | {killed}"
            f" | {checked - killed} | {unchecked} | {pct:.1f}% |"
        )
    if total_tested:
        print(f"| **all** | | | {total_tested} | {total_killed} | | | "
              f"**{100.0 * total_killed / total_tested:.1f}%** |")  # fmt: skip
    print()
    for group in groups:
        path = ROOT / group / "survivors.txt"
        if not path.exists():
            continue
        rows = survivors(path)
        if not rows:
            continue
        print(f"#### {group}\n")
        for name, status, before, after in rows:
            if status == "timeout":
                continue
            short = name.split(".")[-1]
            print(f"- [{kind_of(before, after)}] `{short}` ({status}): `{before}` → `{after}`")
        print()


def _modules(group: str) -> str:
    text = (ROOT / group / "pyproject.toml").read_text()
    match = re.search(r"^only_mutate = \[(.*)\]$", text, re.M)
    if not match:
        return ""
    return ", ".join(m.replace("src/exactpack/", "") for m in re.findall(r'"([^"]+)"', match[1]))


if __name__ == "__main__":
    main(sys.argv[1:])
